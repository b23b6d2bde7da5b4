"""How far each of triton_moe's fp8 numerics lands from the float64 oracle: w8a16, w8a8 (one e4m3
term per activation) and w8a8x2 (two), on the same random weights, tokens and routing, through
the grouped GEMMs at every token count. Accuracy, not speed: nothing is timed.

    python benchmarks/triton_moe_fp8_error.py [--tokens 3,64,300] [--device cuda:0]
    TRITON_INTERPRET=1 python benchmarks/triton_moe_fp8_error.py --device cpu --tokens 3
        (a check of the harness: the interpreter's bf16 dots and casts are wrong, its figures no measure)
"""

from __future__ import annotations

import argparse

import attrs
import torch
from hal.backends.reference import ops
from hal.backends.triton_moe.kernel import TritonMoEKernel

import hal
from hal.backend import Target
from hal.synth import random_routing, random_tokens, random_weights
from hal.testing import rel_err

# (H, I, experts, top-k, activation): the CUDA tests' odd shapes, then qwen3-30b-a3b's and
# deepseek-v3's hidden and intermediate sizes over fewer experts (the oracle runs in float64 on CPU).
LAYERS = ((384, 256, 8, 2, "silu"), (328, 200, 8, 2, "swiglu_oai"), (2048, 768, 16, 8, "silu"),
          (7168, 2048, 8, 8, "silu"))
NUMERICS = (("w8a16", False), ("w8a8", True), ("w8a8x2", "x2"))


def _on_cpu(w):
    return attrs.evolve(w, **{f.name: None if getattr(w, f.name) is None else getattr(w, f.name).cpu()
                              for f in attrs.fields(type(w))})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="3,64,300")
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    device = args.device
    target = Target(device, hal.probe(deep=device != "cpu"))
    print(f"# rel err against the float64 oracle on {device}; torch {torch.__version__}")
    for H, I, experts, top_k, activation in LAYERS:
        spec = hal.MoESpec(num_experts=experts, top_k=top_k, hidden_size=H, intermediate_size=I,
                           weight_format="fp8_block128", activation=activation)
        w = random_weights(spec, device=device, seed=0)
        w_cpu = _on_cpu(w)
        for M in (int(t) for t in args.tokens.split(",")):
            x = random_tokens(spec, M, seed=2, device=device)
            tw, ti = random_routing(spec, M, seed=3, device=device)
            ref = ops.moe_tokens(spec, x.cpu(), tw.cpu(), ti.cpu(), w_cpu, compute_dtype=torch.float64)
            errors = []
            for name, fp8_act in NUMERICS:
                kernel = TritonMoEKernel(spec, target, fp8_act=fp8_act, gemv=False)
                out = kernel(x, tw, ti, kernel.prepare_weights(w), check=False)
                errors.append(f"{name} {rel_err(out.cpu(), ref):.2e}")
            print(f"H {H} I {I} E {experts} top-{top_k} {activation}, {M} tokens: " + ", ".join(errors),
                  flush=True)


if __name__ == "__main__":
    main()

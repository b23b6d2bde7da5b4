"""Decode speed of a transformers MoE model under each experts implementation.

A random Qwen3-30B-A3B-shaped model (hidden 2048, moe_intermediate 768, 128 experts, top 8; fewer
layers and a smaller vocabulary so it fits in memory; neither changes the work of one MoE layer)
decodes with a KV cache under "eager", "grouped_mm" and "moe_hal". Reported per implementation:
decode tokens/s (batch / median step time) and the median time of one MoE layer's experts call
per step, measured with forward hooks on the experts modules.

    python benchmarks/transformers_decode.py --layers 2 --steps 16 --formats bf16 fp8

fp8 builds the experts as transformers' FP8Experts (float8_e4m3fn, one fp32 scale per 128x128 block);
transformers' own FP8 experts paths need its CUDA kernels, so on CPU only moe_hal runs them.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings

import torch

# transformers 5.24 renames `past_key_values` to `cache` with a FutureWarning per call; the old name
# still works across the 5.x versions this script supports.
warnings.filterwarnings("ignore", category=FutureWarning)


def qwen3_30b_a3b_config(layers: int, vocab: int):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(vocab_size=vocab, hidden_size=2048, intermediate_size=6144,
                          moe_intermediate_size=768, num_hidden_layers=layers, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                          norm_topk_prob=True, max_position_embeddings=4096, tie_word_embeddings=False)


def build(layers: int, vocab: int, device: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = qwen3_30b_a3b_config(layers, vocab)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, experts_implementation="eager")
    return model.eval()


def to_fp8_experts(model):
    """Every experts module as FP8Experts, the way transformers' replace_with_fp8_linear builds them,
    holding block-quantized copies of the bf16 weights."""
    from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS, FP8Experts
    from transformers.integrations.moe import use_experts_implementation

    import hal.integrations.transformers as hal_tf

    fp8_class = use_experts_implementation(experts_class=FP8Experts,
                                           experts_interface=ALL_FP8_EXPERTS_FUNCTIONS,
                                           has_bias=False, has_gate=True)
    for name, module in hal_tf.experts_modules(model):
        fp8 = fp8_class(config=module.config, block_size=(128, 128), activation_scheme="dynamic")
        fp8 = fp8.to(module.gate_up_proj.device)
        with torch.no_grad():
            for proj in ("gate_up_proj", "down_proj"):
                w = getattr(module, proj)
                _, rows, cols = w.shape
                for e in range(w.shape[0]):  # one expert at a time keeps the float32 copy small
                    blocks = w[e].float().view(rows // 128, 128, cols // 128, 128)
                    scale = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12) / 448.0
                    q = (blocks / scale[:, None, :, None]).view(rows, cols).to(torch.float8_e4m3fn)
                    getattr(fp8, proj)[e].copy_(q)
                    getattr(fp8, f"{proj}_scale_inv")[e].copy_(scale)
        model.set_submodule(name, fp8)
    return model


class LayerTimer:
    """Wall time of every experts call, per module, from forward pre/post hooks."""

    def __init__(self, model, sync):
        import hal.integrations.transformers as hal_tf

        self.sync = sync
        self.times = []
        self._start = {}
        self.handles = []
        for _, module in hal_tf.experts_modules(model):
            self.handles.append(module.register_forward_pre_hook(self._pre))
            self.handles.append(module.register_forward_hook(self._post))

    def _pre(self, module, args):
        self.sync()
        self._start[id(module)] = time.perf_counter()

    def _post(self, module, args, output):
        self.sync()
        self.times.append(time.perf_counter() - self._start.pop(id(module)))

    def remove(self):
        for h in self.handles:
            h.remove()


def decode(model, batch: int, prompt: int, steps: int, warmup: int, sync):
    """Median seconds per decode step and per experts call, over `steps` timed steps."""
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device=model.device,
                        generator=torch.Generator(device=model.device).manual_seed(1))
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        step_times, layer_times = [], []
        for i in range(warmup + steps):
            timer = LayerTimer(model, sync) if i >= warmup else None
            sync()
            start = time.perf_counter()
            out = model(token, past_key_values=past, use_cache=True)
            sync()
            elapsed = time.perf_counter() - start
            past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            if timer is not None:
                timer.remove()
                step_times.append(elapsed)
                layer_times.extend(timer.times)
    return statistics.median(step_times), statistics.median(layer_times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--formats", nargs="+", default=["bf16"], choices=["bf16", "fp8"])
    parser.add_argument("--implementations", nargs="+", default=["eager", "grouped_mm", "moe_hal"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", action="store_true", help="one JSON object per row instead of a table")
    args = parser.parse_args(argv)

    import transformers

    import hal.integrations.transformers as hal_tf

    hal_tf.register()
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"device {args.device}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"python {sys.version.split()[0]}", flush=True)
    print(f"# Qwen3-30B-A3B-shaped: {args.layers} layers, vocab {args.vocab}, batch {args.batch}, "
          f"prompt {args.prompt}, {args.steps} timed decode steps after {args.warmup}", flush=True)
    if not args.json:
        print("| format | implementation | backend | decode tok/s | step ms | MoE layer ms |")
        print("|---|---|---|---:|---:|---:|")
    for fmt in args.formats:
        model = build(args.layers, args.vocab, args.device)
        if fmt == "fp8":
            model = to_fp8_experts(model)
        for impl in args.implementations:
            row = {"format": fmt, "implementation": impl}
            try:
                model.set_experts_implementation(impl)
                backend = impl
                if impl == hal_tf.NAME:
                    backends = {layer.backend for layer in hal_tf.prepare(model).values()}
                    backend = ",".join(sorted(backends))
                step, layer = decode(model, args.batch, args.prompt, args.steps, args.warmup, sync)
                row.update(backend=backend, tokens_per_s=args.batch / step, step_ms=step * 1e3,
                           moe_layer_ms=layer * 1e3)
            except Exception as exc:  # a path this host cannot run (FP8 without its CUDA kernel)
                row.update(backend="n/a", error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
            if args.json:
                print(json.dumps(row), flush=True)
            elif "error" in row:
                print(f"| {fmt} | {impl} | n/a: {row['error']} | | | |", flush=True)
            else:
                print(f"| {fmt} | {impl} | {row['backend']} | {row['tokens_per_s']:.2f} "
                      f"| {row['step_ms']:.1f} | {row['moe_layer_ms']:.1f} |", flush=True)
        del model
    return 0


if __name__ == "__main__":
    sys.exit(main())

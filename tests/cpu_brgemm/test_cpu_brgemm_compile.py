"""cpu_brgemm under torch.compile's default backend (Inductor), which compiles the code around
the op and functionalizes its in-place output: the compiled call gives the eager output bit for
bit. The conformance suite compiles every spec with aot_eager; this is the one full compile."""

import pytest
import torch

import hal
from hal import synth

pytestmark = pytest.mark.cpu

SPEC = hal.MoESpec(num_experts=8, top_k=2, hidden_size=96, intermediate_size=160,
                   weight_format="fp8_block128", activation="swiglu_oai", has_bias=True)


def test_inductor_compiles_a_layer_around_the_kernel():
    try:
        kernel = hal.select_moe_kernel(SPEC, "cpu", prefer="cpu_brgemm")
    except hal.NoKernelError as exc:
        pytest.skip(str(exc))
    prepared = kernel.prepare_weights(synth.random_weights(SPEC, seed=1))
    x = synth.random_tokens(SPEC, 11, seed=2)
    tw, ti = synth.random_routing(SPEC, 11, seed=3)

    def layer(x, tw, ti):
        return kernel(x * 2, tw, ti, prepared) + x  # work on both sides for Inductor to fuse

    eager = layer(x, tw, ti)
    torch._dynamo.reset()
    compiled = torch.compile(layer)(x, tw, ti)
    assert torch.equal(eager.view(torch.int16), compiled.view(torch.int16))

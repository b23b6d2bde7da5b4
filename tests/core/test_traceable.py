"""hal.traceable: an op defined with its kernel in one step (CompositeImplicitAutograd, as the C++
sources' m.def(schema, fn) registers it) and whose kernel reads tensor data cannot be traced by
torch.compile; its twin, with a fake kernel, traces and gives the eager result, for an op that
writes its output in place and one whose output size depends on the values."""

import pytest
import torch

from hal import traceable

pytestmark = pytest.mark.cpu

NAMESPACE = "hal_selftest_traceable"
_library = torch.library.Library(NAMESPACE, "DEF")
_library.define("scale_into(Tensor x, Tensor(a!) out, float k) -> ()")
_library.define("positive_rows(Tensor x) -> Tensor")


def _scale_into(x, out, k):
    """Reads the data as a compiled kernel does (no fake tensor has any)."""
    out.copy_(torch.tensor([v * k for v in x.tolist()], dtype=out.dtype))


def _positive_rows(x):
    return torch.tensor([i for i, v in enumerate(x.tolist()) if v > 0], dtype=torch.int32)


_library.impl("scale_into", _scale_into, "CompositeImplicitAutograd")
_library.impl("positive_rows", _positive_rows, "CompositeImplicitAutograd")


def _scale_into_fake(x, out, k) -> None:
    pass


def _positive_rows_fake(x):
    return x.new_empty((torch.library.get_ctx().new_dynamic_size(),), dtype=torch.int32)


FAKES = {"scale_into": _scale_into_fake, "positive_rows": _positive_rows_fake}


def layer(ops, x):
    out = torch.empty_like(x)
    ops.scale_into(x + 1, out, 3.0)
    return out * 2, ops.positive_rows(x)


def test_the_op_itself_does_not_trace():
    with pytest.raises(Exception, match="scale_into|tolist|data"):
        torch._dynamo.reset()
        torch.compile(lambda x: layer(getattr(torch.ops, NAMESPACE), x), backend="aot_eager",
                      fullgraph=True)(torch.randn(6))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_the_twin_traces_and_matches_eager(backend):
    twins = traceable.twins(NAMESPACE, FAKES)
    assert traceable.twins(NAMESPACE, FAKES) is twins  # defined once
    x = torch.randn(6, generator=torch.Generator().manual_seed(1))
    eager = layer(getattr(torch.ops, NAMESPACE), x)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: layer(twins, x), backend=backend, fullgraph=True)(x)
    for want, got in zip(eager, compiled, strict=True):
        assert torch.equal(want, got)

"""Selection never takes the reference oracle silently: an unforced reference winner warns once
per spec and device, naming why each faster backend lost, and strict mode refuses it."""

import warnings

import pytest

import hal
from hal import SlowPathWarning, ops
from hal.registry import Discovered, select_moe_kernel
from hal.verdict import Verdict

pytestmark = pytest.mark.cpu

SPEC = hal.MoESpec(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64)
INT4 = hal.MoESpec(num_experts=8, top_k=2, hidden_size=256, intermediate_size=128,
                   weight_format="int4_g128")


class Fake:
    ops = ("moe",)

    def __init__(self, name, rank, reasons=()):
        self.name, self._rank, self._reasons = name, rank, reasons

    def check(self, spec, target):
        return Verdict.from_reasons(self._reasons)

    def rank(self, spec, target):
        return self._rank

    def build(self, spec, target):
        return type("K", (), {"backend": self.name, "decision": None})()


def found(*backends):
    return [Discovered(b.name, backend=b) for b in backends]


SLOW = found(Fake("reference", 0), Fake("fast", 100, ["needs a GPU"]))


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for var in ("HAL_BACKENDS", "HAL_DISABLE_BACKENDS", "HAL_STRICT",
                *(op.override_variable for op in ops.OPS)):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hal.registry, "_slow_path_warned", set())


def test_a_reference_winner_warns_once_naming_why_the_fast_backends_lost():
    with pytest.warns(SlowPathWarning) as record:
        kernel = select_moe_kernel(SPEC, "cpu", caps=hal.caps.Caps(), backends=SLOW)
        select_moe_kernel(SPEC, "cpu", caps=hal.caps.Caps(), backends=SLOW)
    assert kernel.backend == "reference" and kernel.decision.slow
    assert len(record) == 1
    message = str(record[0].message)
    assert "fast: needs a GPU" in message and "HAL_STRICT=1" in message
    assert record[0].filename == __file__  # points at the caller's line, not inside hal
    assert "[SLOW PATH]" in kernel.decision.explain() and kernel.decision.to_dict()["slow_path"]


def test_a_forced_reference_does_not_warn(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowPathWarning)
        assert select_moe_kernel(SPEC, "cpu", caps=hal.caps.Caps(), backends=SLOW,
                                 prefer="reference").backend == "reference"
        monkeypatch.setenv("HAL_MOE_BACKEND", "reference")
        kernel = select_moe_kernel(SPEC, "cpu", caps=hal.caps.Caps(), backends=SLOW)
    assert not kernel.decision.slow and "SLOW" not in kernel.decision.explain()


def test_a_fast_winner_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowPathWarning)
        kernel = select_moe_kernel(SPEC, "cpu", caps=hal.caps.Caps(),
                                   backends=found(Fake("reference", 0), Fake("fast", 100)))
    assert kernel.backend == "fast"


def test_strict_raises_no_kernel_instead(monkeypatch):
    with pytest.raises(hal.NoKernelError, match="strict=True refuses the reference oracle") as err:
        select_moe_kernel(SPEC, "cpu", caps=hal.caps.Caps(), backends=SLOW, strict=True)
    assert "needs a GPU" in str(err.value) and err.value.decision.winner is None
    monkeypatch.setenv("HAL_STRICT", "1")
    with pytest.raises(hal.NoKernelError, match="HAL_STRICT=1 refuses"):
        select_moe_kernel(SPEC, "cpu", caps=hal.caps.Caps(), backends=SLOW)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowPathWarning)  # forced: strict has nothing to refuse
        select_moe_kernel(SPEC, "cpu", caps=hal.caps.Caps(), backends=SLOW, prefer="reference")
    with pytest.warns(SlowPathWarning):  # strict=False wins over HAL_STRICT=1
        assert select_moe_kernel(SPEC, "cpu", caps=hal.caps.Caps(), backends=SLOW,
                                 strict=False).backend == "reference"


@pytest.mark.parametrize("value", ["yes please", "2"])
def test_hal_strict_takes_one_or_zero(monkeypatch, value):
    monkeypatch.setenv("HAL_STRICT", value)
    with pytest.raises(ValueError, match="HAL_STRICT"):
        select_moe_kernel(SPEC, "cpu", caps=hal.caps.Caps(), backends=SLOW)


def test_strict_argument_is_a_bool():
    with pytest.raises(ValueError, match="strict='yes'"):
        select_moe_kernel(SPEC, "cpu", caps=hal.caps.Caps(), backends=SLOW, strict="yes")


def test_a_failed_build_that_leaves_only_the_reference_warns():
    class Broken(Fake):
        def build(self, spec, target):
            raise RuntimeError("read-only cache")

    with pytest.warns(SlowPathWarning, match="broken: build failed: RuntimeError: read-only cache"):
        select_moe_kernel(SPEC, "cpu", caps=hal.caps.Caps(),
                          backends=found(Fake("reference", 0), Broken("broken", 100)))
    with pytest.raises(hal.NoKernelError, match="read-only cache"):
        select_moe_kernel(SPEC, "cpu", caps=hal.caps.Caps(), strict=True,
                          backends=found(Fake("reference", 0), Broken("broken", 100)))


def test_int4_on_a_cpu_profile_is_the_slow_path_with_the_real_backends():
    with pytest.warns(SlowPathWarning, match="cpu_brgemm: ") as record:
        kernel = select_moe_kernel(INT4, "cpu", caps=hal.probe(profile="zen4"))
    assert kernel.backend == "reference"
    assert "marlin: " in str(record[0].message) and "does not serve" not in str(record[0].message)
    with pytest.raises(hal.NoKernelError):
        select_moe_kernel(INT4, "cpu", caps=hal.probe(profile="zen4"), strict=True)


def test_requant_strict_too():
    spec = hal.RequantSpec(num_experts=8, hidden_size=256)
    with pytest.raises(hal.NoKernelError, match="strict"):
        hal.select_requant_kernel(spec, "cpu", caps=hal.caps.Caps(), strict=True)

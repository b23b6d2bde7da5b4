import logging

import pytest

import hal
from hal.backend import Target
from hal.caps import Caps
from hal.registry import Discovered, decide, discover, select_moe_kernel
from hal.verdict import Verdict

pytestmark = pytest.mark.cpu

SPEC = hal.MoESpec(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64)
CAPS = Caps()


class FakeBackend:
    ops = ("moe",)

    def __init__(self, name, rank, reasons=(), build_error=None):
        self.name, self._rank, self._reasons, self._build_error = name, rank, reasons, build_error

    def check(self, spec, target):
        return Verdict.from_reasons(self._reasons, notes=[f"{self.name} fits"])

    def rank(self, spec, target):
        return self._rank

    def build(self, spec, target):
        if self._build_error:
            raise RuntimeError(self._build_error)
        return type("K", (), {"backend": self.name, "decision": None})()


def found(*backends):
    return [Discovered(b.name, backend=b) for b in backends]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ("HAL_BACKENDS", "HAL_DISABLE_BACKENDS", "HAL_MOE_BACKEND"):
        monkeypatch.delenv(var, raising=False)


def test_highest_rank_wins_and_every_candidate_has_a_verdict():
    d = decide(SPEC, Target("cpu", CAPS), found(FakeBackend("slow", 1), FakeBackend("fast", 9),
                                                 FakeBackend("no", 99, ["needs a GPU", "needs AMX"])))
    assert d.winner == "fast"
    by_name = {c.name: c for c in d.candidates}
    assert by_name["no"].verdict.reasons == ("needs a GPU", "needs AMX")
    text = d.explain()
    assert "WIN fast" in text and "needs a GPU; needs AMX" in text and "slow rank 1" in text


def test_allow_and_deny_lists(monkeypatch):
    backends = found(FakeBackend("a", 1), FakeBackend("b", 2))
    monkeypatch.setenv("HAL_DISABLE_BACKENDS", "b")
    assert decide(SPEC, Target("cpu", CAPS), backends).winner == "a"
    monkeypatch.delenv("HAL_DISABLE_BACKENDS")
    monkeypatch.setenv("HAL_BACKENDS", "a")
    d = decide(SPEC, Target("cpu", CAPS), backends)
    assert d.winner == "a"
    assert "not in HAL_BACKENDS" in d.explain()


def test_prefer_forces_and_raises_with_reasons(monkeypatch):
    backends = found(FakeBackend("a", 1), FakeBackend("b", 2, ["no bias support"]))
    assert select_moe_kernel(SPEC, "cpu", caps=CAPS, prefer="a", backends=backends).backend == "a"
    with pytest.raises(hal.NoKernelError, match="no bias support"):
        select_moe_kernel(SPEC, "cpu", caps=CAPS, prefer="b", backends=backends)
    monkeypatch.setenv("HAL_MOE_BACKEND", "b")
    with pytest.raises(hal.NoKernelError, match="HAL_MOE_BACKEND"):
        select_moe_kernel(SPEC, "cpu", caps=CAPS, backends=backends)


def test_import_failure_is_a_rejection_not_a_crash():
    backends = [Discovered("broken", error="import failed: ImportError: no triton")] + \
        found(FakeBackend("ok", 1))
    kernel = select_moe_kernel(SPEC, "cpu", caps=CAPS, backends=backends)
    assert kernel.backend == "ok"
    assert "import failed: ImportError: no triton" in kernel.decision.explain()


def test_nothing_fits_lists_every_reason():
    backends = found(FakeBackend("a", 1, ["reason one"]), FakeBackend("b", 1, ["reason two"]))
    with pytest.raises(hal.NoKernelError) as err:
        select_moe_kernel(SPEC, "cpu", caps=CAPS, backends=backends)
    assert "reason one" in str(err.value) and "reason two" in str(err.value)


def test_no_registered_backend_says_how_to_register_them():
    with pytest.raises(hal.NoKernelError, match="pip install -e"):
        select_moe_kernel(SPEC, "cpu", caps=CAPS, backends=[])


def test_failed_build_falls_to_the_next_backend():
    backends = found(FakeBackend("best", 9, build_error="nvcc exploded"), FakeBackend("next", 1))
    kernel = select_moe_kernel(SPEC, "cpu", caps=CAPS, backends=backends)
    assert kernel.backend == "next"
    assert "build failed: RuntimeError: nvcc exploded" in kernel.decision.explain()


def test_choice_logged_at_info_rejections_at_debug(caplog):
    backends = found(FakeBackend("a", 1), FakeBackend("b", 2, ["too small"]))
    with caplog.at_level(logging.DEBUG, logger="hal.registry"):
        select_moe_kernel(SPEC, "cpu", caps=CAPS, backends=backends)
    levels = {(r.levelno, r.getMessage().split(":")[0]) for r in caplog.records}
    assert (logging.INFO, "moe on cpu") in levels
    assert any(level == logging.DEBUG and "b rejected" in msg for level, msg in levels)


def test_bad_device_is_named():
    with pytest.raises(ValueError, match="device='tpu'"):
        select_moe_kernel(SPEC, "tpu", caps=CAPS, backends=found(FakeBackend("a", 1)))


def test_entry_points_include_the_builtin_backends():
    names = {d.name for d in discover()}
    assert {"reference", "cpu_brgemm", "marlin", "requant"} <= names


def test_reference_is_last_but_always_there():
    kernel = select_moe_kernel(SPEC, "cpu", caps=CAPS, prefer="reference")
    assert kernel.backend == "reference"
    ref = next(c for c in kernel.decision.candidates if c.name == "reference")
    assert ref.rank == min(c.rank for c in kernel.decision.candidates if c.rank is not None)

import logging

import attrs
import pytest

import hal
from hal import ops, presets
from hal.backend import Target
from hal.caps import Caps
from hal.registry import Discovered, decide, discover, select_kernel, select_moe_kernel
from hal.verdict import Verdict

pytestmark = pytest.mark.cpu

SPEC = hal.MoESpec(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64)
CAPS = Caps()


class FakeBackend:
    def __init__(self, name, rank, reasons=(), build_error=None, *, ops=("moe",), priority=None,
                 explicit_only=False):
        self.name, self._rank, self._reasons, self._build_error = name, rank, reasons, build_error
        self.ops, self._explicit_only = ops, explicit_only
        if priority is not None:
            self.priority = priority

    def check(self, spec, target):
        return Verdict.from_reasons(self._reasons, notes=[f"{self.name} fits"],
                                    explicit_only=self._explicit_only)

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
    for var in ("HAL_BACKENDS", "HAL_DISABLE_BACKENDS", *(op.override_variable for op in ops.OPS)):
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


def test_reference_wins_only_where_nothing_faster_accepts():
    """A CPU without a fast path for the format gets the reference; one with it does not, and
    there the reference is accepted but ranked below the winner."""
    found_ = discover()
    zen4 = Target("cpu", hal.probe(profile="zen4"))
    int4 = hal.MoESpec(num_experts=8, top_k=2, hidden_size=256, intermediate_size=128,
                       weight_format="int4_g128")
    assert decide(int4, zen4, found_).winner == "reference"
    d = decide(SPEC, zen4, found_)
    assert d.winner == "cpu_brgemm", d.explain()
    by_name = {c.name: c for c in d.candidates}
    assert by_name["reference"].verdict.ok
    assert by_name["reference"].rank < by_name["cpu_brgemm"].rank


MASKED = hal.MoESpec(num_experts=8, top_k=2, hidden_size=256, intermediate_size=128,
                     weight_format="w4afp8", layout="masked")
REQUANT = hal.RequantSpec(num_experts=8, hidden_size=256)


@pytest.mark.parametrize("spec, op", [(SPEC, "moe"), (MASKED, "moe_masked"), (REQUANT, "requant")])
def test_each_spec_asks_for_one_op(spec, op):
    assert ops.op_of(spec).name == op
    assert decide(spec, Target("cpu", CAPS), []).op == op


def test_a_backend_is_asked_only_for_the_ops_it_declares():
    backends = found(FakeBackend("moe_only", 9), FakeBackend("masked_only", 5, ops=("moe_masked",)))
    d = decide(MASKED, Target("cpu", CAPS), backends)
    assert d.winner == "masked_only"
    assert "does not serve op 'moe_masked'" in d.explain()


@pytest.mark.parametrize("variable, spec, forced_wins", [
    ("HAL_MOE_BACKEND", SPEC, True), ("HAL_MOE_BACKEND", MASKED, False),
    ("HAL_MOE_BACKEND", REQUANT, False), ("HAL_MOE_MASKED_BACKEND", MASKED, True),
    ("HAL_MOE_MASKED_BACKEND", SPEC, False), ("HAL_REQUANT_BACKEND", REQUANT, True),
    ("HAL_REQUANT_BACKEND", SPEC, False),
])
def test_override_variables_apply_to_their_own_op_only(monkeypatch, variable, spec, forced_wins):
    every_op = ("moe", "moe_masked", "requant")
    backends = found(FakeBackend("slow", 1, ops=every_op), FakeBackend("fast", 9, ops=every_op))
    monkeypatch.setenv(variable, "slow")
    d = decide(spec, Target("cpu", CAPS), backends)
    assert d.winner == ("slow" if forced_wins else "fast"), d.explain()
    assert (d.forced_by == variable) is forced_wins


def test_moe_override_does_not_touch_requant_selection_of_the_real_backends(monkeypatch):
    monkeypatch.setenv("HAL_MOE_BACKEND", "marlin")
    kernel = hal.select_requant_kernel(REQUANT, "cpu", caps=CAPS)
    assert kernel.backend == "reference" and kernel.decision.forced_by is None
    monkeypatch.setenv("HAL_REQUANT_BACKEND", "marlin")
    with pytest.raises(hal.NoKernelError, match="HAL_REQUANT_BACKEND"):
        hal.select_requant_kernel(REQUANT, "cpu", caps=CAPS)


def test_prefer_wins_over_the_override_variable(monkeypatch):
    backends = found(FakeBackend("a", 1), FakeBackend("b", 2))
    monkeypatch.setenv("HAL_MOE_BACKEND", "b")
    d = decide(SPEC, Target("cpu", CAPS), backends, prefer="a")
    assert (d.winner, d.forced_by) == ("a", "prefer=")


def test_forcing_an_unknown_backend_says_it_is_not_registered():
    with pytest.raises(hal.NoKernelError, match="'nope' \\(prefer=\\) is not a registered backend"):
        select_moe_kernel(SPEC, "cpu", caps=CAPS, prefer="nope", backends=found(FakeBackend("a", 1)))


def test_explicit_only_never_wins_unless_named(monkeypatch):
    backends = found(FakeBackend("interp", 99, explicit_only=True), FakeBackend("plain", 1))
    d = decide(SPEC, Target("cpu", CAPS), backends)
    assert d.winner == "plain"
    line = next(x for x in d.explain().splitlines() if "interp" in x)
    assert line.lstrip().startswith("only interp") and "explicit only" in line
    assert "HAL_MOE_BACKEND" in line
    assert decide(SPEC, Target("cpu", CAPS), backends, prefer="interp").winner == "interp"
    monkeypatch.setenv("HAL_MOE_BACKEND", "interp")
    assert decide(SPEC, Target("cpu", CAPS), backends).winner == "interp"


def test_explicit_only_alone_is_no_kernel():
    with pytest.raises(hal.NoKernelError, match="explicit only"):
        select_moe_kernel(SPEC, "cpu", caps=CAPS,
                          backends=found(FakeBackend("interp", 5, explicit_only=True)))


def test_requant_interpreter_on_cpu_is_explicit_only(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    d = decide(REQUANT, Target("cpu", CAPS), discover())
    requant = next(c for c in d.candidates if c.name == "requant")
    assert requant.verdict.ok and requant.verdict.explicit_only and not requant.eligible
    assert d.winner == "reference"
    assert decide(REQUANT, Target("cpu", CAPS), discover(), prefer="requant").winner == "requant"


@pytest.mark.parametrize("order", [0, 1])
def test_equal_ranks_fall_to_priority_then_name_whatever_the_discovery_order(order):
    backends = [FakeBackend("zeta", 5, priority=1), FakeBackend("alpha", 5), FakeBackend("beta", 5)]
    if order:
        backends.reverse()
    assert decide(SPEC, Target("cpu", CAPS), found(*backends)).winner == "zeta"
    without_priority = [b for b in backends if b.name != "zeta"]
    assert decide(SPEC, Target("cpu", CAPS), found(*without_priority)).winner == "alpha"


def test_a_failed_build_falls_to_the_next_by_the_same_rule():
    backends = found(FakeBackend("b", 5), FakeBackend("a", 5, build_error="no compiler"),
                     FakeBackend("c", 5, priority=2, build_error="nvcc missing"))
    kernel = select_moe_kernel(SPEC, "cpu", caps=CAPS, backends=backends)
    assert kernel.backend == "b"
    text = kernel.decision.explain()
    for why in ("build failed: RuntimeError: nvcc missing", "build failed: RuntimeError: no compiler"):
        assert why in text


def test_every_failed_build_is_no_kernel_with_the_build_errors():
    with pytest.raises(hal.NoKernelError, match="build failed: RuntimeError: nvcc missing"):
        select_kernel(SPEC, "cpu", caps=CAPS, backends=found(FakeBackend("a", 5, build_error="nvcc missing")))


def test_marlin_without_a_toolchain_fails_its_build_and_the_next_backend_runs(monkeypatch):
    """check() accepts from the caps alone; build() finds no nvcc on this (live) target, and the
    trace keeps the reason while the next backend is built."""
    from hal.backends.marlin import build

    monkeypatch.setattr(build, "nvcc_archs", lambda: (None, (), "nvcc was not found (set CUDA_HOME)"))
    caps = attrs.evolve(hal.probe(profile="h200"), profile=None)
    int4 = hal.MoESpec(num_experts=8, top_k=2, hidden_size=256, intermediate_size=128,
                       weight_format="int4_g128", num_local_experts=4)  # an EP rank: marlin ranks first
    assert decide(int4, Target("cuda:0", caps), discover()).winner == "marlin"
    kernel = select_moe_kernel(int4, "cuda:0", caps=caps)
    assert kernel.backend == "triton_moe"  # the next accepted backend by rank
    marlin = next(c for c in kernel.decision.candidates if c.name == "marlin")
    assert "build failed: ToolchainError" in marlin.verdict.summary()
    assert "nvcc was not found" in marlin.verdict.summary()


def test_activation_numerics_a_backend_does_not_declare_are_rejected_with_its_other_reasons():
    """act_quant is held to each backend's declared act_quants (("none",) when it declares none),
    before rank: a kernel of other numerics would be off the spec's oracle by their difference."""
    fp8 = attrs.evolve(SPEC, weight_format="fp8_block128", act_quant="fp8_g128")
    serving = FakeBackend("w8a8", 1)
    serving.act_quants = ("none", "fp8_g128")
    d = decide(fp8, Target("cpu", CAPS), found(FakeBackend("fast", 9, ["needs a GPU"]), serving))
    assert d.winner == "w8a8"
    fast = next(c for c in d.candidates if c.name == "fast")
    assert fast.verdict.reasons == ("act_quant='fp8_g128': its kernels compute 'none'", "needs a GPU")
    assert decide(attrs.evolve(fp8, act_quant="none"), Target("cpu", CAPS),
                  found(FakeBackend("fast", 9), serving)).winner == "fast"


def test_fp8_activation_numerics_select_triton_moe_w8a8_on_hopper():
    """On an H100 profile the w8a8 kernels win fp8_g128; the CPU kernels decline it by their
    declared numerics, so on a CPU only the reference computes it."""
    spec = presets.get("deepseek-v3").spec("fp8_block128", act_quant="fp8_g128")
    d = decide(spec, Target("cuda:0", hal.probe(profile="h100")), discover())
    assert d.winner == "triton_moe"
    cpu = decide(spec, Target("cpu", hal.probe(profile="emerald-rapids")), discover())
    assert cpu.winner == "reference"
    brgemm = next(c for c in cpu.candidates if c.name == "cpu_brgemm")
    assert "act_quant='fp8_g128'" in brgemm.verdict.summary()

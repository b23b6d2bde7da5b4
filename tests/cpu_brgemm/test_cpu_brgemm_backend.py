"""check / rank / notes of the cpu_brgemm backend from capability data alone (no build)."""

from __future__ import annotations

import pytest
from hal.backends.cpu_brgemm import backend

from hal import synth
from hal.backend import RANK_PORTABLE_FAST, RANK_SPECIALIZED, Target
from hal.caps import AmxState, Caps, CpuCaps, IsaFlags
from hal.spec import MoESpec

pytestmark = pytest.mark.cpu

AVX2 = IsaFlags(avx2=True, fma=True)
AVX512_BF16 = IsaFlags(avx2=True, fma=True, avx512f=True, avx512bw=True, avx512vl=True,
                       avx512dq=True, avx512_bf16=True)
AMX = AmxState(cpuid=True, os_support=True, permitted=True)
NO_AMX = AmxState()


def _target(isa, amx=NO_AMX, device="cpu"):
    return Target(device, Caps(cpu=CpuCaps(isa=isa, amx=amx)))


def _spec(**kw):
    fields = dict(num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768,
                  weight_format="fp8_block128")
    fields.update(kw)
    return MoESpec(**fields)


@pytest.mark.parametrize("spec", [
    _spec(), _spec(weight_format="bf16"), _spec(weight_format="mxfp4", hidden_size=2880,
                                                intermediate_size=2880, activation="swiglu_oai",
                                                has_bias=True),
    _spec(hidden_size=7168, intermediate_size=2048, num_local_experts=32),
])
def test_accepts_model_shapes_everywhere(spec):
    for target in (_target(AVX2), _target(AVX512_BF16), _target(AVX512_BF16, AMX)):
        verdict = backend.check(spec, target)
        assert verdict.ok, verdict.reasons


def test_notes_and_rank_follow_the_hardware():
    spec = _spec()
    amx = _target(AVX512_BF16, AMX)
    assert "BRGEMM (AMX)" in backend.check(spec, amx).summary()
    assert backend.rank(spec, amx) == RANK_SPECIALIZED
    avx2 = _target(AVX2)
    assert "TinyGEMM AVX2" in backend.check(spec, avx2).summary()
    assert backend.rank(spec, avx2) == RANK_PORTABLE_FAST
    no_perm = _target(AVX512_BF16, AmxState(cpuid=True, os_support=True, permitted=False,
                                            reason="seccomp"))
    assert "AVX-512-BF16 for every block" in backend.check(spec, no_perm).summary()
    assert backend.rank(spec, no_perm) == RANK_PORTABLE_FAST


def test_collects_every_reason():
    spec = _spec(weight_format="int4_g128", hidden_size=2048 + 128, intermediate_size=768 + 128 + 8 * 16,
                 act_dtype="float16")
    verdict = backend.check(spec, _target(IsaFlags(), device="cuda:0"))
    assert not verdict.ok
    text = " | ".join(verdict.reasons)
    for needle in ("runs on the CPU", "weight_format='int4_g128'", "act_dtype='float16'"):
        assert needle in text


def test_refuses_sizes_off_32_and_masked_and_old_cpus():
    spec = _spec(weight_format="bf16", hidden_size=2048 + 16, intermediate_size=768 + 8)
    verdict = backend.check(spec, _target(IsaFlags(avx2=False)))
    assert not verdict.ok
    assert len(verdict.reasons) == 3, verdict.reasons
    assert "hidden_size=2064 is not a multiple of 32" in verdict.reasons[0]
    assert "intermediate_size=776" in verdict.reasons[1]
    assert "neither AVX-512-BF16 nor AVX2" in verdict.reasons[2]
    masked = MoESpec(num_experts=8, top_k=2, hidden_size=256, intermediate_size=256,
                     weight_format="w4afp8", layout="masked")
    reasons = backend.check(masked, _target(AVX2)).reasons
    assert any("layout='masked'" in r for r in reasons) and any("w4afp8" in r for r in reasons)


def test_a_kernel_built_for_an_amx_profile_refuses_to_run_without_amx():
    import hal
    from hal.testing import live_cpu_caps

    if live_cpu_caps().cpu.amx.usable:
        pytest.skip("this CPU has usable AMX: the profile's promise holds here")
    spec = hal.MoESpec(num_experts=4, top_k=1, hidden_size=128, intermediate_size=64,
                       weight_format="fp8_block128")
    kernel = hal.select_moe_kernel(spec, "cpu", caps=hal.probe(profile="emerald-rapids"),
                                   prefer="cpu_brgemm")
    weights = synth.random_weights(spec)
    x = synth.random_tokens(spec, 8)
    tw, ti = synth.random_routing(spec, 8)
    with pytest.raises(ValueError, match="built for profile 'emerald-rapids'"):
        kernel(x, tw, ti, kernel.prepare_weights(weights))


def test_an_unusable_cache_dir_fails_the_build_and_names_the_variable(tmp_path, monkeypatch):
    """A HAL_CACHE_DIR that cannot hold builds is found when the kernel is built, not at its first
    call: selection records it in the trace and builds the next backend."""
    import hal

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("HAL_CACHE_DIR", str(blocker))
    kernel = hal.select_moe_kernel(_spec(), "cpu", caps=_target(AVX2).caps)
    trace = kernel.decision.explain()
    assert kernel.backend == "reference", trace
    assert "build failed" in trace and f"HAL_CACHE_DIR={blocker}" in trace, trace

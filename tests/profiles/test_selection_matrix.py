"""Selection across recorded profiles: pure functions of (spec, caps, registry), so any machine
checks what an H200, an MI300X or a Sapphire Rapids VM would be given."""

import pytest

import hal
from hal import presets
from hal.backend import Target
from hal.matrix import devices_of, selection_matrix
from hal.registry import decide, discover

pytestmark = [pytest.mark.profiles, pytest.mark.cpu]

FOUND = discover()


def winner(profile, spec, device):
    d = decide(spec, Target(device, hal.probe(profile=profile)), FOUND)
    return d, next((c for c in d.candidates if c.name == d.winner), None)


@pytest.mark.parametrize("profile", hal.profiles())
def test_every_backend_answers_every_preset_on_every_profile(profile):
    """No check() raises on any recorded machine, and every verdict says why: notes when it
    accepts, reasons when it rejects."""
    caps = hal.probe(profile=profile)
    for preset in presets.PRESETS.values():
        for fmt in preset.formats:
            for device in devices_of(caps):
                d = decide(preset.spec(fmt), Target(device, caps), FOUND)
                for c in d.candidates:
                    text = c.verdict.summary()
                    assert "check raised" not in text, (profile, preset.name, fmt, c.name, text)
                    assert c.verdict.notes if c.verdict.ok else c.verdict.reasons, (profile, c.name)


def test_no_backend_failed_to_import():
    assert [d.error for d in FOUND if d.error] == []


def test_emerald_rapids_fp8_goes_to_cpu_brgemm_on_amx():
    d, win = winner("emerald-rapids", presets.get("qwen3-30b-a3b").spec("fp8_block128"), "cpu")
    assert d.winner == "cpu_brgemm", d.explain()
    assert "AMX" in win.verdict.summary()


def test_zen3_gets_cpu_brgemm_on_its_vector_path():
    d, win = winner("zen3", presets.get("gpt-oss-20b").spec("mxfp4"), "cpu")
    assert d.winner == "cpu_brgemm", d.explain()
    assert "AVX2" in win.verdict.summary()


def test_sapphire_rapids_vm_without_amx_permission_does_not_use_amx():
    caps = hal.probe(profile="sapphire-rapids-vm")
    assert caps.cpu.isa.amx_tile and not caps.cpu.amx.usable
    d, win = winner("sapphire-rapids-vm", presets.get("deepseek-v3").spec("fp8_block128"), "cpu")
    assert d.winner == "cpu_brgemm", d.explain()
    summary = win.verdict.summary()
    assert "AMX not usable" in summary and "TinyGEMM AVX-512-BF16 for every block" in summary


def test_h200_int4_goes_to_triton_moe_and_on_an_ep_rank_to_marlin():
    d, win = winner("h200", presets.get("mixtral-8x7b").spec("int4_g128"), "cuda:0")
    assert d.winner == "triton_moe", d.explain()
    assert "above marlin" in win.verdict.summary()
    d, win = winner("h200", presets.get("deepseek-v3").spec("int4_g128", num_local_experts=32), "cuda:0")
    assert d.winner == "marlin", d.explain()


def test_a100_gets_marlin_for_int4_triton_moe_for_bf16_and_mxfp4_and_no_fp8_kernel():
    """sm_80, the oldest NVIDIA arch the GPU backends take: mma.sync kernels run, FP8 ones do not."""
    d, win = winner("a100", presets.get("mixtral-8x7b").spec("int4_g128"), "cuda:0")
    assert d.winner == "marlin" and "sm_80" in win.verdict.summary(), d.explain()
    for model, fmt in (("mixtral-8x7b", "bf16"), ("gpt-oss-20b", "mxfp4")):
        d, _ = winner("a100", presets.get(model).spec(fmt), "cuda:0")
        assert d.winner == "triton_moe", d.explain()
    d, _ = winner("a100", presets.get("qwen3-30b-a3b").spec("fp8_block128"), "cuda:0")
    triton = next(c for c in d.candidates if c.name == "triton_moe")
    assert d.winner == "reference" and "below sm_89" in triton.verdict.summary(), d.explain()
    d, _ = winner("a100", presets.get("deepseek-v3").spec("w4afp8"), "cuda:0")
    rejected = {c.name: c.verdict.summary() for c in d.candidates if not c.verdict.ok}
    assert d.winner == "reference" and "sm_89" in rejected["w4afp8"] and "sm_89" in rejected["requant"]


def test_mi300x_int4_is_not_marlin_because_of_the_vendor():
    d, _ = winner("mi300x", presets.get("deepseek-v3").spec("int4_g128"), "cuda:0")
    assert d.winner != "marlin"
    marlin = next(c for c in d.candidates if c.name == "marlin")
    assert not marlin.verdict.ok and any("NVIDIA" in r or "nvidia" in r for r in marlin.verdict.reasons)


def test_w4afp8_masked_on_mi300x_is_the_fp8_mfma_gemm_with_wave64():
    caps = hal.probe(profile="mi300x")
    assert caps.gpus[0].warp_size == 64
    d, win = winner("mi300x", presets.get("deepseek-v3").spec("w4afp8"), "cuda:0")
    assert d.winner == "w4afp8", d.explain()
    assert "64" in win.verdict.summary()
    fallback = next(c for c in d.candidates if c.name == "requant")
    assert fallback.verdict.ok and "64" in fallback.verdict.summary()


def test_rtx5090_is_not_treated_as_datacenter_blackwell():
    gpu = hal.probe(profile="rtx5090").gpus[0]
    assert gpu.arch == "sm_120" and not gpu.features.tcgen05
    assert gpu.smem_per_block_optin == 99 * 1024


@pytest.mark.parametrize("profile", ["h200", "mi300x", "zen4", "emerald-rapids"])
def test_selection_does_not_depend_on_discovery_order(profile):
    """The tie-break (rank, then priority, then name) decides, never the entry-point order."""
    caps = hal.probe(profile=profile)
    assert selection_matrix(caps, FOUND) == selection_matrix(caps, FOUND[::-1])


@pytest.mark.parametrize("profile", ["h200", "mi300x", "emerald-rapids"])
def test_the_probe_table_imports_neither_torch_nor_triton(profile):
    """`hal probe` ends with this matrix and must stay fast (torch alone imports in 1.5-6 s): every
    backend's check() runs torch-free, also for a live (not recorded) GPU."""
    import subprocess
    import sys

    code = ("import sys, attrs, hal\nfrom hal.matrix import devices_of, selection_matrix\n"
            f"caps = attrs.evolve(hal.probe(profile={profile!r}), profile=None)\n"
            "selection_matrix(caps)\n"
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"

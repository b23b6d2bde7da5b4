"""Recorded profiles: every one loads, round-trips and says what it is."""

import json

import attrs
import pytest

from hal.caps import SCHEMA_VERSION, Caps
from hal.probe import list_profiles, load_profile, probe
from hal.probe.profiles import PROFILE_DIR

pytestmark = pytest.mark.cpu
PROFILES = list_profiles()
REAL_CAPTURES = {"h200", "emerald-rapids", "zen4-epyc-2c"}


def test_expected_profiles_exist():
    assert set(PROFILES) >= REAL_CAPTURES | {"a100", "h100", "b200", "rtx5090", "mi300x", "rx7900xtx",
                                              "sapphire-rapids-vm", "zen4", "zen3"}


@pytest.mark.parametrize("name", PROFILES)
def test_round_trip(name):
    caps = load_profile(name)
    assert caps.profile == name
    assert Caps.from_json(caps.to_json()) == caps
    text = (PROFILE_DIR / f"{name}.json").read_text()
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION


@pytest.mark.parametrize("name", PROFILES)
def test_provenance(name):
    caps = load_profile(name)
    if name in REAL_CAPTURES:
        assert not caps.synthetic and caps.captured_on
    else:
        assert caps.synthetic and caps.citations, "a synthetic profile cites its datasheet figures"
        for section in (caps.cpu, *caps.gpus):
            assert set(section.sources.values()) <= {"datasheet", "arch_table", "scenario"}, section.sources


@pytest.mark.parametrize("name", PROFILES)
def test_gpu_sections_consistent(name):
    for gpu in load_profile(name).gpus:
        assert gpu.vendor in ("nvidia", "amd") and gpu.arch and gpu.warp_size in (32, 64)
        assert gpu.smem_per_block <= gpu.smem_per_block_optin <= gpu.smem_per_sm
        if gpu.vendor == "nvidia":
            assert gpu.warp_size == 32 and gpu.arch.startswith("sm_")
        else:
            assert gpu.arch.startswith("gfx") and ":" not in gpu.arch


def test_h200():
    caps = probe(profile="h200")
    (gpu,) = caps.gpus
    assert gpu.arch == "sm_90" and gpu.compute_capability == (9, 0)
    assert gpu.warp_size == 32 and gpu.smem_per_block_optin == 232448 and gpu.sm_count == 132
    assert gpu.features.wgmma and gpu.features.tma and not gpu.features.tcgen05
    assert caps.cpu.vendor == "GenuineIntel" and caps.cpu.isa.amx_tile


def test_a100_is_the_sm80_minimum_without_fp8_or_hopper_features():
    caps = probe(profile="a100")
    (gpu,) = caps.gpus
    assert caps.synthetic and not caps.captured_on and any("A100" in c for c in caps.citations)
    assert gpu.arch == "sm_80" and gpu.compute_capability == (8, 0) and gpu.sm_count == 108
    assert gpu.smem_per_block_optin == 163 * 1024 and gpu.smem_per_sm == 164 * 1024
    assert gpu.features.mma_sync and gpu.features.cp_async and gpu.features.fp8 is None
    assert not (gpu.features.wgmma or gpu.features.tma or gpu.features.tcgen05)
    assert caps.cpu.isa.avx2 and not caps.cpu.isa.avx512f and not caps.cpu.isa.amx_tile


def test_blackwell_split():
    b200, rtx = probe(profile="b200").gpus[0], probe(profile="rtx5090").gpus[0]
    assert b200.features.tcgen05 and not rtx.features.tcgen05
    assert rtx.smem_per_block_optin == 101376 and b200.smem_per_block_optin == 232448


def test_amd_wave_sizes():
    mi300x, rdna = probe(profile="mi300x").gpus[0], probe(profile="rx7900xtx").gpus[0]
    assert mi300x.warp_size == 64 and mi300x.features.fp8 == "fnuz" and mi300x.features.mfma
    assert rdna.warp_size == 32 and not rdna.features.mfma


def test_amx_in_cpuid_but_not_usable_in_vm():
    amx = probe(profile="sapphire-rapids-vm").cpu.amx
    assert amx.cpuid and amx.os_support is False and amx.permitted is False and not amx.usable
    assert "XCOMP_PERM" in amx.reason


def test_zen4_has_avx512_bf16_no_amx():
    cpu = probe(profile="zen4").cpu
    assert cpu.isa.avx512 and cpu.isa.avx512_bf16 and not cpu.isa.amx_tile and not cpu.amx.usable


def test_zen3_is_avx2_only():
    cpu = probe(profile="zen3").cpu
    assert cpu.isa.avx2 and cpu.isa.fma and not cpu.isa.avx512f


def test_bad_name_lists_available():
    with pytest.raises(ValueError) as err:
        probe(profile="no-such-gpu")
    message = str(err.value)
    assert "no-such-gpu" in message and "h200" in message and "mi300x" in message


def test_hal_caps_file(monkeypatch, tmp_path):
    caps = attrs.evolve(load_profile("mi300x"), profile=None)
    path = tmp_path / "machine.json"
    path.write_text(caps.to_json())
    monkeypatch.setenv("HAL_CAPS", str(path))
    loaded = probe()
    assert loaded.gpus == caps.gpus and loaded.profile == "machine"
    assert probe(profile="h200").profile == "h200", "profile= wins over HAL_CAPS"


def test_hal_caps_profile_name(monkeypatch):
    monkeypatch.setenv("HAL_CAPS", "zen4")
    assert probe().profile == "zen4"


def test_hal_caps_bad_value_names_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("HAL_CAPS", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="HAL_CAPS"):
        probe()


def test_schema_version_checked(tmp_path):
    data = json.loads(load_profile("h100").to_json())
    data["schema_version"] = SCHEMA_VERSION + 1
    path = tmp_path / "future.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="schema_version"):
        load_profile(str(path))


def test_unknown_key_rejected(tmp_path):
    data = json.loads(load_profile("h100").to_json())
    data["cpu"]["bogus"] = 1
    path = tmp_path / "bogus.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="bogus"):
        load_profile(str(path))


@pytest.mark.parametrize("name", PROFILES)
def test_table_renders(name):
    from hal.probe.table import format_caps

    caps = load_profile(name)
    text = format_caps(caps)
    assert name in text and (caps.cpu.model_name or "?") in text
    for gpu in caps.gpus:
        assert gpu.arch in text

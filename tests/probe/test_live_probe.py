"""The probe on the machine running the tests: sane values, sources for each, and no side effects."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hal.caps import Caps
from hal.probe import cpu as cpu_probe
from hal.probe import probe

pytestmark = pytest.mark.cpu
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def caps():
    return probe()


def test_cpu_fields_sane(caps):
    cpu = caps.cpu
    assert cpu.logical_cpus >= 1
    assert 1 <= cpu.physical_cores <= cpu.logical_cpus
    assert 1 <= cpu.usable_cpus <= cpu.logical_cpus
    assert cpu.numa_nodes is None or cpu.numa_nodes >= 1
    if sys.platform == "linux" and Path("/proc/cpuinfo").exists():
        assert cpu.vendor and cpu.model_name
    if cpu.isa.avx512f:
        assert cpu.isa.avx2
    assert cpu.amx.usable == bool(cpu.amx.cpuid and cpu.amx.os_support and cpu.amx.permitted)
    if not cpu.amx.usable:
        assert cpu.amx.reason


def test_caches(caps):
    caches = caps.cpu.caches
    assert caches, caps.cpu.unknown.get("caches")
    assert caps.cpu.cache(1) is not None
    for cache in caches:
        assert cache.size_bytes > 0 and cache.shared_by_cpus >= 1
        assert cache.scope in ("per_core", "shared")
    assert caps.cpu.cache(1).per_core


def test_every_field_has_source_or_reason(caps):
    for section in (caps.cpu, *caps.gpus):
        for name, value in _fields(section).items():
            if value is None:
                assert name in section.unknown, f"{type(section).__name__}.{name} is None without reason"
            elif name not in ("index", "features", "torch_archs", "caches", "isa", "amx"):
                assert name in section.sources, f"{type(section).__name__}.{name} has no source"
    assert caps.cpu.sources.get("isa") and caps.cpu.sources.get("amx")


def _fields(section):
    import attrs

    return {f.name: getattr(section, f.name) for f in attrs.fields(type(section))
            if f.name not in ("sources", "unknown")}


def test_round_trips(caps):
    assert Caps.from_json(caps.to_json()) == caps


def test_plain_probe_imports_no_torch_and_creates_no_context():
    """A fresh interpreter: the plain probe must not pay for (or initialise) torch."""
    code = ("import sys; from hal.probe import probe; c = probe(); "
            "print(int('torch' in sys.modules), int(c.deep))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          check=True)
    assert done.stdout.split() == ["0", "0"]


def test_plain_probe_with_torch_loaded_keeps_cuda_uninitialised():
    """A fresh interpreter, since an earlier test in this process may have used CUDA."""
    pytest.importorskip("torch")
    code = ("import torch; from hal.probe import probe; probe(); "
            "print(int(torch.cuda.is_initialized()))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          check=True)
    assert done.stdout.split() == ["0"]


def test_missing_files_become_reasons(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_probe, "PROC_CPUINFO", tmp_path / "no-cpuinfo")
    monkeypatch.setattr(cpu_probe, "SYSFS_CPU", tmp_path / "no-sysfs")
    monkeypatch.setattr(cpu_probe, "SYSFS_NODE", tmp_path / "no-nodes")
    cpu = cpu_probe.probe_cpu()
    for name in ("vendor", "model_name", "family", "isa"):
        assert "no-cpuinfo" in cpu.unknown[name]
    assert cpu.vendor is None and not cpu.isa.avx2
    assert cpu.logical_cpus >= 1 and cpu.sources["logical_cpus"] == "os"
    assert cpu.numa_nodes is None and "numa_nodes" in cpu.unknown


def test_json_cli_shape(caps):
    data = json.loads(caps.to_json())
    assert data["schema_version"] == caps.schema_version
    assert set(data) >= {"cpu", "gpus", "profile", "synthetic", "deep"}


def test_cgroup_quota_caps_usable_cpus(monkeypatch):
    from hal.probe.cgroup import CpuQuota

    monkeypatch.setattr(cpu_probe, "read_cpu_quota", lambda: CpuQuota(cpus=0.5, where="cpu.max"))
    cpu = cpu_probe.probe_cpu()
    assert cpu.usable_cpus == 1 and cpu.sources["usable_cpus"] == "cgroup"


def test_unreadable_cgroup_keeps_affinity(monkeypatch):
    def broken():
        raise PermissionError("cgroup fs not readable")

    monkeypatch.setattr(cpu_probe, "read_cpu_quota", broken)
    cpu = cpu_probe.probe_cpu()
    assert cpu.usable_cpus >= 1 and cpu.sources["usable_cpus"] == "os"

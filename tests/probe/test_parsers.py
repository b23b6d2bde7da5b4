"""The pure parsers behind the probe, on sample kernel text."""

import pytest

from hal.probe.cache import cache_scope
from hal.probe.cgroup import parse_cfs_quota, parse_cpu_max, parse_mountinfo, parse_proc_cgroup
from hal.probe.cpu import isa_from_flags, parse_cpuinfo, physical_cores_from_cpuinfo
from hal.probe.cpulist import parse_cpu_list, parse_size
from hal.probe.nvidia import visible_nvml_indices

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize("text, cpus", [
    ("max 100000", None),
    ("max", None),
    ("150000 100000", 1.5),
    ("200000 100000", 2.0),
    ("50000 100000", 0.5),
    ("100000", 1.0),  # period omitted: the kernel default of 100 ms
])
def test_cpu_max(text, cpus):
    assert parse_cpu_max(text) == cpus


@pytest.mark.parametrize("text", ["", "1 2 3", "abc 100000", "0 100000", "100000 0"])
def test_cpu_max_rejects_garbage(text):
    with pytest.raises(ValueError):
        parse_cpu_max(text)


def test_cfs_quota():
    assert parse_cfs_quota("-1\n", "100000\n") is None
    assert parse_cfs_quota("250000", "100000") == 2.5


def test_proc_cgroup_v1_and_v2():
    paths = parse_proc_cgroup("12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/system.slice/x\n")
    assert paths["cpu"] == "/docker/abc" and paths["cpuacct"] == "/docker/abc"
    assert paths[""] == "/system.slice/x"


def test_mountinfo_keeps_cgroup_mounts():
    text = ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
            "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
            "41 31 0:38 /kubepods /sys/fs/cgroup/unified rw shared:9 - cgroup2 cgroup2 rw\n")
    mounts = parse_mountinfo(text)
    assert [(m.fstype, m.mount_point, m.root) for m in mounts] == [
        ("cgroup", "/sys/fs/cgroup/cpu,cpuacct", "/"), ("cgroup2", "/sys/fs/cgroup/unified", "/kubepods")]
    assert "cpu" in mounts[0].super_options


def test_cgroup_quota_walk(tmp_path):
    """The tightest quota between the process's cgroup and the mount root wins."""
    from hal.probe.cgroup import read_cpu_quota

    root = tmp_path / "cg"
    leaf = root / "outer" / "inner"
    leaf.mkdir(parents=True)
    (root / "outer" / "cpu.max").write_text("150000 100000\n")
    (leaf / "cpu.max").write_text("max 100000\n")
    (tmp_path / "cgroup").write_text("0::/outer/inner\n")
    (tmp_path / "mountinfo").write_text(f"41 31 0:38 / {root} rw - cgroup2 cgroup2 rw\n")
    quota = read_cpu_quota(tmp_path / "cgroup", tmp_path / "mountinfo")
    assert quota.cpus == 1.5 and quota.where.endswith("outer/cpu.max")


@pytest.mark.parametrize("text, cpus", [
    ("0", {0}), ("0-3", {0, 1, 2, 3}), ("0,2,4", {0, 2, 4}), ("0-1,8-9\n", {0, 1, 8, 9}), ("", set()),
])
def test_cpu_list(text, cpus):
    assert parse_cpu_list(text) == cpus


def test_cpu_list_backwards_range():
    with pytest.raises(ValueError):
        parse_cpu_list("3-1")


@pytest.mark.parametrize("text, size", [("32K", 32768), ("1024K\n", 1 << 20), ("1M", 1 << 20), ("512", 512)])
def test_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("shared, siblings, expected", [
    ("0", "0", (1, "per_core")),  # no SMT: L1/L2 private
    ("0,56", "0,56", (2, "per_core")),  # SMT pair shares L2: still one core's
    ("0-1", "0-1", (2, "per_core")),
    ("0-55,112-167", "0,112", (112, "shared")),  # L3 of a socket
    ("0-1", "0", (2, "shared")),  # a 2-vCPU VM's L3: two cores, no SMT
    ("", "0,1", (2, "per_core")),  # blank list from a hypervisor
])
def test_cache_scope(shared, siblings, expected):
    assert cache_scope(shared, siblings) == expected


CPUINFO_SAMPLE = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 207
model name\t: INTEL(R) XEON(R) PLATINUM 8592+
stepping\t: 2
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu avx2 fma avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16 \
avx512_fp16 amx_bf16 amx_tile amx_int8

processor\t: 1
physical id\t: 0
core id\t\t: 0

processor\t: 2
physical id\t: 0
core id\t\t: 1
"""


def test_cpuinfo():
    blocks = parse_cpuinfo(CPUINFO_SAMPLE)
    assert len(blocks) == 3
    assert blocks[0]["model"] == "207" and blocks[0]["vendor_id"] == "GenuineIntel"
    assert physical_cores_from_cpuinfo(blocks) == 2
    isa = isa_from_flags(blocks[0]["flags"])
    assert isa.avx512 and isa.avx512_fp16 and isa.amx_tile and isa.amx_bf16 and isa.amx_int8
    assert not isa.amx_fp16 and not isa.avx_vnni


def test_visible_devices_mapping():
    uuids = ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]
    assert visible_nvml_indices(None, uuids) == [0, 1, 2]
    assert visible_nvml_indices("2,0", uuids) == [2, 0]
    assert visible_nvml_indices("GPU-bb", uuids) == [1]
    assert visible_nvml_indices("1,7,0", uuids) == [1]  # CUDA stops at the first bad entry
    assert visible_nvml_indices("", uuids) == []

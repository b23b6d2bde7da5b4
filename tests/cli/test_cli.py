"""The `hal` command as operators use it: exit codes, tables, JSON that loads back."""

import json
import subprocess
import sys

import pytest

from hal.caps import Caps

pytestmark = pytest.mark.cpu


def hal_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "hal.cli.main", *args], capture_output=True,
                          text=True, timeout=600, env=env)


def test_probe_table_ends_with_the_preset_matrix():
    run = hal_cli("probe")
    assert run.returncode == 0, run.stderr
    assert "CPU" in run.stdout
    tail = run.stdout.split("Kernel per model preset")[1]
    for model in ("deepseek-v3", "gpt-oss-20b", "mixtral-8x7b", "kimi-k2", "qwen3-235b-a22b"):
        assert model in tail


def test_probe_json_round_trips(tmp_path):
    run = hal_cli("probe", "--json")
    assert run.returncode == 0, run.stderr
    caps = Caps.from_json(run.stdout)
    assert caps.cpu.logical_cpus and caps.cpu.logical_cpus >= 1
    path = tmp_path / "caps.json"
    path.write_text(run.stdout)
    import os

    again = hal_cli("probe", "--json", env={**os.environ, "HAL_CAPS": str(path)})
    assert Caps.from_json(again.stdout).cpu == caps.cpu


def test_probe_profile_h200_reports_the_hopper_limits():
    run = hal_cli("probe", "--profile", "h200", "--json")
    assert run.returncode == 0, run.stderr
    gpu = json.loads(run.stdout)["gpus"][0]
    assert (gpu["arch"], gpu["warp_size"], gpu["smem_per_block_optin"], gpu["sm_count"]) == \
        ("sm_90", 32, 232448, 132)
    mi300x = json.loads(hal_cli("probe", "--profile", "mi300x", "--json").stdout)
    assert mi300x["gpus"][0]["warp_size"] == 64


def test_profiles_lists_captured_and_synthetic():
    run = hal_cli("profiles", "--json")
    rows = {r["name"]: r for r in json.loads(run.stdout)}
    assert rows["h200"]["kind"] == "captured" and rows["mi300x"]["kind"] == "synthetic"


def test_select_prints_trace_and_plan():
    run = hal_cli("select", "--model", "qwen3-30b-a3b", "--format", "fp8_block128", "--tokens", "4",
                  "--prefer", "reference")
    assert run.returncode == 0, run.stderr
    assert "WIN reference" in run.stdout and "plan at 4 tokens" in run.stdout


def test_select_json_on_a_profile():
    run = hal_cli("select", "--experts", "16", "--top-k", "2", "--hidden", "256", "--intermediate",
                  "128", "--tokens", "3", "--profile", "zen3", "--json")
    assert run.returncode == 0, run.stderr
    payload = json.loads(run.stdout)
    assert payload["decision"]["winner"] and payload["tokens"] == 3


@pytest.mark.parametrize("args, needle", [
    (("select", "--tokens", "4"), "give --model, or all of --experts"),
    (("select", "--model", "mixtral-8x7b", "--tokens", "4", "--top-k", "9"), "top_k=9"),
    (("probe", "--profile", "nope"), "profile='nope'"),
    (("select", "--model", "mixtral-8x7b", "--tokens", "4", "--device", "tpu"), "device='tpu'"),
])
def test_bad_input_is_a_clear_error_not_a_traceback(args, needle):
    run = hal_cli(*args)
    assert run.returncode == 2
    assert needle in run.stderr and "Traceback" not in run.stderr


def test_bench_reference_runs_and_reports_ratios(tmp_path):
    out = tmp_path / "bench.json"
    run = hal_cli("bench", "moe", "--experts", "8", "--top-k", "2", "--hidden", "128",
                  "--intermediate", "64", "--format", "fp8_block128", "--tokens", "1,5",
                  "--backend", "reference", "--only", "--iters", "2", "--warmup", "1", "--out", str(out))
    assert run.returncode == 0, run.stderr
    payload = json.loads(out.read_text())
    assert {r["tokens"] for r in payload["rows"]} == {1, 5}
    assert payload["ceilings"]["copy_gbps"] > 0
    assert all(r["timing"]["median_s"] > 0 for r in payload["rows"])

"""`hal select`, `hal probe`, `hal build` and `python -m hal` where the answer is the slow path, a
device that is not there, or input that names nothing real: said in one line, exit 2, no traceback;
strict mode exits non-zero."""

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.cpu

INT4 = ("--experts", "8", "--top-k", "2", "--hidden", "256", "--intermediate", "128",
        "--format", "int4_g128")
CLEAN = {k: v for k, v in os.environ.items()
         if k not in ("HAL_STRICT", "HAL_CAPS", "HAL_BACKENDS", "HAL_DISABLE_BACKENDS", "HAL_MOE_BACKEND")}


def hal_cli(*args, module="hal.cli.main", **env):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=600, env={**CLEAN, **env})


def assert_one_line_error(run, needle):
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert needle in run.stderr and "Traceback" not in run.stderr
    assert run.stderr.count("\n") == 1, run.stderr


def test_select_decides_without_tokens_and_plans_only_with_them():
    run = hal_cli("select", *INT4, "--profile", "h200")
    assert run.returncode == 0, run.stderr
    assert "WIN" in run.stdout and "plan at" not in run.stdout
    payload = json.loads(hal_cli("select", *INT4, "--profile", "h200", "--json").stdout)
    assert payload["decision"]["winner"] and "plan" not in payload


def test_select_marks_the_slow_path_and_strict_mode_fails():
    run = hal_cli("select", *INT4, "--profile", "zen4")
    assert run.returncode == 0, run.stderr
    assert "[SLOW PATH]" in run.stdout and "WIN reference" in run.stdout
    strict = hal_cli("select", *INT4, "--profile", "zen4", HAL_STRICT="1")
    assert strict.returncode == 2 and "Traceback" not in strict.stderr
    assert "HAL_STRICT=1 refuses the reference oracle" in strict.stderr.splitlines()[0]
    assert "cpu_brgemm" in strict.stderr  # the decision trace follows the line
    flag = hal_cli("select", *INT4, "--profile", "zen4", "--strict", "--json")
    assert flag.returncode == 2 and json.loads(flag.stdout)["winner"] is None


def test_probe_marks_slow_presets_and_strict_mode_exits_one():
    run = hal_cli("probe", "--profile", "zen4")
    assert run.returncode == 0, run.stderr
    slow = [line for line in run.stdout.splitlines() if "reference (slow)" in line]
    assert slow and all("SLOW PATH, nothing faster fits: " in line for line in slow)
    strict = hal_cli("probe", "--profile", "zen4", HAL_STRICT="1")
    assert strict.returncode == 1 and "strict mode refuses it" in strict.stderr


def test_probe_json_has_the_preset_table_and_loads_back(tmp_path):
    run = hal_cli("probe", "--profile", "h200", "--json")
    assert run.returncode == 0, run.stderr
    payload = json.loads(run.stdout)
    rows = payload["selection"]
    assert {"model", "weight_format", "op", "device", "backend", "reason", "slow"} <= set(rows[0])
    assert any(r["device"] == "cuda:0" and r["backend"] == "triton_moe" for r in rows)
    path = tmp_path / "h200.json"
    path.write_text(run.stdout)
    again = hal_cli("probe", "--json", HAL_CAPS=str(path))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["gpus"] == payload["gpus"]


def test_select_on_a_gpu_profile_says_which_device_it_decided_for():
    run = hal_cli("select", "--model", "mixtral-8x7b", "--profile", "h100")
    assert run.returncode == 0, run.stderr
    assert "profile h100 has a GPU" in run.stderr and "deciding for cuda:0" in run.stderr
    assert run.stdout.startswith("op moe on cuda:0 (h100)")
    cpu = hal_cli("select", "--model", "mixtral-8x7b", "--profile", "h100", "--device", "cpu")
    assert cpu.stdout.startswith("op moe on cpu (h100)") and cpu.stderr == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("command", ["select", "build"])
def test_a_gpu_device_without_a_gpu_names_device_and_the_torch_build(command):
    run = hal_cli(command, "--model", "mixtral-8x7b", "--device", "cuda")
    assert_one_line_error(run, f"device='cuda:0': no cuda:0 on this machine: the installed torch "
                               f"{torch.__version__}")


def test_tokens_beyond_one_batch_are_named():
    run = hal_cli("select", "--model", "mixtral-8x7b", "--tokens", "2000000000")
    assert_one_line_error(run, "--tokens=2000000000: expected 0 to")


def test_unknown_backend_names_are_an_error_listing_the_known_ones():
    run = hal_cli("select", "--model", "mixtral-8x7b", HAL_DISABLE_BACKENDS="marlinn")
    assert_one_line_error(run, "HAL_DISABLE_BACKENDS names 'marlinn', not a registered backend: "
                               "known backends are cpu_brgemm, marlin, reference")
    probe = hal_cli("probe", HAL_MOE_BACKEND="tritonmoe")
    assert_one_line_error(probe, "HAL_MOE_BACKEND names 'tritonmoe'")


def test_no_kernel_is_exit_two_with_the_trace_and_no_traceback():
    run = hal_cli("select", "--model", "mixtral-8x7b", "--prefer", "nope")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "'nope' (prefer=) is not a registered backend" in run.stderr.splitlines()[0]
    assert "op moe on cpu" in run.stderr


def test_python_dash_m_hal_runs_the_command():
    run = hal_cli("profiles", "--json", module="hal")
    assert run.returncode == 0, run.stderr
    assert "h200" in {row["name"] for row in json.loads(run.stdout)}


@pytest.mark.parametrize("error", ["build", "no kernel", "value"])
def test_every_expected_failure_is_one_line_and_exit_two(monkeypatch, capsys, error):
    import hal
    from hal.cli import doctor_cmd, main
    from hal.jit import BuildError

    def fail(args):
        if error == "build":
            raise BuildError("the compiler 'c++' cannot run")
        if error == "no kernel":
            hal.select_moe_kernel(hal.MoESpec(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64),
                                  "cpu", caps=hal.caps.Caps(), backends=[])
        raise ValueError("--tokens=-1: expected 0 to 1048576")

    monkeypatch.setattr(doctor_cmd, "run", fail)
    assert main.main(["doctor"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hal doctor: error: ") and "Traceback" not in err
    assert err.count("\n") == 1 or error == "no kernel"

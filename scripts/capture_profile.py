"""Record this machine's capabilities as profiles and check that a plain probe stays fork-safe.

Run once on a GPU host:
    python3 scripts/capture_profile.py --name h200 --cpu-name emerald-rapids --out DIR
Writes DIR/<name>.json (deep probe: GPUs and host CPU), DIR/<cpu-name>.json (the same CPU, no GPUs),
DIR/plain.json (the context-free probe, for comparison) and DIR/summary.json (timings, checks)."""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import attrs

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run from a checkout without installing

FORK_PROBE_SCRIPT = r"""
import os, sys, time
start = time.perf_counter()
from hal.probe import probe
caps = probe()
elapsed = time.perf_counter() - start
import torch
assert not torch.cuda.is_initialized(), "plain probe initialised CUDA"
# torch is now imported too: a second plain probe reads its build facts, still without a context
probe()
assert not torch.cuda.is_initialized(), "plain probe with torch imported initialised CUDA"
read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read_end)
    try:
        value = torch.arange(4, device="cuda").sum().item()
        message, code = f"child used CUDA: sum={value}", 0
    except BaseException as exc:
        message, code = f"child failed: {type(exc).__name__}: {exc}", 1
    os.write(write_end, message.encode())
    os._exit(code)
os.close(write_end)
message = os.read(read_end, 4096).decode()
_, status = os.waitpid(pid, 0)
print(f"plain_probe_s={elapsed:.4f} gpus={len(caps.gpus)} {message}")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _timed_subprocess(code: str) -> tuple:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    return time.perf_counter() - start, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="profile name for the deep capture, e.g. h200")
    parser.add_argument("--cpu-name", help="profile name for the host CPU alone, e.g. emerald-rapids")
    parser.add_argument("--out", required=True, type=Path, help="directory for the JSON files")
    parser.add_argument("--bandwidth", action="store_true", help="also measure host memory bandwidth")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict = {}

    wall, done = _timed_subprocess("import sys; from hal.probe import probe; probe(); "
                                   "print('torch' in sys.modules)")
    summary["plain_probe_process_s"] = round(wall, 3)
    summary["plain_probe_imported_torch"] = done.stdout.strip()
    wall, _ = _timed_subprocess("pass")
    summary["python_startup_s"] = round(wall, 3)
    wall, _ = _timed_subprocess("import torch")
    summary["import_torch_process_s"] = round(wall, 3)

    _, done = _timed_subprocess(FORK_PROBE_SCRIPT)
    summary["fork_check_rc"] = done.returncode
    summary["fork_check"] = (done.stdout + done.stderr).strip()[-2000:]
    print("fork check:", summary["fork_check"], flush=True)

    from hal.probe import probe, with_measured_bandwidth

    start = time.perf_counter()
    plain = probe()
    summary["plain_probe_in_process_s"] = round(time.perf_counter() - start, 4)
    (args.out / "plain.json").write_text(plain.to_json())

    start = time.perf_counter()
    deep = probe(deep=True)
    summary["deep_probe_s"] = round(time.perf_counter() - start, 3)
    if args.bandwidth:
        start = time.perf_counter()
        deep = with_measured_bandwidth(deep)
        summary["bandwidth_s"] = round(time.perf_counter() - start, 3)
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    host = f"{deep.cpu.model_name}, {deep.cpu.usable_cpus} usable CPUs"
    gpus = ", ".join(sorted({g.name or "?" for g in deep.gpus}))
    where = f"{gpus} on {host}" if gpus else f"{host}, no GPU"
    captured = attrs.evolve(deep, profile=args.name, captured_on=f"{where}; {today}")
    (args.out / f"{args.name}.json").write_text(captured.to_json())
    if args.cpu_name:
        cpu_only = attrs.evolve(captured, profile=args.cpu_name, gpus=(), unknown={},
                                captured_on=f"{host} (host of the {args.name} capture); {today}")
        (args.out / f"{args.cpu_name}.json").write_text(cpu_only.to_json())

    for gpu in deep.gpus:
        summary[f"gpu{gpu.index}"] = {k: getattr(gpu, k) for k in (
            "name", "arch", "warp_size", "sm_count", "smem_per_block", "smem_per_block_optin",
            "smem_per_sm", "regs_per_sm", "regs_per_block", "max_threads_per_sm", "l2_bytes",
            "memory_bytes", "mem_bandwidth_gbps", "driver_version", "driver_api_version",
            "runtime_version")}
    summary["cpu"] = {"model": deep.cpu.model_name, "amx": attrs.asdict(deep.cpu.amx),
                      "usable_cpus": deep.cpu.usable_cpus, "physical_cores": deep.cpu.physical_cores,
                      "mem_bandwidth_gbps": deep.cpu.mem_bandwidth_gbps}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Fuzz of the validation contract (hal.testing.fuzz): 1,000 invalid specs, weights and call
arguments must each raise a ValueError naming the argument, 200 valid ones must match the float64
oracle, and nothing may crash. The loop runs in a child Python, so a crash fails this test with the
case it died in."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

FUZZ_SEED = 20240611  # fixed: a failure names its case, and a rerun reproduces it
INVALID, VALID = 1000, 200


def run_fuzz(device: str, prefix=(), timeout: float = 600.0) -> dict:
    cmd = [*prefix, sys.executable, "-m", "hal.testing.fuzz", "--seed", str(FUZZ_SEED),
           "--invalid", str(INVALID), "--valid", str(VALID), "--device", device]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    summary = next((e["summary"] for e in events if "summary" in e), None)
    if summary is None:
        last = next((e for e in reversed(events) if "case" in e), None)
        pytest.fail(f"the fuzz (seed {FUZZ_SEED}) died with exit status {proc.returncode} in case "
                    f"{last}; stderr tail:\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return summary


def _check(summary: dict) -> None:
    assert not summary["failures"], (f"seed {FUZZ_SEED}: {len(summary['failures'])} cases broke the "
                                     "contract:\n" + "\n".join(summary["failures"][:50]))
    assert sum(summary["invalid_by_argument"].values()) == INVALID
    ran = sum(n for name, n in summary["valid_by_backend"].items() if name != "no backend")
    assert ran == VALID, f"only {ran} of {VALID} valid cases found a backend: {summary['valid_by_backend']}"


@pytest.mark.cpu
def test_fuzz_cpu():
    _check(run_fuzz("cpu"))


@pytest.mark.cuda
def test_fuzz_cuda_under_compute_sanitizer():
    """The same fuzz on the GPU under compute-sanitizer memcheck: an out-of-bounds access of any
    kernel it launches fails the run."""
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        pytest.skip("compute-sanitizer is not on PATH")
    _check(run_fuzz("cuda:0", prefix=(sanitizer, "--tool", "memcheck", "--error-exitcode", "86"),
                    timeout=3600.0))


@pytest.mark.cpu
def test_an_argument_is_named_as_a_word():
    from hal.testing.fuzz import names_argument

    assert names_argument("x has dtype torch.float32: expected torch.bfloat16", "x")
    assert names_argument("weights.expert_map holds values in [-1, 9]", "expert_map")
    assert not names_argument("x_scale has shape (2, 3, 1): expected (2, 3, 2)", "x")
    assert not names_argument("expected (M, 128)", "x")
    assert not names_argument("topk_ids must be contiguous", "topk_weights")


@pytest.mark.cpu
def test_the_fuzz_reports_a_missing_check():
    """A mutation the product lets through, or rejects with the wrong error, is reported with its
    case, so the fuzz can fail."""
    from hal.testing.fuzz import Invalid, check_invalid

    def raises(exc):
        def call():
            raise exc
        return call

    assert check_invalid(0, Invalid("named", "x", raises(ValueError("x has dtype float32")))) == ""
    assert "no error" in check_invalid(1, Invalid("accepts anything", "x", lambda: None))
    assert "TypeError instead of ValueError" in check_invalid(2, Invalid("t", "x", raises(TypeError("x"))))
    assert "does not name 'topk_ids'" in check_invalid(
        3, Invalid("names another argument", "topk_ids", raises(ValueError("topk_weights bad"))))

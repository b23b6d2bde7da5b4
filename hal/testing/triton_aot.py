"""Triton kernels compiled ahead of time (Triton compiles for a GPU target the machine need not
have): the kernel source a script hands to `triton.compile`, and running such a script and reading
the JSON it prints last. The script runs in its own process with TRITON_INTERPRET=0: the
interpreter replaces @triton.jit functions, which then cannot be compiled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest


def ast_source(fn, types: dict, constexprs: dict, multiples_of_16: Iterable[str] = ()):
    """`fn` (a @triton.jit function) with the argument types `types` (Triton's "*bf16", "i32", ...)
    and the values `constexprs`, told what a real launch tells Triton: every pointer, and the
    integer arguments named in `multiples_of_16`, divisible by 16 (Triton specializes them so)."""
    from triton.compiler import ASTSource

    names = fn.arg_names
    signature = {n: "constexpr" if n in constexprs else types[n] for n in names}
    aligned = set(multiples_of_16)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
             if n not in constexprs and (types[n].startswith("*") or n in aligned)}
    return ASTSource(fn=fn, signature=signature, attrs=attrs,
                     constexprs={(names.index(k),): v for k, v in constexprs.items()})


def compiled_ahead_of_time(script: Path, target: str, cwd: Path) -> list:
    """The JSON list `script target`, run in `cwd`, prints last; skips where Triton is missing or
    cannot compile ahead of time, fails with the script's error otherwise."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:  # the real cause: no Triton, or a module it needs (numpy)
        pytest.skip(f"Triton cannot be imported: {exc}")
    env = dict(os.environ, TRITON_INTERPRET="0")
    done = subprocess.run([sys.executable, str(script), target], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    if done.returncode and ("GPUTarget" in done.stderr or "ASTSource" in done.stderr):
        pytest.skip(f"this Triton cannot compile ahead of time: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])

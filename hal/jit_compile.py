"""One kernel compile (torch's extension builder, which runs ninja) in a child process of its own
session. Ctrl-C or any exception in the caller stops the whole compile: the caller signals the
child's process group, and ninja relays the signal to the compiler jobs it starts in groups of
their own, so no compiler outlives the build.

Run as `python -m hal.jit_compile` with the keyword arguments of cpp_extension.load as JSON on
stdin; the compiler's output comes back on stdout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hal.kernel_cache import BuildError

STOP_GRACE_S = 10.0  # how long ninja gets to stop its compiler jobs before the group is killed


def run(load_kwargs: dict, what: str) -> str:
    """Compile in a child process; its output, or a BuildError naming `what` with the output."""
    # The child imports this very hal (whatever the working directory holds) and runs where
    # ninja does.
    here = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "hal.jit_compile"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=load_kwargs["build_directory"], env=env)
    try:
        output, _ = proc.communicate(json.dumps(load_kwargs))
    except BaseException:
        _stop(proc)
        raise
    if proc.returncode:
        raise BuildError(f"building {what} failed:\n{output}".rstrip())
    return output


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the child's process group (ninja among it relays it to its jobs), then SIGKILL
    to what is left of the group after the grace time."""
    group = proc.pid
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        proc.poll()
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def main() -> int:
    from torch.utils import cpp_extension

    try:
        cpp_extension.load(**json.load(sys.stdin))
    except Exception as exc:  # the compiler's message travels in the exception
        print(exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

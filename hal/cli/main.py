"""Entry point of the `hal` console script: one subcommand per module in hal/cli/."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

from hal.cli import bench_cmd, build_cmd, cache_cmd, doctor_cmd, probe_cmd, profiles_cmd, select_cmd
from hal.jit import BuildError
from hal.registry import NoKernelError

COMMANDS = (probe_cmd, profiles_cmd, select_cmd, bench_cmd, build_cmd, cache_cmd, doctor_cmd)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="hal", description="moe-hal: what this hardware can do, and "
                                  "which MoE kernel runs best on it.")
    top.add_argument("-v", "--verbose", action="count", default=0,
                     help="log selection (-v: the choice, -vv: every rejection too)")
    sub = top.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return top


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(name)s: %(message)s")
    warnings.showwarning = lambda message, category, *_: print(
        f"hal {args.command}: warning: {message}", file=sys.stderr)  # one line, not a source excerpt
    try:
        code = args.run(args) or 0
        sys.stdout.flush()  # a pipe's buffer is written here, where a closed reader is caught
        return code
    # Expected failures: the reason (and a NoKernelError's decision trace), no traceback.
    except (ValueError, KeyError, NoKernelError, BuildError) as exc:
        print(f"hal {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_left()


def _reader_left() -> int:
    """The reader of our output went away (`hal probe | head`): stop quietly. Python would
    otherwise report the broken pipe again when it flushes stdout at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141  # 128 + SIGPIPE, as a shell reports a command the pipe closed on


if __name__ == "__main__":
    sys.exit(main())

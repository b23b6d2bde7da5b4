"""Every tox env runs on the packages of the interpreter tox was started from.

The README installs moe-hal and its test tools into one environment (a venv, a conda env, a GPU
image's python) and runs tox from it. tox still makes a virtualenv per env to run commands in, but
a virtualenv made from a venv's python sees the base interpreter's packages, not the venv's. This
inline plugin hands each env the starting interpreter's site directories through a .pth file,
processed as site-packages are (editable installs there keep working), so nothing is downloaded
and an offline host runs the same envs as a developer's venv."""

from __future__ import annotations

import logging
import site
import sys

from tox.plugin import impl

PTH_NAME = "_tox_running_interpreter.pth"


def running_site_dirs() -> list:
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return dirs


@impl
def tox_before_run_commands(tox_env) -> None:
    site_packages = getattr(tox_env, "env_site_package_dir", None)
    if site_packages is None:  # not a Python env
        return
    if tuple(tox_env.base_python.version_info[:2]) != sys.version_info[:2]:
        logging.warning("%s runs Python %s.%s, tox runs on %s.%s: it sees only its own packages",
                        tox_env.name, *tox_env.base_python.version_info[:2], *sys.version_info[:2])
        return
    # One line, run by site.py with exec() in a function scope: no comprehension (it cannot see `site`).
    line = f"import site; list(map(site.addsitedir, {running_site_dirs()!r}))\n"
    (site_packages() / PTH_NAME).write_text(line)

"""The import packages of moe-hal, all under the one name `hal`: the repository's backends/ folder
installs as `hal.backends` (so a user's own `backends` package cannot shadow it) and csrc/ as the
resource package `hal.csrc` (hal.jit compiles its sources on first use). pyproject.toml holds
everything else; its package finder cannot map a folder outside the package tree."""

from setuptools import find_namespace_packages, setup

MAPPED = {"hal.backends": "backends", "hal.csrc": "csrc"}


def packages_under(prefix: str, folder: str) -> list:
    found = find_namespace_packages(folder, exclude=["*__pycache__*"])
    return [prefix, *(f"{prefix}.{name}" for name in found)]


setup(packages=[*packages_under("hal", "hal"),
                *(name for prefix, folder in MAPPED.items() for name in packages_under(prefix, folder))],
      package_dir=MAPPED)

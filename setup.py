"""The import packages of moe-hal: hal and backends, and the kernel sources in csrc/, which ship
inside hal as the resource package `hal.csrc` (hal.jit compiles them on first use). pyproject.toml
holds everything else; its package finder cannot map a folder outside the package tree."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["hal", "hal.*", "backends", "backends.*"]), "hal.csrc"],
      package_dir={"hal.csrc": "csrc"})

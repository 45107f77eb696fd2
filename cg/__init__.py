"""``cg``: the command-line tool of pcgroups (cg/main.py is the console script).

Its version is the distribution's (pyproject.toml), read here, so ``cg --version`` imports nothing else."""

from importlib.metadata import version

VERSION = version("pcgroups")

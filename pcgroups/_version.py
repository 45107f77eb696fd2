"""The package's version, from its installed metadata (pyproject.toml is the one place it is written)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pcgroups")
except PackageNotFoundError:  # run from a tree that was never installed
    __version__ = "0+unknown"

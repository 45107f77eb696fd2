"""Module paths from before the subpackages, kept importable as deprecated aliases.

``import pcgroups.scheduler`` still works: it gives a module whose names are those of the modules they went
to, and warns (``DeprecationWarning``) with the path to use. Only this table knows the old paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable
from types import ModuleType

#: old module -> (the modules its names are in now, comma-separated; where to import from instead)
MOVED: dict[str, tuple[str, str]] = {
    "pcgroups.jsapi": ("pcgroups.jetstream._api", "pcgroups or pcgroups.jetstream"),
    "pcgroups.store": ("pcgroups.jetstream._store", "pcgroups.jetstream"),
    "pcgroups.permissions": ("pcgroups.jetstream._permissions", "pcgroups.jetstream"),
    "pcgroups.delivery": ("pcgroups.consume._delivery,pcgroups.consume._msg", "pcgroups or pcgroups.consume"),
    "pcgroups.scheduler": (
        "pcgroups.consume._dispatchers,pcgroups.consume._keys,pcgroups.consume._retry,pcgroups.consume._window",
        "pcgroups or pcgroups.consume",
    ),
    "pcgroups.session": ("pcgroups.consume._session", "pcgroups.consume"),
    "pcgroups.loop": ("pcgroups.consume._loop", "pcgroups or pcgroups.consume"),
    "pcgroups.hooks": ("pcgroups.consume._report,pcgroups.consume._handoff", "pcgroups.consume"),
    "pcgroups.instance": ("pcgroups.consume._instance", "pcgroups or pcgroups.consume"),
    "pcgroups.elastic_instance": ("pcgroups.elastic._instance", "pcgroups or pcgroups.elastic"),
    "pcgroups.sources": ("pcgroups.elastic._sources", "pcgroups or pcgroups.elastic"),
    "pcgroups.intake": ("pcgroups.elastic._intake", "pcgroups.elastic"),
    "pcgroups.membership": ("pcgroups.elastic._membership", "pcgroups or pcgroups.elastic"),
    "pcgroups.sticky": ("pcgroups.elastic._sticky", "pcgroups or pcgroups.elastic"),
    "pcgroups.dispatch": ("pcgroups.pool._dispatcher", "pcgroups.pool"),
    "pcgroups.worker": ("pcgroups.pool._worker", "pcgroups or pcgroups.pool"),
    "pcgroups.status": ("pcgroups.ops._status", "pcgroups.ops"),
    "pcgroups.offsets": ("pcgroups.ops._offsets", "pcgroups.ops"),
    "pcgroups.exporter": ("pcgroups.ops._exporter", "pcgroups.ops"),
    "pcgroups.metrics": ("pcgroups.ops._metrics", "pcgroups.ops"),
    "pcgroups.health": ("pcgroups.ops._health", "pcgroups.ops"),
    "pcgroups.server": ("pcgroups.testing._server", "pcgroups.testing"),
    "pcgroups.cluster": ("pcgroups.testing._cluster", "pcgroups.testing"),
    "pcgroups.checker": ("pcgroups.testing._checker", "pcgroups.testing"),
}


class _Aliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the module it moved to."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        modules, instead = MOVED[spec.name]
        warnings.warn(f"{spec.name} is deprecated: import from {instead}", DeprecationWarning, stacklevel=2)
        if "," not in modules:  # moved whole: the module itself (what is patched on it is patched)
            return importlib.import_module(modules)
        alias = ModuleType(spec.name, f"Deprecated: use {instead}.")
        for name in modules.split(","):
            module = importlib.import_module(name)
            for key, value in vars(module).items():
                if not key.startswith("__"):
                    alias.__dict__.setdefault(key, value)
        return alias

    def exec_module(self, module: ModuleType) -> None:
        """The module it moved to ran already."""


def install() -> None:
    if not any(isinstance(finder, _Aliases) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Aliases())  # before any finder that might still see an old file


def fallback(package: str, module: str) -> Callable[[str], object]:
    """A package's ``__getattr__`` for the names its module of the same path used to have (``pcgroups.pool``
    held the wire contract): they resolve from ``module``, with a warning."""

    def __getattr__(name: str) -> object:
        found = getattr(importlib.import_module(module), name, None)
        if found is None or name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        warnings.warn(f"{package}.{name} is deprecated: it is internal ({module})", DeprecationWarning, stacklevel=2)
        return found

    return __getattr__

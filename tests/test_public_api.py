"""The public package and the layout of the code (no server needed).

- ``pcgroups.__all__`` is the public API: this test pins it, so adding or removing a name is a decision
  made here; every name resolves, entry points come first, ``dir(pcgroups)`` holds nothing else public but
  the subpackages and ``__version__``, and the README's "The API by task" lists each name.
- Every subpackage lists its public names in ``__all__``, and each resolves.
- Module paths from before the subpackages still import, with a ``DeprecationWarning`` naming the new place.
- The import graphs of pcgroups and of cg, counting every import (inside functions and under
  ``TYPE_CHECKING`` too), have no cycle, and no module imports from a layer above its own (``LAYERS``).
  (Importing pcgroups imports none of the CLI's packages: tests/test_cli_structure.py, and
  tests/test_packaging.py in an environment without them.)
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import pcgroups

ROOT = Path(__file__).resolve().parent.parent

PUBLIC = {
    "AutoInstance",
    "ConfigChangedError",
    "ConfigError",
    "ConsumeContext",
    "ConsumerConfig",
    "ConsumerGoneError",
    "ConsumerInstance",
    "ElasticConfig",
    "ElasticSpec",
    "GroupExistsError",
    "InstanceEvent",
    "JetStreamAPIError",
    "JetStreamApi",
    "Layout",
    "Lease",
    "MemberMapping",
    "Msg",
    "NotAMemberError",
    "NotFoundError",
    "PCGroupsError",
    "PartitioningFilter",
    "PermissionDeniedError",
    "RetryPolicy",
    "SourceStream",
    "Start",
    "StaticConfig",
    "SupersededError",
    "WorkerInstance",
    "add_members",
    "add_source",
    "balanced_assignment",
    "create_elastic",
    "create_static",
    "delete_elastic",
    "delete_member_mappings",
    "delete_members",
    "delete_static",
    "elastic_consume",
    "elastic_is_in_membership_and_active",
    "elastic_member_filters",
    "elastic_member_step_down",
    "get_elastic_config",
    "get_elastic_layout",
    "get_static_config",
    "key_by_header",
    "key_by_partitioning",
    "key_by_subject",
    "key_by_tokens",
    "list_elastic_active_members",
    "list_elastic_groups",
    "list_leases",
    "list_static_active_members",
    "list_static_groups",
    "member_partitions",
    "parse_elastic_config",
    "parse_mapping",
    "parse_static_config",
    "partition_filters",
    "partition_of_subject",
    "remove_source",
    "serve_worker",
    "set_member_mappings",
    "static_consume",
    "static_member_filters",
    "static_member_step_down",
    "sticky_assignment",
    "sticky_change",
    "sticky_mappings",
    "transform_destination",
    "validate_name",
    "work_queue_name",
}
ENTRY_POINTS = ["static_consume", "elastic_consume", "serve_worker"]
SUBPACKAGES = {"consume", "deadletters", "elastic", "jetstream", "ops", "pool", "static", "testing"}

#: The layers of each package, lowest first: a module imports only from its own layer or below. A name is a
#: module or a package (then every module in it).
LAYERS: dict[str, list[set[str]]] = {
    "pcgroups": [
        {
            "pcgroups._version",
            "pcgroups._moved",
            "pcgroups.errors",
            "pcgroups.events",
            "pcgroups.config",
            "pcgroups.partitions",
        },  # pure: no I/O
        {
            "pcgroups.jetstream",
            "pcgroups.connect",
            "pcgroups.tracing",
            "pcgroups.testing",
            "pcgroups.deadletters",
        },  # talking to NATS
        {"pcgroups.flavour"},  # what static and elastic groups share
        {"pcgroups.consume"},  # running a member instance
        {"pcgroups.pool"},  # its handlers in workers
        {"pcgroups.static", "pcgroups.elastic"},  # the two kinds of group
        {"pcgroups.ops", "pcgroups.spark"},  # operating them, reading them from Spark
        {"pcgroups"},  # the public API
    ],
    "cg": [
        {
            "cg",
            "cg.errors",
            "cg.help",
            "cg.coercion",
            "cg.plugin",
            "cg.output",
            "cg.runtime",
            "cg.otel",
            "cg.common",
            "cg.demo.script",
            "cg.demo.worker",
        },  # parsing, printing, connecting
        {
            "cg.changes",
            "cg.offsets",
            "cg.deadletters",
            "cg.status",
            "cg.metrics",
            "cg.consume",
            "cg.prompt",
            "cg.tools",
            "cg.demo",
        },  # what the commands do
        {"cg.flavour", "cg.static", "cg.elastic", "cg.demo.command"},  # the commands
        {"cg.app", "cg.main", "cg.__main__"},  # the tree and the console script
    ],
}


def test_all_is_the_public_names_entry_points_first() -> None:
    assert set(pcgroups.__all__) == PUBLIC
    assert len(pcgroups.__all__) == len(PUBLIC)  # each once
    assert pcgroups.__all__[: len(ENTRY_POINTS)] == ENTRY_POINTS


def test_the_namespace_holds_the_public_names_and_the_subpackages() -> None:
    code = "import pcgroups; print(' '.join(n for n in dir(pcgroups) if not n.startswith('_')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    extra = set(done.stdout.split()) - PUBLIC
    # the subpackages and public modules the names come from, nothing else (no stray import)
    assert extra <= SUBPACKAGES | {"config", "connect", "errors", "events", "flavour", "partitions", "tracing"}, extra
    assert isinstance(pcgroups.__version__, str) and pcgroups.__version__
    for name in ("annotations", "importlib", "Any", "TYPE_CHECKING", "typing", "drop_members"):
        assert not hasattr(pcgroups, name), name


def test_the_version_is_the_distributions() -> None:
    from importlib.metadata import version

    import cg

    assert pcgroups.__version__ == version("pcgroups") == cg.VERSION


def test_the_readme_lists_every_public_name_by_task() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### The API by task", 1)[1].split("\n#", 1)[0]
    named = set(re.findall(r"`(\w+)", section))
    assert sorted(PUBLIC - named) == []


def test_every_public_name_resolves() -> None:
    assert [name for name in pcgroups.__all__ if getattr(pcgroups, name, None) is None] == []
    namespace: dict[str, object] = {}
    exec("from pcgroups import *", namespace)
    assert {n for n in namespace if n != "__builtins__"} == PUBLIC


@pytest.mark.parametrize("package", sorted(SUBPACKAGES))
def test_each_subpackage_lists_what_it_gives(package: str) -> None:
    module = importlib.import_module(f"pcgroups.{package}")
    names = module.__all__
    assert names and len(names) == len(set(names))
    assert [n for n in names if getattr(module, n, None) is None] == []


@pytest.mark.parametrize(
    ("old", "name", "now"),
    [
        ("pcgroups.scheduler", "RetryPolicy", "pcgroups.consume"),
        ("pcgroups.delivery", "Msg", "pcgroups.consume"),
        ("pcgroups.jsapi", "JetStreamApi", "pcgroups.jetstream"),
        ("pcgroups.server", "EmbeddedServer", "pcgroups.testing"),
        ("pcgroups.metrics", "InstanceMetrics", "pcgroups.ops"),
    ],
)
def test_an_old_module_path_still_imports_and_says_where_to_go(old: str, name: str, now: str) -> None:
    code = (
        f"import warnings; warnings.simplefilter('error')\n"
        f"try:\n    from {old} import {name}\nexcept DeprecationWarning as e:\n    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert old in done.stdout and now in done.stdout
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        moved = importlib.import_module(old)
    assert getattr(moved, name) is getattr(importlib.import_module(now), name)


def test_a_name_that_left_a_package_module_still_resolves_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="pcgroups.pool.Heartbeat"):
        from pcgroups.pool import Heartbeat  # the wire contract was pcgroups/pool.py
    assert Heartbeat.__module__ == "pcgroups.pool._wire"
    with pytest.raises(AttributeError):
        pcgroups.pool.no_such_name  # noqa: B018 - the lookup is the test


# --- the import graphs ---------------------------------------------------------------------------------------


def _modules(package: str) -> dict[str, Path]:
    base = ROOT / package.replace(".", "/")
    out = {}
    for path in base.rglob("*.py"):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([package, *parts])] = path
    return out


def _module_imports(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` -> the modules of the same package it imports anywhere in it (module level,
    in functions, under ``TYPE_CHECKING``)."""
    modules = _modules(package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _imported(node, here):
                while target and target not in modules:  # "from . import x": x may be a module or a name
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def _imported(node: ast.AST, here: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = here
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            module = f"{base}.{node.module}" if node.module else base
        else:
            module = node.module or ""
        return [f"{module}.{alias.name}" for alias in node.names]
    return []


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """A cycle of the graph as the list of its modules (first repeated last), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        path.pop()
        return []

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return []


def _layer_of(module: str, layers: list[set[str]]) -> int:
    """The layer of the longest name in ``layers`` that is ``module`` or a package holding it."""
    best, found = -1, -1
    for index, names in enumerate(layers):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, found = len(name), index
    return found


def _upward(package: str) -> list[str]:
    layers = LAYERS[package]
    graph = _module_imports(package)
    unplaced = sorted(m for m in graph if _layer_of(m, layers) < 0)
    assert unplaced == [], f"modules in no layer of {package}: {unplaced}"
    return sorted(
        f"{m} -> {t}" for m, targets in graph.items() for t in targets if _layer_of(t, layers) > _layer_of(m, layers)
    )


def test_the_graph_builder_finds_a_cycle_and_counts_every_import() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
    tree = ast.parse("import typing\nif typing.TYPE_CHECKING:\n    import b\ndef f():\n    from . import c\n")
    assert [n for node in ast.walk(tree) for n in _imported(node, "p")] == ["typing", "b", "p.c"]


def test_the_graph_sees_relative_and_absolute_imports() -> None:
    graph = _module_imports("pcgroups")
    assert "pcgroups.config" in graph["pcgroups.flavour"]  # from .config import ...
    assert "pcgroups.partitions" in graph["pcgroups.spark._nats"]  # from ..partitions import ...
    assert "pcgroups.consume._options" in graph["pcgroups.consume._session"]  # from ._options import ...
    assert _layer_of("pcgroups.consume._session", LAYERS["pcgroups"]) == 3
    assert _layer_of("pcgroups", LAYERS["pcgroups"]) == 7


@pytest.mark.parametrize("package", ["pcgroups", "cg"])
def test_no_import_cycle(package: str) -> None:
    assert _cycle(_module_imports(package)) == []


@pytest.mark.parametrize("package", ["pcgroups", "cg"])
def test_no_import_runs_from_a_lower_layer_up(package: str) -> None:
    assert _upward(package) == []

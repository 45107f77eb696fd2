"""The public package: its exact names, a lean import, and no import cycles (no server needed).

- ``pcgroups.__all__`` is the public API: this test pins it, so adding or removing a name is a
  decision made here, and every name in it resolves; ``dir(pcgroups)`` shows those names only, and the
  README's "The API by task" lists each of them.
- (Importing pcgroups imports none of the CLI's packages: tests/test_cli_structure.py, and
  tests/test_packaging.py in an environment without them.)
- Among the modules of pcgroups, and among those of cg, module-level imports form no cycle
  (an import inside a function runs later and is allowed: the CLI defers its imports that way).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pcgroups

ROOT = Path(__file__).resolve().parent.parent

PUBLIC = [
    "AutoInstance", "ConfigChangedError", "ConfigError", "ConsumeContext", "ConsumerConfig", "ConsumerGoneError",
    "ConsumerInstance",
    "ElasticConfig", "ElasticSpec", "GroupExistsError", "InstanceEvent", "JetStreamAPIError", "JetStreamApi",
    "Layout", "Lease", "MemberMapping", "Msg", "NotAMemberError", "NotFoundError", "PCGroupsError",
    "PartitioningFilter", "PermissionDeniedError", "RetryPolicy", "SourceStream", "Start", "StaticConfig", "SupersededError",
    "WorkerInstance", "add_members", "add_source", "balanced_assignment", "create_elastic", "create_static", "delete_elastic",
    "delete_member_mappings", "delete_members", "delete_static", "elastic_consume",
    "elastic_is_in_membership_and_active", "elastic_member_filters", "elastic_member_step_down",
    "get_elastic_config", "get_elastic_layout", "get_static_config", "key_by_header", "key_by_partitioning",
    "key_by_subject", "key_by_tokens", "list_elastic_active_members", "list_elastic_groups", "list_leases",
    "list_static_active_members", "list_static_groups", "member_partitions", "parse_elastic_config",
    "parse_mapping", "parse_static_config", "partition_filters", "partition_of_subject", "remove_source",
    "serve_worker", "set_member_mappings", "static_consume", "static_member_filters", "static_member_step_down",
    "sticky_assignment", "sticky_change", "sticky_mappings", "transform_destination", "validate_name",
    "work_queue_name",
]


def test_all_is_the_pinned_list_sorted() -> None:
    assert pcgroups.__all__ == PUBLIC
    assert sorted(pcgroups._MODULE_OF) == PUBLIC   # the lazy import table names the same names
    assert PUBLIC == sorted(PUBLIC)


def test_the_namespace_is_the_public_names() -> None:
    """``dir(pcgroups)`` lists the public API (and ``__version__``); the module's own imports and the
    names a type checker sees are not attributes of it."""
    code = "import pcgroups; print(' '.join(dir(pcgroups)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == sorted([*PUBLIC, "__version__"])
    assert dir(pcgroups) == sorted([*PUBLIC, "__version__"])   # also after its submodules were imported
    for name in ("annotations", "importlib", "Any", "TYPE_CHECKING", "typing", "drop_members"):
        assert not hasattr(pcgroups, name), name


def test_the_readme_lists_every_public_name_by_task() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### The API by task", 1)[1].split("\n#", 1)[0]
    named = set(re.findall(r"`(\w+)", section))
    assert [name for name in PUBLIC if name not in named] == []


def test_the_graph_skips_what_only_type_checkers_see() -> None:
    tree = ast.parse("import typing as t\nif not t.TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
                     "if TYPE_CHECKING:\n    import c\nelse:\n    import d\n")
    assert [n for node in _top_level(tree.body) for n in _imported(node, "")] == ["typing", "a", "d"]


def test_every_public_name_resolves() -> None:
    missing = [name for name in pcgroups.__all__ if getattr(pcgroups, name, None) is None]
    assert missing == []
    namespace: dict[str, object] = {}
    exec("from pcgroups import *", namespace)  # noqa: S102 - the star import is what the test checks
    assert sorted(n for n in namespace if n != "__builtins__") == PUBLIC


def _module_imports(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` (dotted) -> the modules of the same package it imports at module level."""
    base = ROOT / package.replace(".", "/")
    modules = {_dotted(package, path, base): path for path in base.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _top_level(tree.body):
            for target in _imported(node, here):
                while target and target not in modules:   # "from . import x": x may be a module or a name
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def _dotted(package: str, path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING`` (under any module alias)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements that run on import: the module body, into if/try blocks, but not into functions,
    classes' methods or what only type checkers see (``if TYPE_CHECKING:``, the ``else`` of ``if not
    TYPE_CHECKING:``)."""
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If):
            test = node.test
            if _is_type_checking(test):
                out += _top_level(node.orelse)
            elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _is_type_checking(test.operand):
                out += _top_level(node.body)
            else:
                out += _top_level(node.body) + _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            out += _top_level(node.body) + _top_level(node.orelse) + _top_level(node.finalbody)
            for handler in node.handlers:
                out += _top_level(handler.body)
        else:
            out.append(node)
    return out


def _imported(node: ast.stmt, here: str) -> list[str]:
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
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
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


def test_the_graph_builder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_the_graph_sees_relative_and_absolute_imports() -> None:
    graph = _module_imports("pcgroups")
    assert "pcgroups.config" in graph["pcgroups.flavour"]        # from .config import ...
    assert "pcgroups.partitions" in graph["pcgroups.spark._nats"]  # from ..partitions import ...
    assert "pcgroups.flavour" in graph["pcgroups.static"]        # from . import flavour


def test_no_import_cycle_among_pcgroups_modules() -> None:
    assert _cycle(_module_imports("pcgroups")) == []


def test_no_import_cycle_among_cg_modules() -> None:
    assert _cycle(_module_imports("cg")) == []

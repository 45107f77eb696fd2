"""How ``cg`` is put together, checked without a server where none is needed:

- no import cycle among the ``cg`` modules (function-level imports count: they are dependencies too);
- the library imports nothing of the CLI stack (Typer, rich, prompt-toolkit, ``cg``);
- each start-up path imports only what it needs: ``cg --version`` nothing, ``cg --fisk-introspect``
  and ``--help`` neither nats-py nor the library, an admin command neither rich, prompt-toolkit, pydantic
  nor the other commands' modules (start-up *times* are benchmark P8's, not a test's);
- the tree's cheap coercion (cg/coercion.py) is installed and gives exactly what Typer's own gives.
"""

from __future__ import annotations

import ast
import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import cg_env

ROOT = Path(__file__).resolve().parent.parent
CLI_STACK = ("typer", "rich", "prompt_toolkit", "click", "pydantic", "cg")


def _cg_imports(path: Path) -> set[str]:
    """The ``cg`` modules a module of the package imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                base = node.module
                names = [base] if base else [a.name for a in node.names]
            elif node.module and (node.module == "cg" or node.module.startswith("cg.")):
                names = [node.module.removeprefix("cg").removeprefix(".") or a.name for a in node.names]
            else:
                continue
            found.update(n.split(".")[0] for n in names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("cg."))
    return found


def test_no_import_cycles_among_cg_modules():
    modules = {p.stem: p for p in (ROOT / "cg").glob("*.py") if p.stem != "__init__"}
    graph = {name: _cg_imports(path) & set(modules) for name, path in modules.items()}
    assert graph["prompt"] and "main" not in graph["prompt"], graph["prompt"]  # the old main <-> prompt cycle
    cycles = []

    def visit(name: str, path: list[str]) -> None:
        for dep in sorted(graph[name]):
            if dep in path:
                cycles.append(" -> ".join([*path[path.index(dep) :], dep]))
            elif dep not in done:
                visit(dep, [*path, dep])
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    assert not cycles, cycles


def _modules_after(code: str, env: dict[str, str] | None = None) -> set[str]:
    """The modules a fresh interpreter holds after running ``code`` (which must not print)."""
    script = code + "\nimport json, sys\nsys.stderr.write(json.dumps(sorted(sys.modules)))\n"
    p = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env or cg_env()
    )
    assert p.returncode == 0, p.stderr
    return set(json.loads(p.stderr.splitlines()[-1]))


def _top(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_the_library_imports_nothing_of_the_cli_stack():
    code = (
        "import importlib, importlib.util, pkgutil, pcgroups\n"
        "for m in pkgutil.walk_packages(pcgroups.__path__, 'pcgroups.'):\n"
        "    if m.name != 'pcgroups.spark.source' or importlib.util.find_spec('pyspark'):  # the spark extra\n"
        "        importlib.import_module(m.name)\n"
    )
    modules = _modules_after(code)
    assert {"pcgroups.static", "pcgroups.elastic", "pcgroups.ops._status", "pcgroups.spark"} <= modules
    assert not _top(modules) & set(CLI_STACK), sorted(_top(modules) & set(CLI_STACK))


def _cg_modules(*argv: str) -> set[str]:
    code = (
        "import contextlib, io\nfrom cg.main import main\n"
        f"with contextlib.redirect_stdout(io.StringIO()):\n    code = main({list(argv)!r})\n"
        "assert code == 0, code\n"
    )
    return _modules_after(code)


def test_version_imports_nothing():
    modules = _cg_modules("--version")
    assert not _top(modules) & {"typer", "rich", "nats", "pcgroups", "asyncio", "pydantic"}
    assert {m for m in modules if m.startswith("cg.")} <= {"cg.main", "cg.common", "cg.errors"}


@pytest.mark.parametrize(
    "argv", [["--fisk-introspect"], ["--help"], ["static", "ls", "--help"], ["elastic", "create", "-h"]]
)
def test_the_model_and_help_need_neither_nats_nor_the_library(argv):
    modules = _cg_modules(*argv)
    assert not _top(modules) & {"nats", "pcgroups", "prompt_toolkit", "pydantic"}, argv
    assert "cg.prompt" not in modules and "cg.status" not in modules and "cg.consume" not in modules


async def test_an_admin_command_imports_only_its_own_path(nats_server, js, uniq):
    from tests.helpers.cli import make_stream

    await make_stream(js, uniq)
    modules = await asyncio.to_thread(_cg_modules, "--server", nats_server.url, "static", "ls", uniq)
    assert {"cg.static", "pcgroups.static", "nats"} <= modules
    assert not _top(modules) & {"rich", "prompt_toolkit", "pydantic", "pyspark"}, sorted(_top(modules))
    assert not modules & {
        "cg.elastic",
        "cg.demo",
        "cg.prompt",
        "cg.status",
        "cg.tools",
        "cg.consume",
        "pcgroups.ops._status",
        "pcgroups.testing._checker",
        "pcgroups.testing._server",
    }


# ---------------------------------------------------------------- cheap coercion


def test_every_plain_parameter_gets_the_cheap_coercion():
    from cg import coercion
    from cg.app import build

    root = build()
    assert coercion.installed(root)
    for name in ("static", "elastic", "tools"):
        group = root.get_command(None, name)
        for command in group.commands.values():
            for sub in [command, *getattr(command, "commands", {}).values()]:
                if sub.params:
                    assert coercion.installed(sub), (name, sub.name)


VALUES = {
    str: ["x", "", "a b", "-", "ü", 5, None],
    int: ["5", "+5", "-5", "007", "0", "99999999999999999999999", " 5", "1_000", "2.5", "1e3", "ten", "٣", "", 7, True],
    float: ["5", "2.5", "-1e3", ".5", " 5", "x", "", 2.5, 3],
    bool: [True, False, "true", "no", 1],
    list[str]: [("a", "b"), (), ["x"], ("a", 1), "ab"],
}


def _argument(annotation):
    """A Typer command with one argument of ``annotation``, built as cg's are; (command, argument)."""
    import typer
    import typer.main

    app = typer.Typer(add_completion=False)

    def command(value) -> None:
        pass

    command.__annotations__["value"] = annotation  # this module's annotations are strings
    app.command()(command)

    command = typer.main.get_command(app)
    return command, command.params[0]


@pytest.mark.parametrize("annotation", list(VALUES), ids=lambda a: getattr(a, "__name__", str(a)))
def test_the_cheap_coercion_gives_what_typers_gives(annotation):
    """For every value: the same result, or the same error message; a number neither reads is an error in
    the user's words."""
    from typer._click import Context
    from typer._click.exceptions import BadParameter
    from typer._coercion import build_runtime_param

    from cg import coercion

    command, param = _argument(annotation)
    typers = build_runtime_param(param.type_descriptor)
    ours = coercion.PlainCoercion(parameter_info=param.type_descriptor.parameter_info, annotation=annotation)
    ctx = Context(command)

    def outcome(runtime, value):
        try:
            result = runtime.coerce(value, param=param, ctx=ctx)
            return "ok", type(result), result
        except BadParameter as e:
            return "error", e.format_message()

    for value in VALUES[annotation]:
        theirs = outcome(typers, value)
        if theirs[0] == "error" and annotation in (int, float) and isinstance(value, str):
            what = "a whole number" if annotation is int else "a number"
            theirs = ("error", f"Invalid value for 'value': {value!r} is not {what}")
        assert outcome(ours, value) == theirs, (annotation, value)


def _pages(command, ctx, path: list[str]):
    """Every command of the tree under ``command``, with its help page: (path, page)."""
    yield path, command.get_help(ctx)
    for name in getattr(command, "list_commands", lambda _ctx: [])(ctx):
        sub = command.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            yield from _pages(sub, type(ctx)(sub, info_name=name, parent=ctx), [*path, name])


def test_every_help_page_fits_80_columns(monkeypatch):
    """Every command's ``--help``, the dead letters' included, in a wide terminal and a pipe alike: no line is wider
    than 80 columns (what a pager or a narrow terminal shows without wrapping mid-word)."""
    from typer._click import Context

    from cg.app import build

    for columns in ("200", "80"):
        monkeypatch.setenv("COLUMNS", columns)
        root = build()
        pages = list(_pages(root, Context(root, info_name="cg"), ["cg"]))
        assert any(path[-2:] == ["dead-letters", "replay"] for path, _ in pages), [p for p, _ in pages]
        assert len(pages) > 40
        wide = [(" ".join(path), line) for path, page in pages for line in page.splitlines() if len(line) > 80]
        assert wide == [], wide

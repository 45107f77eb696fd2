"""The repository stands on its own: no tracked file points outside it.

A clone on another machine has none of the development workspace around it, so a tracked file that
names a path there (the checkout's parent directory, a sibling reference folder) breaks on that
machine or leaves its reader with a dead link. Citations of the project's own tracker or of an
outside specification go stale the same way; docs/DESIGN.md is the contract the code cites.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Built from parts so that this file does not match itself.
_FORBIDDEN = [
    ("a sibling reference folder", re.compile(re.escape("../" + "shared"))),
    ("a spec section", re.compile(r"\b(?:SPEC|ref|ref plugin)" + r" §")),
    ("a tracker issue number", re.compile(r"\b[Ii]ssue" + r" #?\d+\b")),
]

# Absolute paths into the development machine's workspace or root's home (a reader's machine has neither).
_ABSOLUTE = re.compile(r"(?<![\w.~])/(?:work|root)/")


# Directories every machine has, where a checkout may sit (a clone in /tmp): examples naming a file there
# (``--json /tmp/b.json``) are the reader's own paths, not the workspace around the checkout.
_SHARED_DIRECTORIES = {Path(p).resolve() for p in ("/tmp", "/var/tmp", tempfile.gettempdir(), Path.home())}


def _tracked_text_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = []
    for name in out.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file():
            files.append(path)
    return files


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:4096]:
        return None
    return data.decode("utf-8", errors="replace")


def _offending_lines(patterns: list[tuple[str, re.Pattern[str]]]) -> list[str]:
    bad = []
    for path in _tracked_text_files():
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for what, pattern in patterns:
                if pattern.search(line):
                    bad.append(f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()[:120]}")
    return bad


def test_no_tracked_file_names_a_path_outside_the_repository():
    outside = [("an absolute workspace path", _ABSOLUTE), _FORBIDDEN[0]]
    if len(ROOT.parent.parts) > 1 and ROOT.parent not in _SHARED_DIRECTORIES:  # the checkout's surroundings
        outside.append(("the checkout's parent directory", re.compile(re.escape(str(ROOT.parent) + "/"))))
    bad = _offending_lines(outside)
    assert not bad, "tracked files name paths outside the repository:\n" + "\n".join(bad)


def test_no_tracked_file_cites_the_tracker_or_an_outside_spec():
    bad = _offending_lines(_FORBIDDEN[1:])
    assert not bad, "cite docs/DESIGN.md instead:\n" + "\n".join(bad)


def test_the_check_finds_what_it_looks_for():
    """The patterns match the lines they exist to catch (a check that cannot fail is no check)."""
    samples = {
        "a sibling reference folder": "see " + "../" + "shared/SPEC.md",
        "a spec section": "(ref" + " §1.6)",
        "a tracker issue number": "asked for by " + "issue" + " 7",
    }
    for what, pattern in _FORBIDDEN:
        assert pattern.search(samples[what]), what
    assert not _FORBIDDEN[2][1].search("the issue of ordering")
    assert _ABSOLUTE.search("open " + "/wo" + "rk/main/README.md") and not _ABSOLUTE.search("nats://h1:4222/")


def test_no_test_module_imports_another() -> None:
    """What tests share is a fixture in tests/conftest.py or a helper in tests/helpers/, never a test module."""
    import ast

    offenders = []
    for path in sorted((Path(__file__).parent).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                leaf = node.module.rsplit(".", 1)[-1]
                if leaf.startswith("test_") and (node.level or node.module.startswith("tests.")):
                    offenders.append(f"{path.name}: from {'.' * node.level}{node.module}")
    assert offenders == []

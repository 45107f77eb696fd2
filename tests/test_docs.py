"""The API reference (docs/api): ./scripts/test builds it with warnings as errors; here, that the build
also fails when a public name of ``pcgroups`` is left out of it (its conf.py's check). Needs the ``docs``
extra (Sphinx); no server."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="Sphinx not installed (pip install -e '.[docs]')")

DOCS = Path(__file__).resolve().parent.parent / "docs" / "api"


def _build(source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "dummy", str(source), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_public_name_left_out_of_the_reference_fails_its_build(tmp_path):
    source = tmp_path / "api"
    shutil.copytree(DOCS, source)
    index = source / "index.rst"
    text = index.read_text()
    assert ".. autofunction:: pcgroups.work_queue_name\n" in text
    index.write_text(text.replace(".. autofunction:: pcgroups.work_queue_name\n", ""))
    done = _build(source, tmp_path / "html")
    assert done.returncode != 0
    assert "public names missing from the API reference: work_queue_name" in done.stderr, done.stderr

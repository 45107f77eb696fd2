"""The runnable examples that need no extra (examples/*.py), run as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_partition_state_survives_an_add_and_a_drop():
    """Per-partition totals kept with on_assigned/on_revoked: every key's total right after m2 is added
    and m1 dropped, the hooks called in the order the rebalances need."""
    done = subprocess.run(
        [sys.executable, "examples/partition_state.py", "--messages", "300"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "PASS"
    assert "keys with a wrong total: 0; messages out of order: 0" in lines[-2]
    order = [line for line in lines if line.startswith("[")]
    assert order == [
        "[m1] assigned [0, 1, 2, 3]: state loaded",
        "[m1] revoked [2, 3]: state stored",
        "[m2] assigned [2, 3]: state loaded",
        "[m1] revoked [0, 1]: state stored",
        "[m2] assigned [0, 1]: state loaded",
        "[m2] revoked [0, 1, 2, 3]: state stored",
    ], done.stdout


def test_the_examples_and_the_readme_library_example_pass_mypy_strict(tmp_path):
    """What a user copies type-checks as strictly as mypy can: ``mypy --strict`` run in this tree, as a user
    runs it here, on examples/*.py and the README's library example. Here mypy follows their imports into
    pcgroups' own source, so the library passes ``--strict`` too (and ``pyproject.toml`` keeps it so)."""
    code = (ROOT / "README.md").read_text().split("## The library\n", 1)[1].split("```python\n", 1)[1]
    (tmp_path / "readme_library.py").write_text(code.split("```", 1)[0])
    files = [
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("*.py")),
        str(tmp_path / "readme_library.py"),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # this tree: the cwd
    assert done.returncode == 0 and done.stdout.startswith("Success: no issues found in 5 source files"), (
        done.stdout + done.stderr
    )

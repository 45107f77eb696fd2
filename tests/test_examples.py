"""The runnable examples that need no extra (examples/*.py), run as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_partition_state_survives_an_add_and_a_drop():
    """Per-partition totals kept with on_assigned/on_revoked: every key's total right after m2 is added
    and m1 dropped, the hooks called in the order the rebalances need."""
    done = subprocess.run([sys.executable, "examples/partition_state.py", "--messages", "300"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "PASS"
    assert "keys with a wrong total: 0; messages out of order: 0" in lines[-2]
    order = [line for line in lines if line.startswith("[")]
    assert order == ["[m1] assigned [0, 1, 2, 3]: state loaded",
                     "[m1] revoked [2, 3]: state stored", "[m2] assigned [2, 3]: state loaded",
                     "[m1] revoked [0, 1]: state stored", "[m2] assigned [0, 1]: state loaded",
                     "[m2] revoked [0, 1, 2, 3]: state stored"], done.stdout

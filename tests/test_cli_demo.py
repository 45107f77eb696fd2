"""``cg demo``: a short run does every phase and passes its checks; Ctrl-C leaves no process behind."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from cg.demo.command import demo

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
async def test_a_short_demo_runs_every_phase_and_passes():
    buf = io.StringIO()
    started = time.monotonic()
    result = await demo(duration=12, console=Console(file=buf, width=80), live=False)
    took = time.monotonic() - started
    out = buf.getvalue()
    assert result.exit_code == 0, out
    assert "PASS: every check passed" in out
    assert took < 25, f"the 12 s demo took {took:.1f}s"
    assert result.elapsed <= 12 + 1, result.elapsed  # --duration is the longest it runs
    assert not [line for line in out.splitlines() if line.endswith(" ")], out  # no padding into a log
    for flavour in ("static", "elastic"):
        report = result.reports[flavour]
        assert report.ok and report.lost == 0 and report.overlaps == 0 and report.order_violations == 0
        assert result.published[flavour] > 300 and report.processed == result.published[flavour]
    kinds = [t.what for t in result.takeovers]
    assert kinds == ["static m1", "elastic e2", "add e3", "drop e1"]
    for t in result.takeovers:
        assert t.after is not None and t.by, t
    kill_static, kill_elastic = result.takeovers[:2]
    assert kill_static.by.startswith("m1-") and kill_static.by != kill_static.victim
    assert kill_elastic.by.startswith("e2-") and kill_elastic.by != kill_elastic.victim
    assert kill_static.after < 4 and kill_elastic.after < 4  # about PinnedTTL (1 s here)
    # every partition that moved, not only the added member's: e1 e2 -> e1 e2 e3 -> e2 e3 over 6 partitions
    add, drop = result.takeovers[2:]
    assert [(m.partition, m.src, m.dst) for m in add.moves] == [(2, "e1", "e2"), (4, "e2", "e3"), (5, "e2", "e3")]
    assert [(m.partition, m.src, m.dst) for m in drop.moves] == [(0, "e1", "e2"), (1, "e1", "e2"), (3, "e2", "e3")]
    for m in add.moves + drop.moves:
        assert m.after is not None and m.by.startswith(m.dst + "-"), m
    assert "partitions moved: 2 e1 -> e2; 4 5 e2 -> e3" in out
    # the summary explains its counts, fits 80 columns with its verdicts whole
    assert "handler calls = processed + redelivered" in out
    assert all(len(line) <= 80 for line in out.splitlines() if not line.startswith("["))
    # progress lines, not a live view, when the console is not a terminal
    assert "SIGKILL m1-" in out and "took over m1" in out and "\x1b[" not in out


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_ctrl_c_stops_every_process_it_started():
    code = "import typer; from cg.demo.command import demo_command; typer.run(demo_command)"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--duration", "30s"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "publishing" in line:
                break
        assert any("publishing" in line for line in lines), "".join(lines)
        children = _children(proc.pid)
        assert len(children) >= 8, children  # nats-server and 7 instances
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=20)
        assert proc.returncode == 130, (rest, err)
        assert "interrupted" in err and "Traceback" not in err
        deadline = time.monotonic() + 5
        while any(_alive(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [c for c in children if _alive(c)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_ctrl_c_through_cg_says_interrupted_once_and_exits_130():
    """Through the ``cg`` entry point: the demo's own line and nothing more (no ``cg: error``), status 130."""
    from tests.helpers.cli import cg_argv, cg_env

    proc = subprocess.Popen(
        cg_argv("demo", "--duration", "30s"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cg_env(),
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line or "publishing" in line:
                break
        assert line and "publishing" in line
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 130, err
        assert err.splitlines() == ["cg demo: interrupted (every process it started was stopped)"], err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

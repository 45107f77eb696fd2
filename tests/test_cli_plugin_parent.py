"""cg run as a nats CLI plugin ends when the ``nats`` process that started it is gone (cg/main.py, item 4).

nats runs a plugin as its child and passes it nothing else; a supervisor's SIGTERM reaches only nats.
Here a real parent process whose executable is named ``nats`` (a link to Python) starts ``cg elastic
consume`` as nats starts a plugin (stdout and stderr shared) and is killed with SIGTERM while a
handler runs: cg finishes that handler, acks it and exits 0; so it does after a Ctrl-C that reaches
both. The same cg under a parent of another name outlives it, as a program left running in the
background does. A harness process, a child
subreaper (Linux), adopts cg when its parent dies, so that cg's exit status can be read.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from pcgroups import add_members, create_elastic
from tests.helpers.cli import cg_argv, cg_env, make_stream

from .helpers.support import wait_for

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the harness adopts cg with PR_SET_CHILD_SUBREAPER")

# The parent: starts its arguments as a child (as nats starts a plugin), writes the child's pid, waits.
PARENT = (
    "import subprocess, sys; p = subprocess.Popen(sys.argv[2:]); open(sys.argv[1], 'w').write(str(p.pid)); p.wait()"
)

# The harness: starts the parent in a process group of its own; when told (a line on stdin) sends SIGTERM to
# the parent ("term": a supervisor) or SIGINT to the group ("int": Ctrl-C in a terminal), then reports cg's
# end within `wait` seconds as one JSON line: its exit status, or null if it still runs (it is then killed).
HARNESS = r"""
import ctypes, json, os, signal, subprocess, sys, time
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0   # PR_SET_CHILD_SUBREAPER
parent_exe, parent_code, pidfile, out, err, how, wait, *cg = sys.argv[1:]
with open(out, "w") as o, open(err, "w") as e:
    parent = subprocess.Popen([parent_exe, "-c", parent_code, pidfile, *cg], stdin=subprocess.DEVNULL,
                              stdout=o, stderr=e, start_new_session=True)
sys.stdin.readline()
if how == "term":
    parent.send_signal(signal.SIGTERM)
else:
    os.killpg(parent.pid, signal.SIGINT)
parent.wait()
pid, t0 = int(open(pidfile).read()), time.monotonic()
while time.monotonic() - t0 < float(wait):
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print(json.dumps({"code": os.waitstatus_to_exitcode(status), "seconds": time.monotonic() - t0}))
        sys.exit()
    time.sleep(0.05)
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
print(json.dumps({"code": None}))
"""


@pytest.mark.parametrize(
    "parent_name,how,ends",
    [("nats", "term", True), ("supervisor", "term", False), ("nats", "int", True)],
    ids=["nats-sigterm", "other-parent-sigterm", "nats-ctrl-c"],
)
async def test_consume_ends_cleanly_when_its_nats_parent_is_killed(
    nats_server, nc, js, uniq, tmp_path, parent_name, how, ends
):
    """With Ctrl-C both get SIGINT and nats dies at once: cg's SIGTERM for its parent's end comes while its
    handler still runs (2 s), and is not taken for a second Ctrl-C (which would not wait for it)."""
    await make_stream(js, uniq, subjects=[f"{uniq}.*"])
    await create_elastic(nc, uniq, "g", 1)
    await add_members(nc, uniq, "g", ["m1"])
    parent = tmp_path / parent_name
    parent.symlink_to(sys.executable)
    pidfile, out, err = tmp_path / "cg.pid", tmp_path / "out", tmp_path / "err"
    wait = "8" if ends else "2"  # cg polls its parent every 0.5 s; its handler runs 2 s
    harness = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HARNESS,
        str(parent),
        PARENT,
        str(pidfile),
        str(out),
        str(err),
        how,
        wait,
        *cg_argv("elastic", "consume", uniq, "g", "m1", "--sleep", "2s"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=cg_env(nats_server.url),
    )
    try:
        await wait_for(lambda: "consuming..." in _read(out), 20, what="cg consuming")
        await js.publish(f"{uniq}.a", b"x")
        await wait_for(lambda: "Processing for 2s" in _read(out), 10, what="the handler running")
        assert harness.stdin is not None
        harness.stdin.write(b"kill the parent\n")
        report, _ = await asyncio.wait_for(harness.communicate(), 20)
    finally:
        if harness.returncode is None:
            harness.kill()
            await harness.wait()
    end = json.loads(report.decode().splitlines()[-1])
    if ends:
        assert end["code"] == 0, (end, _read(out), _read(err))
        assert 1 < end["seconds"] < 6, end  # it waited for the handler, not much longer
        assert _read(out).rstrip().endswith("acked"), _read(out)  # the handler in flight finished
        assert (await js.stream_info(f"{uniq}-g")).state.messages == 0
    else:
        assert end["code"] is None, (end, _read(err))  # still running: a cg under another parent stays


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""

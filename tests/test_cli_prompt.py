"""``cg static prompt`` / ``cg elastic prompt`` against a real server.

- in-process through prompt-toolkit's pipe input (``create_pipe_input`` + ``DummyOutput``): a
  scripted session (every kind of command, asked arguments, the CLI's own questions answered through
  prompt-toolkit, mode switching, errors that keep the shell alive, Ctrl-C, Ctrl-D, the history
  file, one connection for the whole session), completion of live names, consume ending back at
  the prompt with nothing left on the shared connection;
- the real ``cg`` in a pseudo-terminal (``os.openpty``, the child's controlling terminal): Tab
  completion of a live group name, Ctrl-C cancelling a line and stopping ``consume``, a delete
  confirmation, Ctrl-D exiting 0, the history file;
- plain stdin (a pipe) and a server that is not there.

Every wait is bounded (pipe scripts end with Ctrl-D and a watchdog; pty reads have deadlines).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.cli import cg_argv, cg_env, closed_port_url, partition_transform

SCRIPT_TIMEOUT = 45.0


# ---------------------------------------------------------------- helpers


def _streams(url: str, *names: str, transform: bool = True, partitions: int = 4) -> None:
    """Create origin streams (``<name>.*``; with a partition transform for static groups of ``partitions``)."""
    import nats
    from nats.js.api import StreamConfig, SubjectTransform

    async def main() -> None:
        nc = await nats.connect(url, connect_timeout=5)
        try:
            js = nc.jetstream()
            for name in names:
                cfg = StreamConfig(name=name, subjects=[f"{name}.*"])
                if transform:
                    src, dest = partition_transform(name, partitions)
                    cfg.subject_transform = SubjectTransform(src=src, dest=dest)
                await js.add_stream(cfg)
        finally:
            await nc.close()

    asyncio.run(main())


def _root():
    from cg.app import build

    return build()


def _opts(url: str):
    from pcgroups.connect import ConnectionOptions

    return ConnectionOptions(server=url)


class _Tee(io.StringIO):
    """stdout/stderr of an in-process session, readable from another thread while it runs."""


def _run_script(url: str, mode: str, script: str, history: Path):
    """Run a whole session on a pipe input; returns (exit code, stdout, stderr)."""
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from cg.prompt import Repl

    out, err = _Tee(), _Tee()
    with create_pipe_input() as inp:
        inp.send_text(script)
        stuck = threading.Event()

        def watchdog() -> None:  # a session that still waits for input after the deadline is ended
            stuck.set()
            inp.send_text("\x03\x04" * 3)

        timer = threading.Timer(SCRIPT_TIMEOUT, watchdog)
        timer.start()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = Repl(mode, _opts(url), _root(), input=inp, output=DummyOutput(), history_file=history).run()
        finally:
            timer.cancel()
    assert not stuck.is_set(), (
        f"the session was still waiting after {SCRIPT_TIMEOUT}s\n{out.getvalue()}\n{err.getvalue()}"
    )
    return code, out.getvalue(), err.getvalue()


def _history_lines(path: Path) -> list[str]:
    return [line[1:] for line in path.read_text().splitlines() if line.startswith("+")]


# ---------------------------------------------------------------- in-process sessions (pipe input)


def test_scripted_session(nats_server, uniq, clean_env, monkeypatch):
    """Static then elastic commands, asked arguments, the CLI's questions, errors, Ctrl-C, Ctrl-D."""
    import pcgroups.connect

    S, E = f"{uniq}s", f"{uniq}e"
    _streams(nats_server.url, S)
    _streams(nats_server.url, E, transform=False)
    connects = []
    real_connect = pcgroups.connect.connect

    async def counting_connect(*args, **kwargs):
        connects.append(args)
        return await real_connect(*args, **kwargs)

    monkeypatch.setattr(pcgroups.connect, "connect", counting_connect)
    history = clean_env / "hist" / "history"  # the directory is created by the shell
    script = "".join(
        [
            f"create balanced {S} g1 4 m1 m2\r",
            f"ls {S}\r",
            f"info {S}\r",
            "g1\r",  # asked: the group
            f"minfo {S} g1\r",
            "m1\r",  # asked: the member
            "create\r",
            "mapped\r",
            f"{S}\r",
            "g2\r",
            "4\r",
            "m1:0,1 m2:2,3\r",  # everything asked
            f"list {S} --json\r",
            f"drop {S} g1 m1\r",  # an elastic command in static mode: error
            "bogus\r",
            f"info {S} nosuch\r",  # a library error
            f"create balanced {S} g3 notanumber m1\r",  # a usage error
            f"info '{S}\r",  # unbalanced quote
            f"info {S} g1\x03",  # Ctrl-C: the line is dropped
            "help\r",
            "elastic\r",
            f"create {E} e1 4\r",
            f"{E}.*\r",
            "1\r",
            "\r",  # the CLI's own filter questions
            f"add {E} e1 m1 m2 m3\r",
            f"drop {E} e1 m1\r",
            f"cm {E} e1\r",
            "m2:0,1 m3:2,3\r",  # asked mappings are the ones applied
            f"info {E} e1\r",
            f"static ls {S}\r",  # one command of the other mode
            f"dm {E} e1\r",
            f"rm {E} e1\r",
            "n\r",  # confirmation refused
            f"delete {E} e1\r",
            "y\r",  # confirmation accepted
            f"ls {E}\r",
            "processing-time 5ms\r",
            "processing-time\r",
            "\x04",  # Ctrl-D: exit 0
        ]
    )
    code, out, err = _run_script(nats_server.url, "static", script, history)
    assert code == 0
    assert "Traceback" not in out + err
    lines = out.splitlines()
    assert lines[0] == "static consumer groups: [g1]"
    assert lines[1:4] == ["config: max members=4, filters=[]", "members: [m1 m2]", "currently active members: []"]
    assert lines[4:6] == [
        "member m1 is part of the consumer group membership",
        "***Warning*** member m1 is part of the consumer group membership but has NO active instance",
    ]
    assert '"groups": [' in out and '"g1"' in out and '"g2"' in out
    assert "static mode commands" in out and "create mapped" in out and "(also memberinfo, minfo)" in out
    assert "added members: [m1 m2 m3]" in lines
    assert "dropped members: [m2 m3]" in lines
    assert "member mapping: [{Member:m2 Partitions:[0 1]} {Member:m3 Partitions:[2 3]}]" in lines
    assert f"filter={E}.*, partitioning wildcards [1]" in lines
    assert "Member mappings: [{Member:m2 Partitions:[0 1]} {Member:m3 Partitions:[2 3]}]" in lines
    assert lines.count("static consumer groups: [g1 g2]") == 1  # `static ls` while in elastic mode
    assert "elastic consumer groups: []" in lines
    assert lines[-1] == "processing time: 5ms"
    assert lines.count("members: [m1 m2]") == 1  # the Ctrl-C'd `info` never ran
    errors = [
        e for e in err.splitlines() if not e.startswith("cg: warning: elastic consumer group e1 has no members now")
    ]
    assert len(errors) == len(err.splitlines()) - 1, err  # after `dm`: one warning
    assert all(e.startswith("cg: error: ") for e in errors), err
    assert any("drop is an elastic command" in e for e in errors)
    assert "cg: error: unknown command: bogus (type help for the list)" in errors
    assert any("nosuch" in e and "not found" in e for e in errors)
    assert any("invalid MAX-MEMBERS: 'notanumber' is not a whole number" in e for e in errors)
    assert any(e.endswith("; try 'cg static create balanced -h' for help") for e in errors)
    assert any("can't parse the line" in e for e in errors)
    assert errors.count("cg: error: operation canceled") == 1  # the refused delete
    assert len(connects) == 1, "every command must use the session's one connection"
    hist = _history_lines(history)
    assert hist[0] == f"create balanced {S} g1 4 m1 m2" and f"info {S}" in hist and "elastic" in hist
    assert f"info {S} g1" not in hist  # the canceled line
    assert "g1" not in hist and "y" not in hist  # answers to questions are not commands
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("mode", ["static", "elastic"])
def test_help_fits_80_columns_and_wraps_between_words(nats_server, clean_env, mode):
    """``help`` in a pipe (or an 80-column terminal): no line wider than 80, so nothing wraps mid-word, and
    every command's help whole, word for word."""
    from cg.prompt import Repl, _short_help, command_entries, help_lines

    repl = Repl(mode, _opts(nats_server.url), _root(), input=None, history_file=clean_env / "h")
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()), repl.bound():
        repl.execute("help")
    lines = out.getvalue().splitlines()
    assert lines and max(len(line) for line in lines) <= 80, max(lines, key=len)
    words = out.getvalue().split()
    for names, cmd in command_entries(repl.group(mode)):
        entries = command_entries(cmd) if hasattr(cmd, "commands") else [(names, cmd)]
        for _, c in entries:
            text = _short_help(c).split()
            assert any(words[i : i + len(text)] == text for i in range(len(words))), text
    wide = help_lines("title", [("create balanced STREAM GROUP MAX-MEMBERS MEMBER...", "create it " * 8)], 140)
    assert wide[1].startswith("  create balanced STREAM GROUP MAX-MEMBERS MEMBER...  create it")  # beside, when wide


def test_completion_of_live_names(nats_server, uniq, clean_env):
    from cg.prompt import LOOKUP_TIMEOUT, Repl

    S, E = f"{uniq}s", f"{uniq}e"
    _streams(nats_server.url, S)
    _streams(nats_server.url, E, transform=False)
    repl = Repl("static", _opts(nats_server.url), _root(), input=None, history_file=clean_env / "h")
    with (
        contextlib.redirect_stdout(io.StringIO()) as out,
        contextlib.redirect_stderr(io.StringIO()) as err,
        repl.bound(),
    ):

        def comp(text: str) -> list[str]:
            return repl.runner.run(repl.completions(text))

        assert {"ls", "list", "info", "create", "minfo", "sd", "join", "status", "help", "?", "elastic", "exit"} <= set(
            comp("")
        )
        assert "prompt" not in comp("")
        assert comp("mi") == ["minfo"]
        assert comp("create ") == ["balanced", "mapped"]
        assert {"--json", "--help"} <= set(comp("ls --"))
        assert comp(f"create balanced {S} x 4 --filter ") == []  # an option's value
        streams = comp("info ")
        assert S in streams and E in streams and not any(s.startswith("KV_") for s in streams)
        assert comp(f"info {uniq}") == sorted([S, E])
        assert comp(f"info {S} ") == []  # no groups yet
        repl.execute(f"create balanced {S} orders 4 m1 m2")
        repl.execute(f"create balanced {S} other 4 x1")
        assert comp(f"info {S} ") == ["orders", "other"]  # the cache is dropped after a command
        assert comp(f"info {S} or") == ["orders"]
        assert comp(f"member-info {S} orders ") == ["m1", "m2"]
        assert comp(f"sd {S} orders m") == ["m1", "m2"]
        assert comp(f"ls {S} ") == []  # no more positionals
        assert comp(f"elastic info {S} ") == []  # an elastic command looks for elastic groups
        repl.execute("elastic")
        assert repl.prompt_text == "[elastic]> "
        repl.execute(f"create {E} e1 4 --filter {E}.* --wildcards 1")
        repl.execute(f"add {E} e1 m1 m2")
        assert comp(f"info {E} ") == ["e1"]
        assert comp(f"drop {E} e1 ") == ["m1", "m2"]
        assert comp(f"drop {E} e1 m1 ") == ["m2"]  # a member already on the line is not offered
        assert comp(f"cm {E} e1 ") == ["m1:", "m2:"]
        assert comp(f"add {E} e1 ") == []  # new names: nothing to offer
        assert comp(f"static info {S} o") == ["orders", "other"]
        t0 = time.monotonic()
        assert comp("info nosuchstream ") == []
        assert comp("minfo nosuchstream g ") == []
        assert time.monotonic() - t0 < 2 * LOOKUP_TIMEOUT + 1
    assert "cg: error" not in err.getvalue(), err.getvalue()
    assert "added members: [m1 m2]" in out.getvalue()


def test_consume_takes_the_concurrency_flags(nats_server, uniq, clean_env):
    """The shell's consume is the CLI's: the concurrency flags complete, and a bad combination is the one
    error line, the shell going on."""
    from cg.prompt import Repl

    repl = Repl("static", _opts(nats_server.url), _root(), input=None, history_file=clean_env / "h")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err, repl.bound():
        flags = {"--concurrency", "--key-header", "--key-tokens", "--max-ack-pending"}
        assert flags <= set(repl.runner.run(repl.completions(f"consume {uniq} g m1 --")))
        repl.execute("elastic")
        assert flags <= set(repl.runner.run(repl.completions(f"join {uniq} g m1 --")))
        repl.execute(f"consume {uniq} g m1 --concurrency 4 --key-header K --key-tokens 1")
        repl.execute("static")
        repl.execute(f"consume {uniq} g m1 --concurrency 2 --max-ack-pending 1")
    assert err.getvalue().splitlines() == [
        "cg: error: --key-header and --key-tokens can't be combined: key messages by a header or by subject tokens",
        "cg: error: --max-ack-pending 1 is less than --concurrency 2: at most 1 message would be handled at once; "
        "give --max-ack-pending 2 or more",
    ]


def test_consume_returns_to_the_prompt_and_leaves_the_connection_clean(nats_server, uniq, clean_env):
    """`consume` on the session's connection; the group is deleted from outside; the shell goes on
    with no subscription of the member instance left; `processing-time` sets consume's --sleep."""
    import nats

    from cg.prompt import Repl

    S = f"{uniq}s"
    _streams(nats_server.url, S, partitions=10)

    out, err = _Tee(), _Tee()
    repl = Repl("static", _opts(nats_server.url), _root(), input=None, history_file=clean_env / "h")
    deleted = threading.Event()

    def wait_for(predicate, what: str) -> None:
        deadline = time.monotonic() + 20
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)

    def publish_then_delete() -> None:
        """Once the member is ready: 5 messages; once they are acked: delete the group."""
        from pcgroups.static._admin import delete_static

        async def main() -> None:
            nc = await nats.connect(nats_server.url)
            try:
                await asyncio.to_thread(wait_for, lambda: "consuming..." in out.getvalue(), "consuming...")
                js = nc.jetstream()
                for i in range(5):
                    await js.publish(f"{S}.{i}", b"x")
                await asyncio.to_thread(wait_for, lambda: out.getvalue().count(" acked\n") >= 5, "5 acks")
            finally:
                await delete_static(nc, S, "c")
                await nc.close()
                deleted.set()

        asyncio.run(main())

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), repl.bound():
        repl.execute(f"create balanced {S} c 10 m1")
        baseline = len(repl.nc._subs)
        repl.execute("processing-time 5ms")
        t = threading.Thread(target=publish_then_delete, daemon=True)
        t.start()
        repl.execute(f"consume {S} c m1")
        t.join(30)
        assert deleted.is_set()
        assert len(repl.nc._subs) == baseline
        assert not repl.nc.is_closed
        repl.execute(f"ls {S}")
    text = out.getvalue()
    assert "consuming..." in text
    assert len(re.findall(r"\[m1\] subject=\S+, seq=\d+, pinnedID=\S+\. Processing for 5ms \.\.\. acked", text)) == 5
    assert text.rstrip().endswith("static consumer groups: []")
    assert f"static consumer group c on stream {S} was deleted" in err.getvalue()
    assert "error" not in err.getvalue()


def test_history_path(tmp_path):
    from cg.prompt import history_path

    assert history_path({"XDG_STATE_HOME": "/x/state", "HOME": "/h"}) == Path("/x/state/cg/history")
    assert history_path({"XDG_STATE_HOME": "relative", "HOME": "/h"}) == Path("/h/.local/state/cg/history")
    assert history_path({"HOME": "/h"}) == Path("/h/.local/state/cg/history")


# ---------------------------------------------------------------- the real cg in a pseudo-terminal

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]")

_LAUNCH = (
    "import fcntl, os, sys, termios\n"
    "os.setsid()\n"
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"  # the pty is the controlling terminal: Ctrl-C is SIGINT
    "os.execvpe(sys.argv[1], sys.argv[1:], os.environ)\n"
)


class Terminal:
    """A process on a pseudo-terminal: send keys, wait (bounded) for text on the screen stream."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        import fcntl
        import termios

        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 220, 0, 0))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, *argv], stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True
        )
        os.close(slave)
        self.raw = b""
        self.pos = 0

    @property
    def text(self) -> str:
        return _ANSI.sub("", self.raw.decode("utf-8", "replace")).replace("\r", "")

    def _read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if ready:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # the child closed the terminal
                data = b""
            self.raw += data

    def expect(self, pattern: str, timeout: float = 15.0) -> re.Match:
        """Wait for ``pattern`` (a regex) after what the last expect matched."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while True:
            m = rx.search(self.text, self.pos)
            if m:
                self.pos = m.end()
                return m
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and not select.select([self.master], [], [], 0)[0]):
                raise AssertionError(
                    f"timed out waiting for {pattern!r}; screen after it:\n{self.text[self.pos :][-3000:]}"
                )
            self._read(min(left, 0.2))

    def send(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def wait(self, timeout: float = 15.0) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.1)
        if self.proc.poll() is None:
            self.close()
            raise AssertionError(f"still running after {timeout}s:\n{self.text[-3000:]}")
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        with contextlib.suppress(OSError):
            os.close(self.master)


@pytest.fixture
def terminal():
    opened: list[Terminal] = []

    def start(*args: str, env: dict[str, str]) -> Terminal:
        t = Terminal(cg_argv(*args), env)
        opened.append(t)
        return t

    yield start
    for t in opened:
        t.close()


def test_in_a_terminal(nats_server, uniq, tmp_path, terminal):
    S = f"{uniq}s"
    _streams(nats_server.url, S)
    state = tmp_path / "state"
    env = cg_env(nats_server.url, XDG_STATE_HOME=str(state), CG_PRETTY="0", TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1")
    t = terminal("static", "prompt", env=env)
    t.expect(r"\[static\]>")
    t.send(f"create balanced {S} completeme 4 m1 m2\r")
    t.send(f"ls {S}\r")  # typed ahead: read once create is done
    t.expect(r"static consumer groups: \[completeme\]")
    t.expect(r"\[static\]>")

    # Tab completes a live group name: the line that runs is the completed one
    t.send(f"info {S} comp")
    t.expect("comp")
    t.send("\t")
    t.expect("leteme")
    t.send("\r")
    t.expect(r"members: \[m1 m2\]")
    t.expect(r"\[static\]>")

    # Ctrl-C cancels the line being typed
    t.send(f"info {S} canceledgroup")
    t.expect("canceledgroup")
    t.send("\x03")
    t.expect(r"\[static\]>")
    t.send(f"ls {S}\r")
    t.expect(r"static consumer groups: \[completeme\]")
    assert "canceledgroup not found" not in t.text

    # a missing argument is asked for
    t.send(f"minfo {S} completeme\r")
    t.expect("member:")
    t.send("m1\r")
    t.expect("member m1 is part of the consumer group membership")
    t.expect(r"\[static\]>")

    # consume until Ctrl-C, then back at the prompt with the session still working
    t.send(f"consume {S} completeme m1\r")
    t.expect(r"consuming\.\.\.", timeout=20)
    t.send("\x03")
    t.expect(r"\[static\]>", timeout=20)
    t.send(f"ls {S}\r")
    t.expect(r"static consumer groups: \[completeme\]")

    # the delete confirmation is asked in the shell
    t.send(f"delete {S} completeme\r")
    t.expect(r"are you sure\? \(y/n\):")
    t.send("y\r")
    t.expect(r"\[static\]>")
    t.send(f"ls {S}\r")
    t.expect(r"static consumer groups: \[\]")

    t.send("elastic\r")
    t.expect(r"\[elastic\]>")
    t.send("\x04")  # Ctrl-D
    assert t.wait() == 0
    assert "Traceback" not in t.text and "cg: error" not in t.text, t.text
    hist = _history_lines(state / "cg" / "history")
    assert hist == [
        f"create balanced {S} completeme 4 m1 m2",
        f"ls {S}",
        f"info {S} completeme",
        f"ls {S}",
        f"minfo {S} completeme",
        f"consume {S} completeme m1",
        f"ls {S}",
        f"delete {S} completeme",
        f"ls {S}",
        "elastic",
    ]


# ---------------------------------------------------------------- plain stdin, no server


def test_lines_from_a_pipe(nats_server, uniq, tmp_path):
    S = f"{uniq}s"
    _streams(nats_server.url, S)
    env = cg_env(nats_server.url, XDG_STATE_HOME=str(tmp_path / "state"))
    script = (
        f"create balanced {S} g 4 m1\n"
        f"ls {S}\n"
        f"info {S}\n"
        "g\n"  # the asked group is the next line
        "nope\n"
        f"delete {S} g\n"
        "y\n"  # the CLI's confirmation reads the next line too
        f"ls {S}\n"
    )
    p = subprocess.run(cg_argv("static", "prompt"), input=script, capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "static consumer groups: [g]",
        "consumer group: config: max members=4, filters=[]",
        "members: [m1]",
        "currently active members: []",
        "WARNING: this operation will cause all existing consumer members to terminate consuming are you sure? "
        "(y/n): static consumer groups: []",
    ]
    assert p.stderr == "cg: error: unknown command: nope (type help for the list)\n"
    assert not (tmp_path / "state" / "cg" / "history").exists()  # scripts don't write history


def test_no_server_is_one_error_line(tmp_path):
    env = cg_env(closed_port_url(), XDG_STATE_HOME=str(tmp_path / "state"))
    p = subprocess.run(cg_argv("elastic", "prompt"), input="", capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 1
    assert p.stdout == ""
    assert len(p.stderr.splitlines()) == 1 and p.stderr.startswith("cg: error: "), p.stderr

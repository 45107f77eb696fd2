"""Running ``cg`` in the tests: as a subprocess, in-process, or as a long-running process to read from.

Commands run either as real subprocesses (the installed ``cg`` console script) or in-process through
``cg.main.main`` in a worker thread (same code path after argv, ~0.4 s cheaper per call); exit codes,
"no traceback" and anything about signals, stdout buffering or stdin are always checked on
subprocesses.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import io
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pcgroups.testing._server import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
CG_BIN = Path(sys.executable).with_name("cg")
EMPTY_CONFIG = tempfile.mkdtemp(prefix="cg-test-xdg-")  # no NATS contexts for the tests' cg runs
atexit.register(shutil.rmtree, EMPTY_CONFIG, ignore_errors=True)  # gone with the test session


def cg_argv(*args: str) -> list[str]:
    base = [str(CG_BIN)] if CG_BIN.exists() else [sys.executable, "-m", "cg.main"]
    return [*base, *args]


def cg_env(url: str | None = None, **extra: str) -> dict[str, str]:
    """The environment for a cg subprocess: no inherited NATS_*/CG_* settings or contexts."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NATS_", "CG_")) and k not in ("FORCE_COLOR", "TTY_COMPATIBLE")
    }
    env["XDG_CONFIG_HOME"] = EMPTY_CONFIG
    env["PYTHONUNBUFFERED"] = "0"
    if url:
        env["NATS_URL"] = url
    env.update(extra)
    return env


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()

    def ok(self) -> Result:
        assert self.code == 0, f"exit {self.code}\nstdout: {self.out}\nstderr: {self.err}"
        return self


def cg(
    *args: str, url: str | None = None, input: str | None = None, env: dict | None = None, timeout: float = 30
) -> Result:
    """Run the real ``cg`` executable (blocking)."""
    p = subprocess.run(
        cg_argv(*args),
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or cg_env(url),
    )
    return Result(p.returncode, p.stdout, p.stderr)


async def acg(
    *args: str, url: str | None = None, input: str | None = None, env: dict | None = None, timeout: float = 30
) -> Result:
    """Run the real ``cg`` executable without blocking the event loop."""
    return await asyncio.to_thread(cg, *args, url=url, input=input, env=env, timeout=timeout)


_inproc_lock = threading.Lock()


def cg_inproc(*args: str, url: str | None = None, input: str = "") -> Result:
    """``cg.main.main(argv)`` with stdin/stdout/stderr redirected (``--server url`` added)."""
    from cg.main import main

    argv = [*args, "--server", url] if url else list(args)
    out, err = io.StringIO(), io.StringIO()
    with _inproc_lock:
        saved_env = {k: os.environ.get(k) for k in ("XDG_CONFIG_HOME", "CG_PRETTY", "NATS_URL")}
        saved_stdin = sys.stdin
        os.environ["XDG_CONFIG_HOME"] = EMPTY_CONFIG
        os.environ.pop("CG_PRETTY", None)
        os.environ.pop("NATS_URL", None)
        sys.stdin = io.StringIO(input)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(argv)
        finally:
            sys.stdin = saved_stdin
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            root = logging.getLogger()
            for h in list(root.handlers):
                if getattr(h, "_cg", False):
                    root.removeHandler(h)
    return Result(code, out.getvalue(), err.getvalue())


async def run_cg(*args: str, url: str | None = None, input: str = "") -> Result:
    """In-process cg from an async test (a worker thread runs its own event loop)."""
    return await asyncio.to_thread(cg_inproc, *args, url=url, input=input)


def assert_cli_error(r: Result, fragment: str | None = None) -> None:
    """Exit status 1, ``cg: error: ...`` as the first stderr line, no traceback, nothing on stdout."""
    assert r.code == 1, f"exit {r.code}\nstdout: {r.out}\nstderr: {r.err}"
    first = r.err.splitlines()[0] if r.err else ""
    assert first.startswith("cg: error: "), r.err
    assert "Traceback" not in r.err and "Traceback" not in r.out, r.err
    if fragment is not None:
        assert fragment in r.err, r.err


class Proc:
    """A long-running cg subprocess whose stdout is read line by line (and partial lines)."""

    def __init__(self, *args: str, url: str | None = None, env: dict | None = None):
        self.args = args
        self.env = env or cg_env(url)
        self.proc: asyncio.subprocess.Process | None = None
        self.out = ""
        self._reader: asyncio.Task | None = None
        self.changed = asyncio.Event()

    async def start(self) -> Proc:
        self.proc = await asyncio.create_subprocess_exec(
            *cg_argv(*self.args),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self.proc and self.proc.stdout
        while True:
            chunk = await self.proc.stdout.read(4096)
            if not chunk:
                return
            self.out += chunk.decode()
            self.changed.set()

    async def wait_output(self, predicate, timeout: float = 15, what: str = "output") -> str:
        deadline = time.monotonic() + timeout
        while not predicate(self.out):
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc and self.proc.returncode is not None and self._reader.done()):
                raise AssertionError(
                    f"timed out waiting for {what}; stdout so far:\n{self.out}\nstderr: {await self.stderr_now()}"
                )
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), min(left, 0.5))
            except TimeoutError:
                pass
        return self.out

    async def wait_text(self, text: str, timeout: float = 15) -> str:
        return await self.wait_output(lambda o: text in o, timeout, repr(text))

    async def stderr_now(self) -> str:
        if self.proc and self.proc.returncode is not None and self.proc.stderr:
            try:
                return (await asyncio.wait_for(self.proc.stderr.read(), 2)).decode()
            except TimeoutError:
                return ""
        return "(still running)"

    async def wait(self, timeout: float = 15) -> Result:
        assert self.proc
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.kill()
            await self.proc.wait()
            raise AssertionError(
                f"cg {' '.join(self.args)} did not exit within {timeout}s; stdout:\n{self.out}"
            ) from None
        await asyncio.wait_for(self._reader, 5)
        err = (await self.proc.stderr.read()).decode() if self.proc.stderr else ""
        return Result(code, self.out, err)

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    async def close(self) -> None:
        """Make sure the process is gone (test teardown)."""
        if self.proc and self.proc.returncode is None:
            self.kill()
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                pass
        if self._reader:
            self._reader.cancel()


@contextlib.asynccontextmanager
async def procs():
    """Collects Procs and kills whatever is still running at the end of the test."""
    started: list[Proc] = []

    async def start(*args: str, url: str | None = None, env: dict | None = None) -> Proc:
        p = await Proc(*args, url=url, env=env).start()
        started.append(p)
        return p

    try:
        yield start
    finally:
        for p in started:
            await p.close()


MSG_LINE = re.compile(
    r"^\[(?P<member>[^\]]+)\] subject=(?P<subject>\S+), seq=(?P<seq>\d+), "
    r"pinnedID=(?P<pin>\S*)\. Processing for (?P<sleep>\S+) \.\.\. (?P<end>.*)$"
)


def message_lines(text: str) -> list[re.Match]:
    return [m for m in (MSG_LINE.match(line) for line in text.splitlines()) if m]


async def make_stream(js, name: str, subjects: list[str] | None = None, transform: tuple[str, str] | None = None):
    from nats.js.api import StreamConfig, SubjectTransform

    cfg = StreamConfig(name=name, subjects=subjects or [f"{name}.*"])
    if transform:
        cfg.subject_transform = SubjectTransform(src=transform[0], dest=transform[1])
    await js.add_stream(cfg)


def partition_transform(stream: str, n: int = 10) -> tuple[str, str]:
    return f"{stream}.*", f"{{{{partition({n},1)}}}}.{stream}.{{{{wildcard(1)}}}}"


async def kv_value(js, bucket: str, key: str) -> bytes | None:
    import nats.js.errors

    try:
        kv = await js.key_value(bucket)
        entry = await kv.get(key)
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError):
        return None
    return entry.value


def closed_port_url() -> str:
    return f"nats://127.0.0.1:{free_port()}"

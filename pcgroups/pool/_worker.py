"""A worker of a group's pool: a process that runs the handler for the group's dispatching members.

``serve_worker(nc, flavour, stream, group, handler, capacity=C)`` enrols with every dispatching member of the
group (a member instance started with ``dispatch=True``, :mod:`pcgroups.pool._dispatcher`) and runs up to ``C``
calls at once on the messages they offer. Start and stop workers at will, on any machine: a dispatcher
sees a new worker at its first heartbeat and offers it work at once; a stopped one finishes what it holds
and leaves. The wire contract is :mod:`pcgroups.pool`.

The handler gets a :class:`~pcgroups.consume._delivery.Msg`, as a member instance's handler does: ``subject`` without
the partition token, ``partition``, ``data``, ``headers`` (the message's own), the acks (``ack()`` and
``term()`` go to JetStream, ``nak(delay)`` and an exception to the dispatcher, which retries in place), and
``superseded``: True once the message's dispatcher took it back (this worker looked gone: paused, cut off)
or did not answer for :data:`~pcgroups.pool.DOUBT` (then it may have). A long handler should then stop
and not ack. ``+WPI`` is sent for a call that runs longer than a third of AckWait (``auto_in_progress``),
so a message whose dispatcher died stays with this worker until it is done.

The worker is a :class:`~pcgroups.consume._loop.ControlLoop` (``stop()``, ``done()``, ``wait_for_consuming()``,
``async with``); offers and heartbeat answers are handled in their subscriptions' callbacks, the loop
keeps the heartbeat and the end. ``wait_for_consuming()`` returns once a dispatching member answered.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Final

from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg

from . import _wire as pool
from ..jetstream._connection import Connection
from ..consume._delivery import Msg, call_in
from ..errors import ConfigError
from ..events import EventCallback
from ..consume._report import Reporter
from ..consume._instance import Starting
from ..consume._loop import CONTINUE, ControlLoop, Outcome, Stop
from ..jetstream._permissions import Violation
from ..consume._dispatchers import _noop
from ..consume._dispatchers import Handler, as_handle
from ..tracing import NO_TRACING, Tracing

log = logging.getLogger("pcgroups")

__all__ = ["WorkerInstance", "default_worker_name", "serve_worker"]

DEFAULT_ACK_WAIT: Final = 5.0


def default_worker_name() -> str:
    """``<host>-<pid>``, kept to the characters a worker name may hold."""
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0]) or "worker"
    return f"{host}-{os.getpid()}"


@dataclass(frozen=True)
class Beat:
    """Time for a heartbeat."""


@dataclass(frozen=True)
class Fatal:
    """An error that ends the worker (a refused permission)."""

    error: BaseException


WorkerEvent = Stop | Beat | Fatal


@dataclass
class Call:
    """One offer being handled."""

    msg: Msg
    dispatcher: str          # the dispatching instance's id
    token: int               # the offer's token (its dispatcher counts them up)
    reply: str               # where the outcome goes
    started: float
    nak: float | None = None
    revoked: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class WorkerHost:
    """What a worker's messages ask of their origin (:class:`~pcgroups.consume._delivery.MsgHost`): the acks go to
    JetStream on this connection; ``supersedes`` is the worker's fence (pool invariant 3)."""

    epoch = 0

    def __init__(self, nc: Client, worker: WorkerInstance):
        self.nc = nc
        self._worker = worker
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self.acked_seqs: set[int] = set()

    async def publish(self, subject: str, body: bytes) -> None:
        await self.nc.publish(subject, body)

    async def request(self, subject: str, body: bytes, timeout: float) -> Any:
        return await self.nc.request(subject, body, timeout=timeout)

    def call(self, coro: Any) -> Any:
        return call_in(self._loop, self._thread, coro)

    def acked(self, seq: int, epoch: int | None = None) -> None:
        self.acked_seqs.add(seq)

    def supersedes(self, m: Msg) -> bool:
        return self._worker.superseded(m)


class WorkerInstance(ControlLoop[WorkerEvent]):
    """A running worker (see :func:`serve_worker`)."""

    def __init__(self, nc: Client, flavour: str, stream: str, group: str, handler: Handler, *, name: str,
                 capacity: int, ack_wait: float, auto_in_progress: bool, on_event: EventCallback | None,
                 tracing: Tracing | None = None):
        super().__init__()
        self.nc = nc
        self.flavour, self.stream_name, self.group_name = flavour, stream, group
        self.member_name = name
        self.id = secrets.token_hex(4)
        self.capacity = capacity
        self.ack_wait = ack_wait
        self.auto_in_progress = auto_in_progress
        self.prefix = pool.prefix(flavour, stream, group)
        self.handled = 0
        self._handler = as_handle(handler)
        # a call's process span (pcgroups.tracing), its member the dispatcher's: "" until a call says it
        self._trace = NO_TRACING if tracing is None else tracing.instance(flavour, stream, group, "")
        self._host = WorkerHost(nc, self)
        self._calls: dict[Msg, Call] = {}
        self._heard: dict[str, float] = {}   # dispatcher id -> its last answer or offer (monotonic)
        self._members: dict[str, str] = {}               # dispatcher id -> its member
        self._stopping = False
        self._enrolled = asyncio.Event()
        self._said_waiting = False
        self._subs: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._reporter = Reporter(name, on_event=on_event, on_failure=lambda e: self._post(Fatal(e)))
        self._unlisten: Any = lambda: None
        self._unwatch: Any = lambda: None

    # --- public surface ------------------------------------------------------------------------
    @property
    def consuming(self) -> bool:
        """A dispatching member answered: this worker gets offers."""
        return self._enrolled.is_set() and not self._done.done()

    @property
    def busy(self) -> int:
        """Calls running now."""
        return len(self._calls)

    async def _attached(self) -> None:
        await self._enrolled.wait()

    # --- start, heartbeats, end ----------------------------------------------------------------
    async def _start(self) -> None:
        p = self.prefix
        self._unlisten = Connection.of(self.nc).permissions.listen(self._denied)
        self._unwatch = Connection.of(self.nc).watch.listen(lambda kind, url: self._reporter.emit(kind, detail=url))
        self._subs = [
            await self.nc.subscribe(pool.worker_subject(p, self.member_name, self.id, "work"), cb=self._on_offer),
            await self.nc.subscribe(pool.worker_subject(p, self.member_name, self.id, "hb"), cb=self._on_answer),
            await self.nc.subscribe(f"{p}.HELLO", cb=self._on_hello)]
        self._launch(f"pcg-worker-{self.member_name}")
        self._post(Beat())
        self._tasks = [asyncio.create_task(self._ticks(), name=f"pcg-worker-hb-{self.member_name}")]
        if self.auto_in_progress:
            self._tasks.append(asyncio.create_task(self._progress(), name=f"pcg-worker-wpi-{self.member_name}"))

    def _denied(self, violation: Violation) -> None:
        self._post(Fatal(violation.error(pool.worker_subjects(self.prefix, self.member_name, self.id))))

    async def _ticks(self) -> None:
        while True:
            await asyncio.sleep(pool.HEARTBEAT)
            self._post(Beat())

    def _halt(self) -> None:
        self._stopping = True   # pool invariant 4: no new offer from now on

    async def _handle(self, event: WorkerEvent | Stop) -> Outcome:
        match event:
            case Beat():
                await self._beat()
                return CONTINUE
            case Stop():
                await self._drain()
                return None
            case Fatal(error=error):
                return error
        return CONTINUE

    async def _beat(self) -> None:
        held: dict[str, list[int]] = {}
        for call in self._calls.values():
            held.setdefault(call.dispatcher, []).append(call.msg.stream_sequence)
        hb = pool.Heartbeat(self.member_name, self.id, self.capacity, busy=len(self._calls),
                            stopping=self._stopping, held=held)
        try:
            await self.nc.publish(f"{self.prefix}.HB", hb.encode(),
                                  reply=pool.worker_subject(self.prefix, self.member_name, self.id, "hb"))
        except Exception as e:  # disconnected: the next beat tries again
            log.debug("%s: heartbeat not sent: %s", self.member_name, e)
        if not self._enrolled.is_set() and not self._said_waiting and time.monotonic() - self._started > 2.5:
            self._said_waiting = True
            self._reporter.emit("no-dispatcher", detail=f"{self.flavour} group {self.group_name} on "
                                                        f"{self.stream_name}")

    async def _drain(self) -> None:
        """Stop: the calls in flight end first (pool invariant 4), then LEAVE."""
        self._stopping = True
        await self._beat()   # dispatchers learn at once that it takes nothing more
        while self._calls:
            await asyncio.wait({c.task for c in self._calls.values() if c.task is not None})
        try:
            await self.nc.publish(f"{self.prefix}.LEAVE", pool.encode({"name": self.member_name, "id": self.id}))
            await self.nc.flush(timeout=2)
        except Exception as e:  # disconnected: its dispatchers find it gone after REVOKE_AFTER
            log.debug("%s: LEAVE not sent: %s", self.member_name, e)

    async def _close(self, result: BaseException | None) -> BaseException | None:
        self._unlisten()
        self._unwatch()
        for task in self._tasks:
            task.cancel()
        for call in list(self._calls.values()):   # an error ended it: the calls in flight are abandoned
            if call.task is not None:
                call.task.cancel()
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        return result

    # --- offers and answers -------------------------------------------------------------------------
    async def _on_hello(self, msg: NatsMsg) -> None:
        if not self._stopping:
            self._post(Beat())

    async def _on_answer(self, msg: NatsMsg) -> None:
        obj = pool.decode(msg.data)
        if obj is None or "d" not in obj:
            return
        d = str(obj["d"])
        held = {int(s) for s in obj.get("held") or ()}
        upto = int(obj.get("upto") or 0)
        self._heard[d] = time.monotonic()
        member = str(obj.get("member", ""))
        if self._members.get(d) != member:
            self._members[d] = member
            self._reporter.emit("enrolled", detail=member)
        self._enrolled.set()
        for call in self._calls.values():   # taken back: its dispatcher offered it elsewhere (invariant 3)
            if call.dispatcher == d and call.token <= upto and call.msg.stream_sequence not in held:
                call.revoked = True

    async def _on_offer(self, msg: NatsMsg) -> None:
        headers = dict(msg.headers or {})
        d, ack = headers.pop(pool.DISPATCHER, ""), headers.pop(pool.ACK, "")
        subject, pin = headers.pop(pool.SUBJECT, ""), headers.pop(pool.PIN, "")
        token = (msg.reply.rsplit(".", 1)[-1] if msg.reply else "").split("-", 1)[0]
        if not (d and ack and subject and token.isdigit()):
            log.warning("%s: ignored an offer without its Pcg headers", self.member_name)
            return
        if self._stopping or len(self._calls) >= self.capacity:
            await self._reply(msg.reply, pool.Outcome("busy"))
            return
        now = time.monotonic()
        self._heard[d] = now
        raw = NatsMsg(_client=self.nc, subject=subject, reply=ack, data=msg.data, headers=headers or None)
        m = Msg(raw, self._host, self, pin or None, now)
        m.started = now
        call = Call(m, d, int(token), msg.reply, now)
        self._calls[m] = call
        call.task = asyncio.create_task(self._call(call), name=f"pcg-worker-call-{m.stream_sequence}")

    async def _call(self, call: Call) -> None:
        m = call.msg
        error: BaseException | None = None
        try:
            with self._trace.handling(m, {"pcgroups.member": self._members.get(call.dispatcher, ""),
                                          "pcgroups.pool._worker": self.member_name}):
                await self._handler(m)
        except asyncio.CancelledError:
            self._calls.pop(m, None)
            raise
        except Exception as e:
            error = e
        self._calls.pop(m, None)
        if m.settled:
            outcome = pool.Outcome("ack" if m.stream_sequence in self._host.acked_seqs else "term")
            self._host.acked_seqs.discard(m.stream_sequence)
            self.handled += 1
        elif error is not None or call.nak is not None:
            outcome = pool.Outcome("retry", call.nak or 0.0, repr(error) if error is not None else "nak")
        elif m.superseded:
            outcome = pool.Outcome("dropped", reason="superseded")
        else:
            outcome = pool.Outcome("none")
        await self._reply(call.reply, outcome)
        if not self._calls and self._stopping:
            self._post(Beat())

    async def _reply(self, subject: str, outcome: pool.Outcome) -> None:
        try:
            await self.nc.publish(subject, outcome.encode())
        except Exception as e:  # disconnected: the dispatcher finds the offer lost and offers it again
            log.debug("%s: outcome not sent: %s", self.member_name, e)

    # --- what Msg asks (its dispatcher's part: nak) and the fence ------------------------------------
    def nak(self, m: Msg, delay: float | None) -> Any:
        """``msg.nak(delay)`` at a worker: the dispatcher retries the message in place (nothing goes to
        JetStream)."""
        call = self._calls.get(m)
        if call is not None:
            call.nak = delay or 0.0
        return _noop()

    def superseded(self, m: Msg) -> bool:
        """Pool invariant 3: taken back by its dispatcher, or no answer from it for DOUBT."""
        call = self._calls.get(m)
        if call is None:
            return False
        heard = self._heard.get(call.dispatcher, 0.0)
        return call.revoked or time.monotonic() - max(heard, call.started) > pool.DOUBT

    async def _progress(self) -> None:
        """``+WPI`` for calls running longer than a third of AckWait (not for one taken back)."""
        interval = max(self.ack_wait / 3, 0.2)
        while True:
            await asyncio.sleep(interval / 2)
            now = time.monotonic()
            for call in list(self._calls.values()):
                m = call.msg
                if not call.revoked and not m.settled and now - m.last_progress >= interval:
                    m.last_progress = now
                    try:
                        await self.nc.publish(m.reply, b"+WPI")
                    except Exception:
                        pass

    _started = 0.0


def serve_worker(nc: Client, flavour: str, stream: str, group: str, handler: Handler, *,
                 name: str | None = None, capacity: int = 1, ack_wait: float = DEFAULT_ACK_WAIT,
                 auto_in_progress: bool = True, on_event: EventCallback | None = None,
                 tracing: Tracing | None = None) -> Starting[WorkerInstance]:
    """Run a worker of ``group``'s pool (``flavour`` ``"static"`` or ``"elastic"``): up to ``capacity`` calls of
    ``handler`` at once on what the group's dispatching members offer (see the module docstring).

    ``name`` (default ``<host>-<pid>``) names it in status, metrics and permissions; ``ack_wait`` is the
    member consumers' AckWait (for ``+WPI``). ``on_event`` gets ``enrolled`` (a dispatching member answered,
    ``detail`` names it), ``no-dispatcher`` (none answered yet), ``disconnected`` and ``reconnected``. Await the
    result for the worker, or use it directly: ``async with serve_worker(...) as w``. ``tracing``: a process
    span per call (:mod:`pcgroups.tracing`; ``pcgroups.member`` the dispatching member's, ``pcgroups.pool._worker``
    this worker's name), continuing the producer's trace from the message's headers.
    """
    return Starting(_serve(nc, flavour, stream, group, handler, name=name, capacity=capacity, ack_wait=ack_wait,
                           auto_in_progress=auto_in_progress, on_event=on_event, tracing=tracing))


async def _serve(nc: Client, flavour: str, stream: str, group: str, handler: Handler, *, name: str | None,
                 capacity: int, ack_wait: float, auto_in_progress: bool,
                 on_event: EventCallback | None, tracing: Tracing | None) -> WorkerInstance:
    if flavour not in ("static", "elastic"):
        raise ConfigError(f"invalid flavour {flavour!r}: static or elastic")
    name = name or default_worker_name()
    pool.check_worker_name(name)
    if capacity < 1:
        raise ConfigError(f"capacity must be >= 1, got {capacity}")
    if ack_wait <= 0:
        raise ConfigError(f"ack_wait must be positive, got {ack_wait}")
    worker = WorkerInstance(nc, flavour, stream, group, handler, name=name, capacity=capacity,
                            ack_wait=ack_wait, auto_in_progress=auto_in_progress, on_event=on_event, tracing=tracing)
    worker._started = time.monotonic()
    await worker._start()
    return worker

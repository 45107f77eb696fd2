"""A worker of a group's pool: a process that runs the handler for the group's dispatching members.

``serve_worker(nc, flavour, stream, group, handler, capacity=C)`` enrols with every dispatching member of the
group (a member instance started with ``dispatch=True``, :mod:`pcgroups.pool._dispatcher`) and runs up to ``C``
calls at once on the messages they offer. Start and stop workers at will, on any machine: a dispatcher
sees a new worker at its first heartbeat and offers it work at once; a stopped one finishes what it holds
and leaves. The wire contract is :mod:`pcgroups.pool`.

The handler gets a :class:`~pcgroups.consume._delivery.Msg`, as a member instance's handler does: ``subject`` without
the partition token, ``partition``, ``data``, ``headers`` (the message's own), ``metadata``, the acks, and
``superseded``. A worker has no JetStream permission at all: ``ack()`` and ``term()`` are sent to JetStream by
the call's dispatcher, with the call's outcome when it ends (``ack_sync()`` at once: it returns when JetStream
confirmed it, through the dispatcher); ``nak(delay)`` and an exception make the dispatcher retry in place;
``in_progress()`` asks the dispatcher for a ``+WPI`` (it sends those for every message it holds anyway).
``superseded`` is True once the call's dispatcher took the message back (this worker looked gone: paused, cut
off), or no heartbeat of this worker was answered by any instance of the dispatcher's member for
:data:`~pcgroups.pool._wire.DOUBT` (then it may have been, pool invariant 3): a long handler should then stop and not
ack (an ack of a superseded call is not sent). A call whose dispatcher died or lost its pin goes on: the next pin
holder adopts it, and its ack goes there.

The worker is a :class:`~pcgroups.consume._loop.ControlLoop` (``stop()``, ``done()``, ``wait_for_consuming()``,
``async with``); offers and answers are handled in their subscriptions' callbacks, the loop keeps the heartbeat
and the end. ``wait_for_consuming()`` returns once a dispatching member answered. It ends by itself (``done()``
gives None) when a dispatcher says the group was deleted.
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
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeoutError

from ..consume._dispatchers import Handler, _noop, as_handle, failure
from ..consume._instance import Starting
from ..consume._loop import CONTINUE, ControlLoop, Outcome, Stop
from ..consume._msg import Msg, ack_numbers, call_in
from ..consume._report import Reporter
from ..errors import ConfigError, PCGroupsError, SupersededError
from ..events import EventCallback
from ..jetstream._connection import Connection
from ..jetstream._permissions import Violation
from ..tracing import NO_TRACING, Tracing
from . import _wire as pool

log = logging.getLogger("pcgroups")

__all__ = ["WorkerInstance", "default_worker_name", "serve_worker"]

DEFAULT_ACK_WAIT: Final = 5.0
REMEMBER = 60.0  # s at least an ended call's unconfirmed outcome is kept for the next pin holder
REMEMBER_MAX = 4096  # outcomes kept at most
BEATS_KEPT = 64  # heartbeats whose send times are kept (answers and offers name them)
LONELY = 2.5  # s without an answer after which the worker says no dispatcher answers
SYNC_POLL = 0.1  # how often a synchronous ack looks whether its call was adopted or taken back


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


@dataclass(frozen=True)
class GroupEnded:
    """A dispatcher said the group is gone (``why``: ``deleted``)."""

    why: str


WorkerEvent = Stop | Beat | Fatal | GroupEnded


@dataclass
class Call:
    """One offer being handled."""

    msg: Msg
    dispatcher: str  # the dispatching instance's id
    member: str  # its member
    number: int  # the offer's number (its dispatcher counts them up)
    reply: str  # where its acks and outcome go
    started: float
    base: float  # when the heartbeat its offer was made from was sent
    nak: float | None = None
    revoked: bool = False  # taken back by its dispatcher
    fenced: bool = False  # superseded for lost contact (sticky: pool invariant 3)
    want: tuple[str, str] | None = None  # the handler's ack or term (and reason), not superseded when it asked
    confirmed: bool = False  # its dispatcher answered a synchronous ack: JetStream has it
    sync: int = 0  # synchronous acks asked
    waiting: tuple[int, asyncio.Future[str]] | None = field(default=None, repr=False)
    task: asyncio.Task[None] | None = field(default=None, repr=False)


@dataclass
class Ended:
    """A call that ended with ``ack`` or ``term`` whose dispatcher has not confirmed the outcome (pool invariant 1)."""

    outcome: str
    reason: str
    cseq: int  # the consumer sequence of its delivery
    dispatcher: str
    number: int
    at: float


class WorkerHost:
    """What a worker's messages ask of their origin (:class:`~pcgroups.consume._delivery.MsgHost`): the acks go to the
    call's dispatcher; ``supersedes`` is the worker's fence (pool invariant 3)."""

    epoch = 0

    def __init__(self, worker: WorkerInstance):
        self._worker = worker
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    async def publish(self, subject: str, body: bytes) -> None:
        await self._worker._acked(subject, body)

    async def request(self, subject: str, body: bytes, timeout: float) -> None:
        return await self._worker._ack_sync(subject, timeout)

    def call(self, coro: Coroutine[Any, Any, None]) -> Any:
        return call_in(self._loop, self._thread, coro)

    def acked(self, seq: int, epoch: int | None = None) -> None:
        pass  # the dispatcher's Delivery remembers acks

    def supersedes(self, m: Msg) -> bool:
        return self._worker.superseded(m)


class WorkerInstance(ControlLoop[WorkerEvent]):
    """A running worker (see :func:`serve_worker`)."""

    def __init__(
        self,
        nc: Client,
        flavour: str,
        stream: str,
        group: str,
        handler: Handler,
        *,
        name: str,
        capacity: int,
        ack_wait: float,
        auto_in_progress: bool,
        on_event: EventCallback | None,
        tracing: Tracing | None = None,
    ):
        super().__init__()
        self.nc = nc
        self.flavour, self.stream_name, self.group_name = flavour, stream, group
        self.member_name = name
        self.id = secrets.token_hex(4)
        self.capacity = capacity
        self.ack_wait = ack_wait
        self.auto_in_progress = auto_in_progress  # the dispatcher sends +WPI: nothing to do here
        self.prefix = pool.prefix(flavour, stream, group)
        self.handled = 0
        self._handler = as_handle(handler)
        # a call's process span (pcgroups.tracing), its member the dispatcher's: "" until a call says it
        self._trace = NO_TRACING if tracing is None else tracing.instance(flavour, stream, group, "")
        self._host = WorkerHost(self)
        self._calls: dict[Msg, Call] = {}
        self._running: dict[int, Call] = {}  # stream sequence -> its call
        self._by_reply: dict[str, Call] = {}  # a call's message's ack subject (its metadata) -> the call
        self._ended: dict[int, Ended] = {}  # stream sequence -> an outcome its dispatcher may not have
        self._remember = max(REMEMBER, 10 * ack_wait)
        self._n = 0  # heartbeats sent
        self._beats: dict[int, float] = {}  # heartbeat number -> when it was sent (monotonic)
        self._contact: dict[str, float] = {}  # member -> when its last answered heartbeat was sent
        self._answered: dict[str, int] = {}  # dispatcher id -> the last heartbeat it answered
        self._members: dict[str, str] = {}  # dispatcher id -> its member
        self._stopping = False
        self._enrolled = asyncio.Event()
        self._said_waiting = False
        self._lonely = False  # said that no dispatcher answers (after enrolling)
        self._subs: list[Subscription] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._reporter = Reporter(name, on_event=on_event, on_failure=lambda e: self._post(Fatal(e)))
        self._unlisten: Callable[[], None] = lambda: None
        self._unwatch: Callable[[], None] = lambda: None

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
            await self.nc.subscribe(f"{p}.HELLO", cb=self._on_hello),
        ]
        self._launch(f"pcg-worker-{self.member_name}")
        self._post(Beat())
        self._tasks = [asyncio.create_task(self._ticks(), name=f"pcg-worker-hb-{self.member_name}")]

    def _denied(self, violation: Violation) -> None:
        self._post(Fatal(violation.error(pool.worker_subjects(self.prefix, self.member_name, self.id))))

    async def _ticks(self) -> None:
        while True:
            await asyncio.sleep(pool.HEARTBEAT)
            self._post(Beat())

    def _halt(self) -> None:
        self._stopping = True  # pool invariant 4: no new offer from now on

    async def _handle(self, event: WorkerEvent | Stop) -> Outcome:
        match event:
            case Beat():
                await self._beat()
                return CONTINUE
            case Stop():
                await self._drain()
                return None
            case GroupEnded(why=why):
                log.info(
                    "%s: the %s group %s on %s was %s: ending",
                    self.member_name,
                    self.flavour,
                    self.group_name,
                    self.stream_name,
                    why,
                )
                for call in self._calls.values():  # nothing can be acked any more
                    call.revoked = True
                self._ended.clear()
                await self._drain()
                return None
            case Fatal(error=error):
                return error
        return CONTINUE

    async def _beat(self) -> None:
        now = time.monotonic()
        self._n += 1
        self._beats[self._n] = now
        self._beats.pop(self._n - BEATS_KEPT, None)
        held: dict[str, list[int]] = {}
        fenced: list[int] = []
        for call in self._calls.values():
            if call.revoked:
                continue
            held.setdefault(call.dispatcher, []).append(call.msg.stream_sequence)
            if self._fenced(call, now):
                fenced.append(call.msg.stream_sequence)
        hb = pool.Heartbeat(
            self.member_name,
            self.id,
            self.capacity,
            busy=len(self._calls),
            stopping=self._stopping,
            n=self._n,
            held=held,
            fenced=fenced,
            done=self._unconfirmed(now),
        )
        try:
            await self.nc.publish(
                f"{self.prefix}.HB",
                hb.encode(),
                reply=pool.worker_subject(self.prefix, self.member_name, self.id, "hb"),
            )
        except Exception as e:  # disconnected: the next beat tries again
            log.debug("%s: heartbeat not sent: %s", self.member_name, e)
        self._say_alone(now)

    def _unconfirmed(self, now: float) -> dict[int, str]:
        """The outcomes a new pin holder may come for (pool invariant 1): every one its dispatcher has not
        confirmed. Listed from the call's end on, as the call was while it ran: a heartbeat never leaves it out,
        so a new holder that routes by the last heartbeat finds it (the dispatcher confirms most at its next
        answer: a heartbeat lists about a heartbeat's worth of calls)."""
        for seq, e in list(self._ended.items()):
            if now - e.at > self._remember:
                del self._ended[seq]
        while len(self._ended) > REMEMBER_MAX:
            del self._ended[next(iter(self._ended))]
        return {seq: e.outcome for seq, e in self._ended.items()}

    def _say_alone(self, now: float) -> None:
        """No dispatching member answered: said after LONELY at the start, and whenever they all went quiet."""
        last = max(self._contact.values(), default=self._started)
        if now - last <= LONELY:
            return
        where = f"{self.flavour} group {self.group_name} on {self.stream_name}"
        if not self._enrolled.is_set() and not self._said_waiting:
            self._said_waiting = True
            self._reporter.emit("no-dispatcher", detail=where)
        elif self._enrolled.is_set() and not self._lonely:
            self._lonely = True
            self._reporter.emit("no-dispatcher", detail=f"{where}: none answered for {now - last:.1f}s")

    async def _drain(self) -> None:
        """Stop: the calls in flight end first (pool invariant 4), beating meanwhile; their outcomes are kept for a
        moment more while a dispatcher answers (it confirms them, or the next pin holder comes for them); then
        LEAVE."""
        self._stopping = True
        outcomes_until: float | None = None
        while True:
            await self._beat()  # dispatchers learn at once that it takes nothing more, and that it is alive
            tasks = {c.task for c in self._calls.values() if c.task is not None}
            if tasks:
                await asyncio.wait(tasks, timeout=pool.HEARTBEAT)
                continue
            now = time.monotonic()
            outcomes_until = outcomes_until or now + pool.REVOKE_AFTER
            if not self._ended or now >= outcomes_until or now - max(self._contact.values(), default=0.0) > pool.DOUBT:
                break
            await asyncio.sleep(pool.HEARTBEAT / 2)
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
        for call in list(self._calls.values()):  # an error ended it: the calls in flight are abandoned
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
        obj = pool.decode(msg.data)
        if obj is not None and obj.get("end"):
            self._post(GroupEnded(str(obj["end"])))
        elif obj is not None and not self._stopping:
            self._post(Beat())

    async def _on_answer(self, msg: NatsMsg) -> None:
        obj = pool.decode(msg.data)
        if obj is None or "d" not in obj:
            return
        if "sync" in obj:
            self._sync_answered(obj)
            return
        a = pool.Answer.parse(obj)
        if a is None:
            return
        now = time.monotonic()
        for call in self._calls.values():  # doubts first, as they stood before this answer
            self._fenced(call, now)
        sent = self._beats.get(a.n)
        if sent is not None:
            self._contact[a.member] = max(self._contact.get(a.member, 0.0), sent)
            self._answered[a.d] = max(self._answered.get(a.d, 0), a.n)
        fresh = sent is not None and now - sent < pool.OFFER_GRACE  # pool invariant 3
        self._heard_from(a.d, a.member, fresh)
        for call in self._calls.values():
            if call.dispatcher != a.d:
                continue
            seq = call.msg.stream_sequence
            if seq in a.held:
                if fresh:
                    call.fenced = False
            elif call.number <= a.upto and seq not in a.kept:  # taken back: offered elsewhere (invariant 3)
                call.revoked = True
        for seq, e in list(self._ended.items()):  # confirmed: its dispatcher is done with the offer
            if e.dispatcher == a.d and e.number <= a.upto and seq not in a.held and seq not in a.kept:
                del self._ended[seq]

    def _heard_from(self, d: str, member: str, fresh: bool) -> None:
        if self._members.get(d) != member or (self._lonely and fresh):
            self._members[d] = member
            self._lonely = False
            self._reporter.emit("enrolled", detail=member)
        self._enrolled.set()

    def _fenced(self, call: Call, now: float) -> bool:
        """Pool invariant 3: no heartbeat sent in the last DOUBT answered by the call's member, since its offer."""
        if not call.fenced and now - max(self._contact.get(call.member, 0.0), call.base) > pool.DOUBT:
            call.fenced = True
        return call.fenced

    async def _on_offer(self, msg: NatsMsg) -> None:
        headers = dict(msg.headers or {})
        offer = pool.parse_offer_header(headers.pop(pool.OFFER, ""))
        delivery, subject = headers.pop(pool.DELIVERY, ""), headers.pop(pool.SUBJECT, "")
        number = (msg.reply.rsplit(".", 1)[-1] if msg.reply else "").split("-", 1)[0]
        reply = pool.delivery_reply(delivery)
        deliveries, seq, cseq = ack_numbers(reply)
        if offer is None or not subject or not number.isdigit() or not seq:
            log.warning("%s: ignored an offer without its Pcg headers", self.member_name)
            return
        d, member, beat = offer
        now = time.monotonic()
        base = self._beats.get(beat, 0.0)
        fresh = now - base < pool.OFFER_GRACE  # made from a recent heartbeat: not read late (a pause)
        call = self._running.get(seq)
        if call is not None:  # pool invariant 1: adopted, whatever the capacity
            self._adopt(call, d, member, int(number), msg.reply, base, fresh)
            return
        ended = self._ended.get(seq)
        if ended is not None and (deliveries > 1 or cseq == ended.cseq):  # its outcome, not run again
            ended.dispatcher, ended.number, ended.at = d, int(number), now
            await self._reply(msg.reply, pool.Outcome(ended.outcome, reason=ended.reason))
            return
        if self._stopping or len(self._calls) >= self.capacity:
            await self._reply(msg.reply, pool.Outcome("busy"))
            return
        raw = NatsMsg(_client=self.nc, subject=subject, reply=reply, data=msg.data, headers=headers or None)
        m = Msg(raw, self._host, self, None, now)
        m.started = now
        call = Call(m, d, member, int(number), msg.reply, now, base, fenced=not fresh)
        self._calls[m] = self._running[seq] = self._by_reply[reply] = call
        call.task = asyncio.create_task(self._call(call), name=f"pcg-worker-call-{seq}")

    def _adopt(self, call: Call, d: str, member: str, number: int, reply: str, base: float, fresh: bool) -> None:
        """An offer of a call running here: it is that offer's now (its acks and outcome go there). Fresh, it lifts
        a fence or a take-back; read late, it fences the call (pool invariant 3)."""
        log.info("%s: message %d, running here, adopted by %s", self.member_name, call.msg.stream_sequence, d)
        call.dispatcher, call.member, call.number, call.reply = d, member, number, reply
        call.base = max(call.base, base)
        call.revoked = call.revoked and not fresh
        call.fenced = not fresh

    async def _call(self, call: Call) -> None:
        m = call.msg
        error: BaseException | None = None
        try:
            with self._trace.handling(m, {"pcgroups.member": call.member, "pcgroups.worker": self.member_name}):
                await self._handler(m)
        except asyncio.CancelledError:
            self._unregister(call)
            raise
        except Exception as e:
            error = e
        self._unregister(call)
        if call.want is not None:
            kind, reason = call.want
            outcome = pool.Outcome(kind, reason=reason)
            self.handled += 1
            if not call.confirmed:
                self._ended.pop(m.stream_sequence, None)
                self._ended[m.stream_sequence] = Ended(
                    kind, reason, m.consumer_sequence, call.dispatcher, call.number, time.monotonic()
                )
        elif isinstance(error, SupersededError):
            outcome = pool.Outcome("dropped", reason="superseded")
        elif error is not None or call.nak is not None:
            outcome = pool.Outcome("retry", call.nak or 0.0, failure(error))  # the reason a dead letter keeps
        elif m.settled or call.revoked or self._fenced(call, time.monotonic()):
            outcome = pool.Outcome("dropped", reason="superseded")
        else:
            outcome = pool.Outcome("none")
        await self._reply(call.reply, outcome)
        if not self._calls and self._stopping:
            self._post(Beat())

    def _unregister(self, call: Call) -> None:
        self._calls.pop(call.msg, None)
        self._running.pop(call.msg.stream_sequence, None)
        self._by_reply.pop(call.msg.reply, None)

    async def _reply(self, subject: str, outcome: pool.Outcome) -> None:
        try:
            await self.nc.publish(subject, outcome.encode())
        except Exception as e:  # disconnected: an ack or term is kept and listed; the rest is offered again
            log.debug("%s: outcome not sent: %s", self.member_name, e)

    # --- what Msg asks: the acks (through the dispatcher), nak, and the fence ---------------------------
    async def _acked(self, subject: str, body: bytes) -> None:
        """``ack()``, ``term()``, ``in_progress()`` of a call's message: an ack or a term is sent with the call's
        outcome (unless the call is superseded: then it is not sent at all), a progress at once."""
        call = self._by_reply.get(subject)
        if call is None:
            return
        if body == b"+WPI":
            await self._send(call, {"ack": "progress"})
        elif (body == b"+ACK" or body.startswith(b"+TERM")) and not self.superseded(call.msg):
            call.want = ("ack", "") if body == b"+ACK" else ("term", body[6:].decode(errors="replace"))

    async def _ack_sync(self, subject: str, timeout: float) -> None:
        """``ack_sync()``: the call's dispatcher acks and answers with what JetStream answered. Asked again of the
        dispatcher that adopts the call meanwhile; :class:`SupersededError` when the call is superseded (not
        acked). A timeout leaves the ack to be sent with the call's outcome."""
        call = self._by_reply.get(subject)
        if call is None or self.superseded(call.msg):
            raise SupersededError(
                f"message {ack_numbers(subject)[1]} was not acked: it was taken back, or this "
                "worker lost contact with its dispatchers"
            )
        call.sync += 1
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        call.waiting = (call.sync, fut)
        deadline = time.monotonic() + timeout
        sent_to = ""
        try:
            while not fut.done():
                if call.revoked:
                    raise SupersededError(f"message {call.msg.stream_sequence} was not acked: it was taken back")
                if call.reply != sent_to:  # first, or adopted by another dispatcher since
                    sent_to = call.reply
                    await self._send(call, {"ack": "ack", "sync": call.sync})
                left = deadline - time.monotonic()
                if left <= 0:
                    call.want = ("ack", "")
                    raise NatsTimeoutError
                await asyncio.wait({fut}, timeout=min(left, SYNC_POLL))
        finally:
            call.waiting = None
        error = fut.result()
        if error:
            raise PCGroupsError(f"message {call.msg.stream_sequence} was not acked: {error}")
        call.want, call.confirmed = ("ack", ""), True

    def _sync_answered(self, obj: dict[str, Any]) -> None:
        call = next((c for c in self._calls.values() if c.reply.endswith("." + str(obj.get("token")))), None)
        if (
            call is not None
            and call.waiting is not None
            and call.waiting[0] == obj.get("sync")
            and not call.waiting[1].done()
        ):
            call.waiting[1].set_result(str(obj.get("error") or ""))

    async def _send(self, call: Call, body: dict[str, Any]) -> None:
        try:
            await self.nc.publish(call.reply, pool.encode(body))
        except Exception as e:  # disconnected: a synchronous ack asks again when adopted, or times out
            log.debug("%s: ack not sent: %s", self.member_name, e)

    def nak(self, m: Msg, delay: float | None) -> Any:
        """``msg.nak(delay)`` at a worker: the dispatcher retries the message in place (nothing goes to
        JetStream)."""
        call = self._calls.get(m)
        if call is not None:
            call.nak = delay or 0.0
        return _noop()

    def superseded(self, m: Msg) -> bool:
        """Pool invariant 3: taken back by its dispatcher, or no answered heartbeat for DOUBT (sticky)."""
        call = self._calls.get(m)
        if call is None:
            return False
        return call.revoked or self._fenced(call, time.monotonic())

    _started = 0.0


def serve_worker(
    nc: Client,
    flavour: str,
    stream: str,
    group: str,
    handler: Handler,
    *,
    name: str | None = None,
    capacity: int = 1,
    ack_wait: float = DEFAULT_ACK_WAIT,
    auto_in_progress: bool = True,
    on_event: EventCallback | None = None,
    tracing: Tracing | None = None,
) -> Starting[WorkerInstance]:
    """Run a worker of ``group``'s pool (``flavour`` ``"static"`` or ``"elastic"``): up to ``capacity`` calls of
    ``handler`` at once on what the group's dispatching members offer (see the module docstring).

    ``name`` (default ``<host>-<pid>``) names it in status, metrics and permissions; ``ack_wait`` is the
    member consumers' AckWait (the outcomes of ended calls are kept for 10 times as long, a minute at least, for a
    pin holder that comes for them); ``auto_in_progress`` is kept for compatibility (the dispatcher sends ``+WPI``
    for the messages at its workers). ``on_event`` gets ``enrolled`` (a dispatching member answered, ``detail``
    names it), ``no-dispatcher`` (none answered yet, or none for a while: ``detail`` names the group, and how long),
    ``disconnected`` and ``reconnected``. Await the result for the worker, or use it directly: ``async with
    serve_worker(...) as w``. ``tracing``: a process span per call (:mod:`pcgroups.tracing`; ``pcgroups.member``
    the dispatching member's, ``pcgroups.worker`` this worker's name), continuing the producer's trace from the
    message's headers.
    """
    return Starting(
        _serve(
            nc,
            flavour,
            stream,
            group,
            handler,
            name=name,
            capacity=capacity,
            ack_wait=ack_wait,
            auto_in_progress=auto_in_progress,
            on_event=on_event,
            tracing=tracing,
        )
    )


async def _serve(
    nc: Client,
    flavour: str,
    stream: str,
    group: str,
    handler: Handler,
    *,
    name: str | None,
    capacity: int,
    ack_wait: float,
    auto_in_progress: bool,
    on_event: EventCallback | None,
    tracing: Tracing | None,
) -> WorkerInstance:
    if flavour not in ("static", "elastic"):
        raise ConfigError(f"invalid flavour {flavour!r}: static or elastic")
    name = name or default_worker_name()
    pool.check_worker_name(name)
    if capacity < 1:
        raise ConfigError(f"capacity must be >= 1, got {capacity}")
    if ack_wait <= 0:
        raise ConfigError(f"ack_wait must be positive, got {ack_wait}")
    worker = WorkerInstance(
        nc,
        flavour,
        stream,
        group,
        handler,
        name=name,
        capacity=capacity,
        ack_wait=ack_wait,
        auto_in_progress=auto_in_progress,
        on_event=on_event,
        tracing=tracing,
    )
    worker._started = time.monotonic()
    await worker._start()
    return worker

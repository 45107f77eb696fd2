"""The dispatching side of the worker pool: a member instance that hands its messages to workers.

An instance started with ``dispatch=True`` pulls its member's consumer like any other (pins, standbys,
take-overs: :mod:`pcgroups.consume._session`), but its dispatcher is a :class:`PoolDispatcher`: the keyed dispatcher
of :mod:`pcgroups.consume._dispatchers` (one message per key at once, keys served in turn, retries in place, dead
letters), whose handler offers the message to a worker and waits for the worker's outcome. The wire contract
is :mod:`pcgroups.pool`; the worker is :mod:`pcgroups.pool._worker`.

:class:`Roster` is one instance's view of the group's workers, kept from their heartbeats (standbys keep it
too, so a take-over starts with the workers known). Who calls what:

- the **subscriptions** (heartbeats, leaves, outcomes, status requests) update it and answer heartbeats
  and status requests (standbys too: an idle member has no pin, and its workers must still enrol);
- the **reaper** (a task, every :data:`REAP_EVERY`) takes back the offers of workers silent for
  :data:`~pcgroups.pool.REVOKE_AFTER` and of offers a heartbeat did not list, says ``HELLO`` when the pin is
  gained, and tells the dispatcher how many slots the pool has (:meth:`PoolDispatcher.resize`);
- the **keyed dispatcher's calls** run :meth:`Roster.run` for each message.

Invariants, besides those of :mod:`pcgroups.pool`:

1. :meth:`Roster.run` returns only when a worker settled the message (``ack``, ``term``), or left it to
   AckWait (``none``), or the instance stops (a message at a worker stays there: its call goes on and acks, and
   the next pin holder waits for it; one no worker had taken is nak'd); it raises :class:`~pcgroups.consume._dispatchers.RetryLater` for ``retry``; a ``busy``, a
   ``dropped``, a silent worker or a lost offer offer the message again, to the freest worker.
2. The pool's slots (the sum of the capacities of the workers not stopping, at most ``max_in_flight`` when
   given) are the keyed dispatcher's concurrency: with no worker nothing is handed out and messages wait,
   with ``+WPI``.
3. Nothing of this runs a handler in the dispatching process, and a message is offered only while the
   instance may start handlers (the session's take-over and pin rules hold as for local handlers).
4. A worker is declared gone only for a silence heard while this instance was connected: while it is
   disconnected nobody is, and after a reconnect every worker's silence counts from then (a server restart
   takes no message back from a worker that goes on with it).
5. A message that can not be offered (it would exceed the server's max payload with the offer's headers)
   counts as a failed attempt: retried, then dead-lettered (or terminated) like a failing call.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg

from . import _wire as pool
from ..jetstream._connection import Connection
from ..consume._delivery import PIN_HEADER, Delivery, Msg, message_size
from ..consume._dispatchers import ConsumerControl, KeyedDispatcher
from ..consume._keys import KeyFunc
from ..consume._retry import RetryLater, RetryPolicy
from ..consume._options import Member, WorkerNews

log = logging.getLogger("pcgroups")

REAP_EVERY = 0.25
STOPPED = "stopped"   # an offer's outcome of our own (not on the wire): this instance stopped while it was out


@dataclass
class Offer:
    """A message offered to a worker, waiting for its outcome."""

    seq: int
    worker: WorkerView
    token: str
    sent: float
    outcome: asyncio.Future[pool.Outcome] = field(repr=False)
    missing: float | None = None   # when a heartbeat first did not list it (its outcome may be on the way)


@dataclass
class WorkerView:
    """A worker as one dispatching instance sees it."""

    name: str
    id: str
    capacity: int
    work_subject: str
    seen: float
    others: int = 0          # calls it runs for other dispatchers (its last heartbeat's busy less those for us)
    stopping: bool = False
    handled: int = 0
    offers: dict[str, Offer] = field(default_factory=dict)   # token -> our offer waiting for it
    last_offer: float = 0.0

    @property
    def free(self) -> int:
        """Slots it has for us: its capacity less our offers waiting for it and the calls its last heartbeat said it
        runs for other dispatchers. (Its count of our calls is stale once one ends, and the outcome that says so
        may be read before the heartbeat: they come on different subscriptions. A call of ours taken back and
        still running there is not counted: an offer it has no slot for is answered ``busy``.)"""
        return 0 if self.stopping else max(self.capacity - len(self.offers) - self.others, 0)


@dataclass(frozen=True)
class PoolSpec:
    """What a dispatching instance needs to know of its pool: the group, its member, the cap on messages in
    flight across the workers (0: the workers' capacities), and whom to tell of workers joining and leaving
    (``on_worker(kind, name, detail)``, kinds ``worker-joined`` / ``worker-left``)."""

    flavour: str
    stream: str
    group: str
    member: str
    max_in_flight: int = 0
    on_worker: Callable[[str, str, str], None] | None = None


class Roster:
    """The workers of a group as one dispatching instance sees them (see the module docstring)."""

    def __init__(self, nc: Client, delivery: Delivery, spec: PoolSpec):
        self.nc = nc
        self.spec = spec
        self.id = secrets.token_hex(6)
        self.prefix = pool.prefix(spec.flavour, spec.stream, spec.group)
        self._delivery = delivery
        self._workers: dict[str, WorkerView] = {}
        self._subs: list[Any] = []
        self._token = 0                     # offers are numbered up from 1
        self._offers: dict[str, Offer] = {}
        self._free = asyncio.Event()       # a slot may have freed: waiting runs look again
        self._reaper: asyncio.Task[None] | None = None
        self._announced: str | None = None  # the pin HELLO was said for
        self._unlisten: Callable[[], None] = lambda: None
        self._away = False   # disconnected, until the reconnect was heard (invariant 4)
        self.on_resize: Callable[[int], None] = lambda slots: None
        self.status_of: Callable[[], dict[str, Any]] = self.status
        self.handled = 0
        self.retried = 0

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        p = self.prefix
        self._subs = [await self.nc.subscribe(f"{p}.HB", cb=self._on_heartbeat),
                      await self.nc.subscribe(f"{p}.LEAVE", cb=self._on_leave),
                      await self.nc.subscribe(f"{p}.D.{self.id}.R.*", cb=self._on_outcome),
                      await self.nc.subscribe(pool.STATUS_SUBJECT, cb=self._on_status),
                      await self.nc.subscribe(f"{p}.STATUS", cb=self._on_status)]
        self._reaper = asyncio.create_task(self._reap(), name=f"pcg-roster-{self.spec.member}")
        self._unlisten = Connection.of(self.nc).watch.listen(self._connection)

    def _connection(self, kind: str, url: str) -> None:
        """Away, then back from a disconnection: the workers were silent because this instance was away
        (invariant 4), so their silence counts from the reconnect. (nats-py says it is connected a moment before
        it says so to the listeners: the reaper waits for the listeners' word.)"""
        if kind == "disconnected":
            self._away = True
        elif kind == "reconnected":
            now = time.monotonic()
            for w in self._workers.values():
                w.seen = now
            self._away = False

    async def stop(self) -> None:
        self._unlisten()
        if self._reaper is not None:
            self._reaper.cancel()
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:  # the connection is closed already
                pass
        for offer in list(self._offers.values()):   # still at a worker: its call goes on, with +WPI, and acks
            _resolve(offer.outcome, pool.Outcome(STOPPED))

    @property
    def pinned(self) -> bool:
        return self._delivery.pin_id is not None

    def slots(self) -> int:
        """The pool's slots for this instance (invariant 2)."""
        total = sum(w.capacity for w in self._workers.values() if not w.stopping)
        cap = self.spec.max_in_flight
        return min(total, cap) if cap > 0 else total

    def workers(self) -> list[WorkerView]:
        return sorted(self._workers.values(), key=lambda w: w.name)

    @property
    def in_flight(self) -> int:
        return len(self._offers)

    # --- the handler of the keyed dispatcher (invariant 1) ---------------------------------------
    async def run(self, m: Msg) -> None:
        while True:
            worker = await self._freest()
            if worker is None:   # the instance stops before a worker was free: back to the server at once
                await self._delivery.nak_quietly(m)
                return
            result = await self._offer(worker, m)
            match result.outcome:
                case "ack":
                    m._settled(acked=True)
                    self._done(worker)
                    return
                case "term":
                    m._settled(acked=False)
                    self._done(worker)
                    return
                case "none":
                    self._done(worker)
                    return
                case "stopped":   # this instance stops: the worker's call goes on (the next holder waits for it)
                    return
                case "retry":
                    self.retried += 1
                    raise RetryLater(result.reason or "nak", result.delay)
                case "busy":   # full with others' calls: until its next heartbeat says otherwise
                    worker.others = max(worker.capacity - len(worker.offers), 1)
                case _:   # dropped, or taken back (a silent worker, a lost offer): offer it again
                    log.info("%s: message %d back from worker %s (%s): offering it again", self.spec.member,
                             m.sequence, worker.name, result.reason or result.outcome)

    def _done(self, worker: WorkerView) -> None:
        worker.handled += 1
        self.handled += 1

    async def _freest(self) -> WorkerView | None:
        """The worker with the most free slots (the least recently offered among equals); waits for one."""
        while True:
            live = [w for w in self._workers.values() if w.free > 0]
            if live:
                best = max(live, key=lambda w: (w.free, -w.last_offer))
                best.last_offer = time.monotonic()
                return best
            if self._delivery.halted:
                return None
            self._free.clear()
            try:
                await asyncio.wait_for(self._free.wait(), REAP_EVERY)
            except asyncio.TimeoutError:
                pass

    async def _offer(self, worker: WorkerView, m: Msg) -> pool.Outcome:
        self._token += 1
        token = f"{self._token}-{secrets.token_hex(8)}"   # numbered (the workers' upto), and not to be guessed
        offer = Offer(m.stream_sequence, worker, token, time.monotonic(),
                      asyncio.get_running_loop().create_future())
        headers = {k: v for k, v in (m.headers or {}).items() if k != PIN_HEADER}
        headers.update({pool.ACK: m.reply, pool.SUBJECT: m.partitioned_subject, pool.PIN: m.pin_id or "",
                        pool.DISPATCHER: self.id})
        if message_size(m.data, headers) > self.nc.max_payload:   # invariant 5
            return pool.Outcome("retry", reason=f"too large to hand to a worker: {message_size(m.data, headers)} "
                                                f"bytes with the offer's headers, over the max payload "
                                                f"({self.nc.max_payload})")
        worker.offers[token] = self._offers[token] = offer
        try:
            await self.nc.publish(worker.work_subject, m.data, reply=f"{self.prefix}.D.{self.id}.R.{token}",
                                  headers=headers)
            return await offer.outcome
        except Exception as e:   # not sent (disconnected): offered again
            log.warning("%s: offer of message %d to worker %s failed: %s", self.spec.member, m.sequence,
                        worker.name, e)
            await asyncio.sleep(REAP_EVERY)
            return pool.Outcome("dropped", reason=str(e))
        finally:
            self._forget(offer)

    def _forget(self, offer: Offer) -> None:
        self._offers.pop(offer.token, None)
        offer.worker.offers.pop(offer.token, None)
        self._free.set()

    # --- what the workers say ---------------------------------------------------------------------
    async def _on_heartbeat(self, msg: NatsMsg) -> None:
        hb = pool.Heartbeat.parse(msg.data)
        if hb is None:
            return
        now = time.monotonic()
        w = self._workers.get(hb.id)
        if w is None:
            w = self._workers[hb.id] = WorkerView(hb.name, hb.id, hb.capacity,
                                                   pool.worker_subject(self.prefix, hb.name, hb.id, "work"), now)
            self._said("worker-joined", w, f"capacity {hb.capacity}")
            self._resized()
        changed = (w.capacity, w.stopping) != (hb.capacity, hb.stopping)
        held = set(hb.held.get(self.id, ()))
        w.seen, w.capacity, w.stopping = now, hb.capacity, hb.stopping
        w.others = max(hb.busy - len(held), 0)   # ours are our offers (its count of them is stale once one ends)
        for offer in list(w.offers.values()):   # pool invariant 2: an offer it does not know of was lost
            if offer.seq in held or now - offer.sent <= pool.OFFER_GRACE:
                offer.missing = None
            elif offer.missing is None:
                # Its call may have just ended: the outcome, sent before this heartbeat, comes on another
                # subscription and may be read after it. Lost only if a later heartbeat still misses it.
                offer.missing = now
            elif now - offer.missing >= pool.HEARTBEAT / 2:
                _resolve(offer.outcome, pool.Outcome("dropped", reason="the worker never got it"))
        if changed:
            self._resized()
        self._free.set()
        body = pool.encode({"d": self.id, "member": self.spec.member, "upto": self._token,
                            "held": sorted(o.seq for o in w.offers.values())})
        try:   # on the worker's own subject, not the heartbeat's reply subject (pool invariant 5)
            await self.nc.publish(pool.worker_subject(self.prefix, w.name, w.id, "hb"), body)
        except Exception as e:  # disconnected: it asks again
            log.debug("%s: heartbeat answer not sent: %s", self.spec.member, e)

    async def _on_leave(self, msg: NatsMsg) -> None:
        obj = pool.decode(msg.data)
        if obj is not None and str(obj.get("id")) in self._workers:
            self._gone(self._workers[str(obj["id"])], "stopped")

    async def _on_outcome(self, msg: NatsMsg) -> None:
        offer = self._offers.get(msg.subject.rsplit(".", 1)[-1])
        result = pool.Outcome.parse(msg.data)
        if offer is not None and result is not None:
            _resolve(offer.outcome, result)

    async def _on_status(self, msg: NatsMsg) -> None:
        if msg.reply and not msg.reply.startswith("$"):   # an inbox, never a JetStream or KV subject (invariant 5)
            try:
                await self.nc.publish(msg.reply, pool.encode(self.status_of()))
            except Exception:  # disconnected
                pass

    def status(self) -> dict[str, Any]:
        """What ``cg status`` and the exporter show of this dispatching instance."""
        s = self.spec
        return {"flavour": s.flavour, "stream": s.stream, "group": s.group, "member": s.member, "d": self.id,
                "in_flight": self.in_flight, "handled": self.handled, "retried": self.retried,
                "waiting": self._delivery.buffered, "slots": self.slots(), "pinned": self.pinned,
                "workers": [{"name": w.name, "id": w.id, "capacity": w.capacity, "busy": len(w.offers),
                             "handled": w.handled, "stopping": w.stopping} for w in self.workers()]}

    # --- the reaper (pool invariant 2) -------------------------------------------------------------
    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(REAP_EVERY)
            now = time.monotonic()
            for w in list(self._workers.values()):
                if now - w.seen > pool.REVOKE_AFTER and self.nc.is_connected and not self._away:
                    self._gone(w, f"no heartbeat for {now - w.seen:.1f}s")
            pin = self._delivery.pin_id
            if pin is not None and pin != self._announced:
                self._announced = pin
                try:
                    await self.nc.publish(f"{self.prefix}.HELLO", pool.encode({"d": self.id,
                                                                             "member": self.spec.member}))
                except Exception as e:  # disconnected: the workers' heartbeats find us anyway
                    log.debug("%s: HELLO not sent: %s", self.spec.member, e)
            elif pin is None:
                self._announced = None

    def _gone(self, w: WorkerView, why: str) -> None:
        self._workers.pop(w.id, None)
        for offer in list(w.offers.values()):
            _resolve(offer.outcome, pool.Outcome("dropped", reason=f"worker {w.name} gone: {why}"))
        self._said("worker-left", w, why)
        self._resized()

    def _resized(self) -> None:
        self.on_resize(self.slots())
        self._free.set()

    def _said(self, kind: str, w: WorkerView, detail: str) -> None:
        if self.spec.on_worker is not None:
            self.spec.on_worker(kind, w.name, detail)


async def pool_status(nc: Client, flavour: str | None = None, stream: str | None = None, group: str | None = None, *,
                      timeout: float = 0.5, quiet: float = 0.1) -> list[dict[str, Any]]:
    """What every dispatching instance of a group (of every group, with no group named) says of its pool:
    :meth:`Roster.status` answers, gathered until ``quiet`` passed without one (at most ``timeout``; at once
    when nobody listens)."""
    subject = (f"{pool.prefix(flavour, stream, group)}.STATUS" if flavour and stream and group
               else pool.STATUS_SUBJECT)
    inbox = nc.new_inbox()
    answers: list[dict[str, Any]] = []
    came = asyncio.Event()

    async def answer(msg: NatsMsg) -> None:
        if msg.headers and msg.headers.get("Status") == "503":   # no responders: no dispatching instance
            came.set()
            answers.append({})
            return
        obj = pool.decode(msg.data)
        if obj is not None:
            answers.append(obj)
            came.set()

    sub = await nc.subscribe(inbox, cb=answer)
    try:
        await nc.publish(subject, b"", reply=inbox)
        deadline = time.monotonic() + timeout
        wait = timeout
        while wait > 0:
            came.clear()
            try:
                await asyncio.wait_for(came.wait(), wait)
            except asyncio.TimeoutError:
                break
            if answers and answers[-1] == {}:
                break
            wait = min(quiet, deadline - time.monotonic())
    finally:
        await sub.unsubscribe()
    return [a for a in answers if a]


def _resolve(fut: asyncio.Future[pool.Outcome], outcome: pool.Outcome) -> None:
    if not fut.done():
        fut.set_result(outcome)


class PoolDispatcher(KeyedDispatcher):
    """A keyed dispatcher whose calls run on the group's workers (see the module docstring)."""

    def __init__(self, nc: Client, delivery: Delivery, consumer: ConsumerControl, spec: PoolSpec, *, key: KeyFunc,
                 retry: RetryPolicy):
        self.roster = Roster(nc, delivery, spec)
        super().__init__(delivery, self.roster.run, consumer, concurrency=0, key=key, retry=retry)
        self.roster.on_resize = self.resize
        self.roster.status_of = self.status

    def resize(self, slots: int) -> None:
        """The pool has ``slots`` now (invariant 2): hand out up to that many messages at once."""
        self.concurrency = slots
        self.on_resize(slots)
        self._delivery.wake()

    def status(self) -> dict[str, Any]:
        """The roster's status, with every message held and not at a worker counted as waiting."""
        out = self.roster.status()
        out["waiting"] = self._delivery.buffered + self._queued
        return out

    async def run(self) -> None:
        await self.roster.start()
        try:
            await super().run()
        finally:
            await self.roster.stop()


@dataclass(frozen=True)
class WorkerPool:
    """The group's workers as a dispatching instance's handlers (the consume core's ``Remote``): the flavour
    that starts an instance with ``dispatch=True`` hands it one, capped at ``max_in_flight`` messages at the
    workers at once (0: their capacities)."""

    max_in_flight: int = 0

    def dispatcher(self, nc: Client, delivery: Delivery, control: ConsumerControl, member: Member, *,
                   key: KeyFunc, retry: RetryPolicy, on_worker: WorkerNews) -> PoolDispatcher:
        spec = PoolSpec(member.flavour, member.stream, member.group, member.member, self.max_in_flight,
                        on_worker=on_worker)
        return PoolDispatcher(nc, delivery, control, spec, key=key, retry=retry)

    def subjects(self, member: Member) -> list[str]:
        return pool.dispatcher_subjects(pool.prefix(member.flavour, member.stream, member.group))

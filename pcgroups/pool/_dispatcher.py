"""The dispatching side of the worker pool: a member instance that hands its messages to workers.

An instance started with ``dispatch=True`` pulls its member's consumer like any other (pins, standbys,
take-overs: :mod:`pcgroups.consume._session`), but its dispatcher is a :class:`PoolDispatcher`: the keyed dispatcher
of :mod:`pcgroups.consume._dispatchers` (one message per key at once, keys served in turn, retries in place, dead
letters), whose handler offers the message to a worker and waits for the worker's outcome. The wire contract
is :mod:`pcgroups.pool`; the worker is :mod:`pcgroups.pool._worker`.

:class:`Roster` is one instance's view of the group's workers, kept from their heartbeats (standbys keep it
too, so a take-over starts with the workers known). Who calls what:

- the **subscriptions** (heartbeats, leaves, acks and outcomes, status requests) update it and answer
  heartbeats, synchronous acks and status requests (standbys too: an idle member has no pin, and its workers must
  still enrol, and hear from their member while its pinned instance is away);
- the **reaper** (a task, every :data:`REAP_EVERY`) takes back the offers of workers silent for
  :data:`~pcgroups.pool.REVOKE_AFTER` and of offers a heartbeat did not list, gives up offers whose message was
  lost, says ``HELLO`` when the pin is gained, and tells the dispatcher how many slots the pool has
  (:meth:`PoolDispatcher.resize`);
- the **keyed dispatcher's calls** run :meth:`Roster.run` for each message.

Invariants, besides those of :mod:`pcgroups.pool`:

1. :meth:`Roster.run` returns only when a worker settled the message (``ack``, ``term``: sent to JetStream by
   this instance, through the message's :class:`~pcgroups.consume._delivery.Msg`, so the Delivery's acks, epochs and
   superseded rules hold), or left it to AckWait (``none``), or the instance stops (a message at a worker stays
   there: its call goes on, and the next pin holder adopts it; one no worker had taken is nak'd); it raises
   :class:`~pcgroups.consume._retry.RetryLater` for ``retry``, and :class:`~pcgroups.errors.SupersededError` when it
   gives the message up, neither settled nor nak'd (:meth:`Delivery.lost <pcgroups.consume._delivery.Delivery.lost>`:
   another instance has it, or will); a ``busy``, a ``dropped``, a silent worker or a lost offer offer the
   message again.
2. The pool's slots (the sum of the capacities of the workers not stopping, at most ``max_in_flight`` when
   given) are the keyed dispatcher's concurrency: with no worker nothing is handed out and messages wait,
   with ``+WPI``. This instance sends ``+WPI`` for every message it holds, those at workers included.
3. Nothing of this runs a handler in the dispatching process. A message is offered (the first time and every
   time again) only under a pin held for sure: while the pin is in doubt, or the instance is disconnected (a
   publish is then held back until the reconnect, when the pin may have moved), the offer waits; once the message's pin
   was lost, or the instance stops, it is given up (or nak'd: a pin that moved while it was held for sure, a
   stop). An offer out at a worker is given up (not taken back: the worker goes on, and the next pin holder
   adopts its call) once its message is lost; a worker's ack waits as an offer does, and is not sent once the
   message is lost.
4. A worker is declared gone only for a silence heard while this instance was connected and running: while it
   is disconnected, stalled (a reaper pass much later than :data:`REAP_EVERY`: a SIGSTOP, a blocked loop) or
   its pin is in doubt, nobody is, and afterwards every worker's silence counts from then (a server restart or a
   pause takes no message back from a worker that goes on with it).
5. A message that can not be offered (it would exceed the server's max payload with the offer's headers)
   counts as a failed attempt: retried, then dead-lettered (or terminated) like a failing call.
6. An offer goes to the worker whose last heartbeat lists its stream sequence, if one does (pool invariant 1: it
   adopts the call, or answers with its outcome), else to the freest worker. A worker lists a call from its
   offer until its dispatcher confirmed the outcome, running or ended, without a gap. A redelivered message
   (delivery count above 1) is offered only once this instance said ``HELLO`` for its pin and every worker it
   knows beat since (and since its last reconnect or stall): their lists are those of now, not of before an
   outage.
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

from ..consume._delivery import Delivery
from ..consume._dispatchers import ConsumerControl, KeyedDispatcher
from ..consume._keys import KeyFunc
from ..consume._msg import PIN_HEADER, Msg, message_size
from ..consume._options import Member, WorkerNews
from ..consume._retry import RetryLater, RetryPolicy
from ..errors import SupersededError
from ..jetstream._connection import Connection
from . import _wire as pool

log = logging.getLogger("pcgroups")

REAP_EVERY = 0.25
STALLED = 4 * REAP_EVERY  # a reaper pass this late: this process was stalled (invariant 4)
WAIT_POLL = 0.05  # how often an offer or an ack waiting for the pin looks again
KEEP = 60.0  # s an offer given up is listed as kept (the next holder adopts it meanwhile)
# outcomes of our own (not on the wire)
STOPPED = "stopped"  # this instance stopped while the offer was out
GIVEN_UP = "given-up"  # its message was lost while the offer was out (invariant 3)
LOST = "lost"  # what settling a lost message says
NONCES = 256  # offer tokens' random parts drawn at once (one read of the OS's randomness)


@dataclass
class Offer:
    """A message offered to a worker, waiting for its outcome."""

    msg: Msg
    worker: WorkerView
    token: str
    number: int
    sent: float
    outcome: asyncio.Future[pool.Outcome] = field(repr=False)
    missing: float | None = None  # when a heartbeat first did not list it (its outcome may be on the way)

    @property
    def seq(self) -> int:
        return self.msg.stream_sequence


@dataclass
class WorkerView:
    """A worker as one dispatching instance sees it."""

    name: str
    id: str
    capacity: int
    prefix: str
    seen: float
    others: int = 0  # calls it runs for other dispatchers (its last heartbeat's busy less those for us)
    stopping: bool = False
    handled: int = 0
    beat: int = 0  # the number of its last heartbeat
    offers: dict[str, Offer] = field(default_factory=dict)  # token -> our offer waiting for it
    kept: dict[int, float] = field(default_factory=dict)  # stream sequence -> when we gave its offer up
    listed: set[int] = field(default_factory=set)  # what its last heartbeat lists (running, or ended)
    fenced: set[int] = field(default_factory=set)  # of those, what it runs superseded for lost contact
    last_offer: float = 0.0

    @property
    def free(self) -> int:
        """Slots it has for us: its capacity less our offers waiting for it and the calls its last heartbeat said it
        runs for other dispatchers. (Its count of our calls is stale once one ends, and the outcome that says so
        may be read before the heartbeat: they come on different subscriptions. A call of ours taken back and
        still running there is not counted: an offer it has no slot for is answered ``busy``.)"""
        return 0 if self.stopping else max(self.capacity - len(self.offers) - self.others, 0)

    def subject(self, kind: str) -> str:
        return pool.worker_subject(self.prefix, self.name, self.id, kind)


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
        self._token = 0  # offers are numbered up from 1
        self._nonces: list[str] = []
        self._offers: dict[str, Offer] = {}
        self._free = asyncio.Event()  # a slot may have freed: waiting runs look again
        self._reaper: asyncio.Task[None] | None = None
        self._acking: set[asyncio.Task[None]] = set()  # workers' acks on their way to JetStream
        self._announced: str | None = None  # the pin HELLO was said for
        self._unlisten: Callable[[], None] = lambda: None
        self._away = False  # disconnected, until the reconnect was heard (invariant 4)
        self._listening = time.monotonic()  # the workers' heartbeats after this count (invariant 6)
        self.on_resize: Callable[[int], None] = lambda slots: None
        self.status_of: Callable[[], dict[str, Any]] = self.status
        self.handled = 0
        self.retried = 0

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        p = self.prefix
        self._listening = time.monotonic()
        self._subs = [
            await self.nc.subscribe(f"{p}.HB", cb=self._on_heartbeat),
            await self.nc.subscribe(f"{p}.LEAVE", cb=self._on_leave),
            await self.nc.subscribe(f"{p}.D.{self.id}.R.*", cb=self._on_reply),
            await self.nc.subscribe(pool.STATUS_SUBJECT, cb=self._on_status),
            await self.nc.subscribe(f"{p}.STATUS", cb=self._on_status),
        ]
        self._reaper = asyncio.create_task(self._reap(), name=f"pcg-roster-{self.spec.member}")
        self._unlisten = Connection.of(self.nc).watch.listen(self._connection)

    def _connection(self, kind: str, url: str) -> None:
        """Away, then back from a disconnection: the workers were silent because this instance was away
        (invariant 4), so their silence counts from the reconnect. (nats-py says it is connected a moment before
        it says so to the listeners: the reaper waits for the listeners' word.)"""
        if kind == "disconnected":
            self._away = True
        elif kind == "reconnected":
            self._heard_all(time.monotonic())
            self._delivery.doubt_pin()  # invariant 3: confirmed by consumer info before anything is offered or acked
            self._away = False

    def _heard_all(self, now: float) -> None:
        """After a gap in what this instance could hear (invariant 4): every worker as if heard now."""
        for w in self._workers.values():
            w.seen = now
        for offer in self._offers.values():
            offer.missing = None
        self._listening = now

    async def stop(self) -> None:
        self._unlisten()
        if self._reaper is not None:
            self._reaper.cancel()
        for task in list(self._acking):
            task.cancel()
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:  # the connection is closed already
                pass
        for offer in list(self._offers.values()):  # still at a worker: its call goes on, the next holder adopts it
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
        d = self._delivery
        while True:
            clear = await self._clear(m)
            if clear == LOST:
                raise SupersededError(f"message {m.stream_sequence} given up: its pin was lost")
            if clear == "back":  # stopping, or the pin moved: back to the server at once
                if d.current(m):
                    await d.nak_quietly(m)
                return  # (a pin that moved: the keyed dispatcher naks it, for the new holder)
            worker = self._holder(m.stream_sequence) or self._freest()
            if worker is None:
                self._free.clear()
                try:
                    await asyncio.wait_for(self._free.wait(), REAP_EVERY)
                except TimeoutError:
                    pass
                continue
            result = await self._offer(worker, m)
            match result.outcome:
                case "ack" | "term":
                    if await self._settle(m, result.outcome, result.reason) == LOST:
                        self._keep(worker, m)
                        raise SupersededError(f"message {m.stream_sequence} not acked: its pin was lost")
                    self._done(worker)
                    return
                case "none":
                    self._done(worker)
                    return
                case "stopped":  # this instance stops: the worker's call goes on (the next holder adopts it)
                    return
                case "given-up":
                    raise SupersededError(
                        f"message {m.stream_sequence} given up at worker {worker.name}: its pin was lost"
                    )
                case "retry":
                    self.retried += 1
                    raise RetryLater(result.reason or "nak", result.delay)
                case "busy":  # full with others' calls: until its next heartbeat says otherwise
                    worker.others = max(worker.capacity - len(worker.offers), 1)
                case _:  # dropped, or taken back (a silent worker, a lost offer): offer it again
                    log.info(
                        "%s: message %d back from worker %s (%s): offering it again",
                        self.spec.member,
                        m.sequence,
                        worker.name,
                        result.reason or result.outcome,
                    )

    async def _clear(self, m: Msg) -> str:
        """Wait until ``m`` may be offered (invariants 3 and 6): ``offer``; ``lost`` (give it up); ``back`` (the
        instance stops, or the pin moved while it was held for sure)."""
        d = self._delivery
        while True:
            if d.lost(m):
                return LOST
            if d.halted or not d.current(m):
                return "back"
            if self._connected() and not d.pin_doubtful() and (m.deliveries <= 1 or self._heard_since()):
                return "offer"
            await asyncio.sleep(WAIT_POLL)

    def _connected(self) -> bool:
        """Connected, and the listeners heard so (invariant 3: what is published while disconnected is sent after the
        reconnect, when the pin may have moved: after a server restart the pending messages are redelivered at
        once, to whoever pulls first)."""
        return self.nc.is_connected and not self._away

    def _heard_since(self) -> bool:
        """Invariant 6: ``HELLO`` said for the current pin, and every worker known beat after it (and after the last
        reconnect or stall). A worker that stays silent is declared gone meanwhile."""
        return self._announced == self._delivery.pin_id and all(
            w.seen > self._listening for w in self._workers.values()
        )

    def _done(self, worker: WorkerView) -> None:
        worker.handled += 1
        self.handled += 1

    def _holder(self, seq: int) -> WorkerView | None:
        """The worker whose last heartbeat lists ``seq`` (running or ended), one running it unfenced first."""
        holders = [w for w in self._workers.values() if seq in w.listed]
        return min(holders, key=lambda w: seq in w.fenced) if holders else None

    def _freest(self) -> WorkerView | None:
        """The worker with the most free slots (the least recently offered among equals)."""
        best, most = None, 0
        for w in self._workers.values():
            free = w.free
            if free > most or (free == most and best is not None and w.last_offer < best.last_offer):
                best, most = w, free
        if best is not None:
            best.last_offer = time.monotonic()
        return best

    def _nonce(self) -> str:
        """An offer token's random part, not to be guessed (16 hex digits)."""
        if not self._nonces:
            drawn = secrets.token_hex(8 * NONCES)
            self._nonces = [drawn[i : i + 16] for i in range(0, len(drawn), 16)]
        return self._nonces.pop()

    async def _offer(self, worker: WorkerView, m: Msg) -> pool.Outcome:
        self._token += 1
        token = f"{self._token}-{self._nonce()}"  # numbered (the workers' upto), and not to be guessed
        offer = Offer(m, worker, token, self._token, time.monotonic(), asyncio.get_running_loop().create_future())
        headers = {k: v for k, v in (m.headers or {}).items() if k != PIN_HEADER}
        headers.update(
            {
                pool.SUBJECT: m.partitioned_subject,
                pool.DELIVERY: pool.delivery_header(m.reply),
                pool.OFFER: pool.offer_header(self.id, self.spec.member, worker.beat),
            }
        )
        if message_size(m.data, headers) > self.nc.max_payload:  # invariant 5
            return pool.Outcome(
                "retry",
                reason=f"too large to hand to a worker: {message_size(m.data, headers)} "
                f"bytes with the offer's headers, over the max payload "
                f"({self.nc.max_payload})",
            )
        worker.offers[token] = self._offers[token] = offer
        for w in self._workers.values():  # offered again: no longer kept (pool invariant 3)
            if w.kept:
                w.kept.pop(offer.seq, None)
        try:
            await self.nc.publish(
                worker.subject("work"), m.data, reply=f"{self.prefix}.D.{self.id}.R.{token}", headers=headers
            )
            return await offer.outcome
        except Exception as e:  # not sent (disconnected): offered again
            log.warning("%s: offer of message %d to worker %s failed: %s", self.spec.member, m.sequence, worker.name, e)
            await asyncio.sleep(REAP_EVERY)
            return pool.Outcome("dropped", reason=str(e))
        finally:
            self._forget(offer)

    def _forget(self, offer: Offer) -> None:
        self._offers.pop(offer.token, None)
        offer.worker.offers.pop(offer.token, None)
        self._free.set()

    def _keep(self, worker: WorkerView, m: Msg) -> None:
        """``m``'s offer was given up: listed as kept in the answers, so that the worker's call is not taken back
        and its outcome is kept for the next holder (pool invariant 3)."""
        if self._workers.get(worker.id) is worker:
            worker.kept[m.stream_sequence] = time.monotonic()

    async def _settle(self, m: Msg, kind: str, reason: str = "", *, sync: bool = False) -> str:
        """Send a worker's ``ack`` or ``term`` of ``m`` to JetStream once the pin is held for sure (invariant 3):
        "" when sent (or settled already), :data:`LOST` when ``m`` was lost meanwhile (nothing sent), else the
        error. ``sync``: a double ack (the worker waits for JetStream's answer)."""
        d = self._delivery
        while not d.lost(m) and (d.pin_doubtful() or not self._connected()):  # noqa: ASYNC110 - three states and no event for them
            await asyncio.sleep(WAIT_POLL)
        if d.lost(m):
            return LOST
        if m.settled:
            return ""
        try:
            if kind == "term":
                await m.term(reason or None)
            elif sync:
                await m.ack_sync()
            else:
                await m.ack()
        except SupersededError:  # the consumer was RESET meanwhile (Delivery invariant 6)
            return LOST
        except Exception as e:  # a plain ack not sent (disconnected): the worker's word holds, a redelivery is acked
            if not sync:
                m._settled(acked=kind == "ack")
            return str(e) or type(e).__name__
        return ""

    # --- what the workers say ---------------------------------------------------------------------
    async def _on_heartbeat(self, msg: NatsMsg) -> None:
        hb = pool.Heartbeat.parse(msg.data)
        if hb is None:
            return
        now = time.monotonic()
        w = self._workers.get(hb.id)
        if w is None:
            w = self._workers[hb.id] = WorkerView(hb.name, hb.id, hb.capacity, self.prefix, now)
            self._said("worker-joined", w, f"capacity {hb.capacity}")
            self._resized()
        changed = (w.capacity, w.stopping) != (hb.capacity, hb.stopping)
        held = set(hb.held.get(self.id, ()))
        w.seen, w.capacity, w.stopping, w.beat = now, hb.capacity, hb.stopping, hb.n
        w.listed, w.fenced = hb.listed(), set(hb.fenced)
        w.others = max(hb.busy - len(held), 0)  # ours are our offers (its count of them is stale once one ends)
        for offer in list(w.offers.values()):  # pool invariant 2: an offer it does not know of was lost
            if offer.seq in held or now - offer.sent <= pool.OFFER_GRACE:
                offer.missing = None
            elif offer.missing is None:
                # Its call may have just ended: the outcome, sent before this heartbeat, comes on another
                # subscription and may be read after it. Lost only if a later heartbeat still misses it.
                offer.missing = now
            elif now - offer.missing >= pool.HEARTBEAT / 2:
                _resolve(offer.outcome, pool.Outcome("dropped", reason="the worker never got it"))
        others = {s for d, seqs in hb.held.items() if d != self.id for s in seqs}
        for seq, since in list(w.kept.items()):  # adopted by another instance, or kept long enough
            if seq in others or now - since > KEEP:
                del w.kept[seq]
        if changed:
            self._resized()
        self._free.set()
        # Offers under a pin in doubt are kept, not held: such an answer proves nothing to a fenced call.
        doubt = self._delivery.pin_doubtful()
        ours = {o.seq for o in w.offers.values()}
        answer = pool.Answer(
            self.id,
            self.spec.member,
            hb.n,
            self._token,
            frozenset(() if doubt else ours),
            frozenset(set(w.kept) | (ours if doubt else set())),
        )
        try:  # on the worker's own subject, not the heartbeat's reply subject (pool invariant 5)
            await self.nc.publish(w.subject("hb"), answer.encode())
        except Exception as e:  # disconnected: it asks again
            log.debug("%s: heartbeat answer not sent: %s", self.spec.member, e)

    async def _on_leave(self, msg: NatsMsg) -> None:
        obj = pool.decode(msg.data)
        if obj is not None and str(obj.get("id")) in self._workers:
            self._gone(self._workers[str(obj["id"])], "stopped")

    async def _on_reply(self, msg: NatsMsg) -> None:
        """A worker's ack of its offer, or the outcome of its call (pool invariant 5: nothing else)."""
        offer = self._offers.get(msg.subject.rsplit(".", 1)[-1])
        obj = pool.decode(msg.data)
        if offer is None or obj is None:
            return
        if "ack" in obj:
            if obj["ack"] in pool.ACKS:
                task = asyncio.create_task(self._ack(offer, obj))
                self._acking.add(task)
                task.add_done_callback(self._acking.discard)
            return
        result = pool.Outcome.parse(obj)
        if result is not None:
            _resolve(offer.outcome, result)

    async def _ack(self, offer: Offer, obj: dict[str, Any]) -> None:
        """A worker's ack (``ack``, ``term``) or ``progress`` while its call runs; a synchronous one (``sync``) is
        answered on the worker's own subject with what JetStream answered. A lost message's is not answered: the
        next holder adopts the call, and the worker asks it again."""
        m, kind, sync = offer.msg, obj["ack"], obj.get("sync")
        if kind == "progress":
            if not self._delivery.lost(m) and not m.settled:
                try:
                    await m.in_progress()
                except Exception:  # disconnected
                    pass
            return
        error = await self._settle(m, kind, str(obj.get("reason") or ""), sync=sync is not None)
        if sync is None or error == LOST:
            return
        try:
            await self.nc.publish(
                offer.worker.subject("hb"),
                pool.encode({"d": self.id, "token": offer.token, "sync": sync, "error": error}),
            )
        except Exception as e:  # disconnected: the worker's ack_sync times out
            log.debug("%s: ack answer not sent: %s", self.spec.member, e)

    async def _on_status(self, msg: NatsMsg) -> None:
        if msg.reply and not msg.reply.startswith("$"):  # an inbox, never a JetStream or KV subject (invariant 5)
            try:
                await self.nc.publish(msg.reply, pool.encode(self.status_of()))
            except Exception:  # disconnected
                pass

    def status(self) -> dict[str, Any]:
        """What ``cg status`` and the exporter show of this dispatching instance."""
        s = self.spec
        return {
            "flavour": s.flavour,
            "stream": s.stream,
            "group": s.group,
            "member": s.member,
            "d": self.id,
            "in_flight": self.in_flight,
            "handled": self.handled,
            "retried": self.retried,
            "waiting": self._delivery.buffered,
            "slots": self.slots(),
            "pinned": self.pinned,
            "workers": [
                {
                    "name": w.name,
                    "id": w.id,
                    "capacity": w.capacity,
                    "busy": len(w.offers),
                    "handled": w.handled,
                    "stopping": w.stopping,
                }
                for w in self.workers()
            ],
        }

    # --- the reaper (pool invariant 2, invariants 3 and 4) -------------------------------------------
    async def _reap(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(REAP_EVERY)
            now = time.monotonic()
            if now - last > STALLED:  # this process was stalled: as after a disconnection (invariant 4)
                log.info(
                    "%s: %.1fs without a turn of the reaper (the process was stopped or its loop blocked): "
                    "every worker's silence counts from now",
                    self.spec.member,
                    now - last,
                )
                self._heard_all(now)
            last = now
            if self.nc.is_connected and not self._away and not self._delivery.pin_doubtful():
                for w in list(self._workers.values()):
                    if now - w.seen > pool.REVOKE_AFTER:
                        self._gone(w, f"no heartbeat for {now - w.seen:.1f}s")
            for offer in list(self._offers.values()):
                if self._delivery.lost(offer.msg):
                    self._keep(offer.worker, offer.msg)
                    _resolve(offer.outcome, pool.Outcome(GIVEN_UP))
            pin = self._delivery.pin_id
            if pin is not None and pin != self._announced:
                self._announced = pin
                self._listening = now  # the workers answer with a heartbeat at once (invariant 6)
                try:
                    await self.nc.publish(
                        f"{self.prefix}.HELLO", pool.encode({"d": self.id, "member": self.spec.member})
                    )
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


async def pool_status(
    nc: Client,
    flavour: str | None = None,
    stream: str | None = None,
    group: str | None = None,
    *,
    timeout: float = 0.5,
    quiet: float = 0.1,
) -> list[dict[str, Any]]:
    """What every dispatching instance of a group (of every group, with no group named) says of its pool:
    :meth:`Roster.status` answers, gathered until ``quiet`` passed without one (at most ``timeout``; at once
    when nobody listens)."""
    subject = f"{pool.prefix(flavour, stream, group)}.STATUS" if flavour and stream and group else pool.STATUS_SUBJECT
    inbox = nc.new_inbox()
    answers: list[dict[str, Any]] = []
    came = asyncio.Event()

    async def answer(msg: NatsMsg) -> None:
        if msg.headers and msg.headers.get("Status") == "503":  # no responders: no dispatching instance
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
            except TimeoutError:
                break
            if answers and answers[-1] == {}:
                break
            wait = min(quiet, deadline - time.monotonic())
    finally:
        await sub.unsubscribe()
    return [a for a in answers if a]


async def say_ended(nc: Client, spec: PoolSpec, why: str) -> None:
    """The group is gone (``why``: ``deleted``): its workers end (pool invariant 4). Said by every dispatching
    instance that sees it."""
    try:
        await nc.publish(
            f"{pool.prefix(spec.flavour, spec.stream, spec.group)}.HELLO",
            pool.encode({"d": "", "member": spec.member, "end": why}),
        )
        await nc.flush(timeout=2)
    except Exception as e:  # disconnected: the workers say that no dispatcher answers
        log.debug("%s: the group's end not said: %s", spec.member, e)


def _resolve(fut: asyncio.Future[pool.Outcome], outcome: pool.Outcome) -> None:
    if not fut.done():
        fut.set_result(outcome)


class PoolDispatcher(KeyedDispatcher):
    """A keyed dispatcher whose calls run on the group's workers (see the module docstring)."""

    def __init__(
        self,
        nc: Client,
        delivery: Delivery,
        consumer: ConsumerControl,
        spec: PoolSpec,
        *,
        key: KeyFunc,
        retry: RetryPolicy,
    ):
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

    def dispatcher(
        self,
        nc: Client,
        delivery: Delivery,
        control: ConsumerControl,
        member: Member,
        *,
        key: KeyFunc,
        retry: RetryPolicy,
        on_worker: WorkerNews,
    ) -> PoolDispatcher:
        spec = PoolSpec(
            member.flavour, member.stream, member.group, member.member, self.max_in_flight, on_worker=on_worker
        )
        return PoolDispatcher(nc, delivery, control, spec, key=key, retry=retry)

    def subjects(self, member: Member) -> list[str]:
        return pool.dispatcher_subjects(pool.prefix(member.flavour, member.stream, member.group))

    async def group_ended(self, nc: Client, member: Member, why: str) -> None:
        await say_ended(nc, PoolSpec(member.flavour, member.stream, member.group, member.member), why)

"""The bridge between the pull loop and the dispatcher: what was delivered, and whether it may start.

One :class:`Delivery` per :class:`~pcgroups.consume._session.PullSession`. It owns the state both sides of
the consume loop read: the buffer of delivered, not yet started messages, the pin (its id, when the
server last confirmed it, whether it is in doubt), the recent acks (to recognise redeliveries), the
hold/stop flags, the pending-RESET filter, the partitions still handled, and the event that wakes the
dispatcher. Everything runs in the event loop's thread except :meth:`Delivery.call`, which a sync
handler's worker thread uses to send acks.

Who calls what:

- The **pull side** (``PullSession``: the subscription callback and the pull task) reports what the
  server says: :meth:`~Delivery.pin_given` for a ``Nats-Pin-Id`` header, :meth:`~Delivery.pulled` for
  each pull sent, :meth:`~Delivery.forget_pin` on status 423 or when the pin moved during a pause,
  :meth:`~Delivery.pin_confirmed` when consumer info shows the pin again, :meth:`~Delivery.deliver`
  for each message, and :meth:`~Delivery.taken_over` when a new pin's take-over may proceed. The session's lifecycle calls :meth:`~Delivery.hold` / :meth:`~Delivery.release`
  (quiesce, reset and resume), :meth:`~Delivery.halt` (stop), :meth:`~Delivery.close`,
  :meth:`~Delivery.expect_reset` and :meth:`~Delivery.take_all`.
- A **dispatcher** (a :class:`Dispatcher`: ``scheduler.SerialDispatcher`` or
  ``scheduler.KeyedDispatcher``) takes messages with :meth:`~Delivery.take` (or all at once,
  :meth:`~Delivery.take_ready`), asks
  :meth:`~Delivery.may_start` before it starts a handler and :meth:`~Delivery.skip_acked` right before,
  and sleeps in :meth:`~Delivery.wait_for_work` when it has nothing to do.
- A **message** (:class:`Msg`) sends its acks through :meth:`~Delivery.publish` /
  :meth:`~Delivery.request`, records them with :meth:`~Delivery.acked`, and asks its dispatcher what a
  nak means.

Invariants (tests/test_delivery.py checks each):

1. No handler starts while :meth:`~Delivery.may_start` is False: after ``hold()`` until ``release()``,
   for good after ``halt()`` or ``close()``, and while the pin is in doubt. The pin is in doubt when
   no pull carried it for 0.9 x PinnedTTL (the process was paused or its loop blocked: the server may
   have given it away) until the pull side confirms it by consumer info or the server gives a pin (also after
   :meth:`~Delivery.doubt_pin`); and, when :attr:`~Delivery.gated` (the instance has rebalance hooks and
   events to run first), until the current pin is admitted (:meth:`~Delivery.admit`). Without a pin only a
   replayed dead letter can be handed out (invariant 2), which no pin's hooks are for: it is not gated.
2. A message whose pin is not the current pin is never handed out: :meth:`~Delivery.take` naks it
   (the pin's new holder gets it).
3. A redelivery of a message this instance acked is acked again, never handled: on arrival
   (:meth:`~Delivery.deliver`) and once more just before its handler would start
   (:meth:`~Delivery.skip_acked`: it may have been redelivered while it waited).
4. After :meth:`~Delivery.expect_reset`, what arrives before the RESET's first delivery (consumer
   sequence 1) is dropped: it was sent before the RESET and comes again.
5. Messages of partitions outside :attr:`Delivery.partitions` (when set) are not handed out: the
   partition's new owner handles them.
6. A first delivery (delivery count 1) whose consumer sequence is not above the highest seen starts a
   new **epoch**: the consumer was RESET (by this session, or from outside: ``cg ... reset``,
   :mod:`pcgroups.ops._offsets`). Messages of the old epoch still buffered or queued in the dispatcher are
   dropped without an ack or nak (they are no longer pending on the server; a nak would hit the new
   epoch's delivery of the same stream sequence), and the recent acks are forgotten: an old epoch's
   ack never marks a new epoch's redelivery as a duplicate. A handler of the old epoch that is still
   running finishes, but its acks are not sent (an old epoch's ack would settle the new epoch's
   delivery of the same stream sequence) nor remembered: a double ack (``Msg.ack_sync``) waiting for
   the server's answer when the new epoch shows (the server never answers an ack of a delivery the
   RESET dropped) stops waiting at once with :class:`~pcgroups.errors.SupersededError`, as does one
   started later, so the dispatcher moves on to the new epoch within a round trip, not an ack timeout.
7. A **take-over**: when the server gives this session a new pin (:meth:`~Delivery.pin_given`) and
   :attr:`~Delivery.guarded` is set (the consumer may hold more than one unacked message), nothing is
   handed out (:meth:`~Delivery.take` gives None, :meth:`~Delivery.may_start` is False) until the session
   calls :meth:`~Delivery.taken_over`. The session does so once every message pending on the consumer was
   delivered here (:meth:`~Delivery.own_pending`): the earlier holder's calls in flight ended (acked, or
   nak'd, or their AckWait ran out), whichever instance ran them. Then the buffer is put in stream order (a
   message the earlier holder nak'd arrives after newer ones), one copy per stream sequence. So no key's
   message starts while an earlier holder still runs one of that key, and every key keeps stream order,
   without a RESET (which would deliver again what was acked above the ack floor).
8. A message whose pin was lost keeps ``+WPI`` for ``grace`` (AckWait) after the loss
   (:meth:`~Delivery.extend`): the take-over of invariant 7 waits for its call, which may still ack it. Past
   that it is :meth:`superseded <Delivery.superseded>` (its AckWait may run out and the new holder get it);
   before that only a pin in doubt, a RESET or the end of the session supersede it. A pin lost while in doubt
   (after a pause, or cut off from the server) has no grace: its messages are superseded at once. A message
   is :meth:`lost <Delivery.lost>` once it is superseded for good (not for a pin in doubt, which may yet be
   confirmed): a worker pool's dispatcher then gives it up (pcgroups.pool).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from ._msg import Msg, NakPolicy, Publish, Request, call_in

RECENT_ACKS = 4096


class Dispatcher(NakPolicy, Protocol):
    """How buffered messages reach the handler. A session picks one at construction."""

    async def run(self) -> None:
        """The dispatch task: take messages from the :class:`Delivery` and run the handler until the
        Delivery closes; when cancelled, the handler tasks it started end with it."""

    @property
    def running(self) -> bool:
        """A handler runs now."""

    @property
    def busy(self) -> bool:
        """A handler runs, or a message waits inside the dispatcher."""

    @property
    def held(self) -> int:
        """Messages taken from the Delivery and not done: running, or waiting inside the dispatcher."""

    @property
    def starved(self) -> bool:
        """A handler slot is free but every message held waits behind a busy key (more would help)."""

    @property
    def idle_slot(self) -> bool:
        """A handler slot is free and no message waits inside the dispatcher."""

    def drop_queued(self) -> list[Msg]:
        """Forget the messages waiting inside the dispatcher (none started) and return them."""

    def overdue(self, now: float, interval: float) -> list[Msg]:
        """The messages that need a ``+WPI`` now, so that the server does not redeliver them."""


class RecentAcks:
    """The stream sequences of the last ``size`` messages acked."""

    def __init__(self, size: int = RECENT_ACKS):
        self._order: deque[int] = deque()
        self._members: set[int] = set()
        self._size = size

    def add(self, seq: int) -> None:
        if seq in self._members:
            return
        self._order.append(seq)
        self._members.add(seq)
        if len(self._order) > self._size:
            self._members.discard(self._order.popleft())

    def __contains__(self, seq: int) -> bool:
        return seq in self._members

    def __len__(self) -> int:
        return len(self._order)


class Delivery:
    """The delivered messages and the rules for handing them out (see the module docstring).

    ``publish(subject, body)`` and ``request(subject, body, timeout)`` send acks (a NATS client's);
    ``pin_margin``: how long without a pull carrying the pin before it is in doubt (0.9 x PinnedTTL);
    ``supersede()``: the double acks ``request`` waits for now stop waiting with SupersededError (called
    when a new epoch shows: they are all of the old one). Create it in the event loop that will run the
    session.
    """

    def __init__(
        self,
        publish: Publish,
        request: Request,
        *,
        pin_margin: float,
        recent_acks: int = RECENT_ACKS,
        supersede: Callable[[], None] | None = None,
        grace: float | None = None,
    ):
        self.publish = publish
        self.request = request
        self._supersede = supersede
        self.partitions: set[int] | None = None  # when set, messages of other partitions are not handed out
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._buffer: deque[Msg] = deque()
        self._waiter: asyncio.Future[None] | None = None  # the dispatcher, asleep in wait_for_work()
        self._acks = RecentAcks(recent_acks)
        self._pin_id: str | None = None
        self._pin_confirmed = 0.0  # when the server last gave or confirmed the pin
        self._last_pull = 0.0
        self._heard = time.monotonic()  # the consumer's last answer (a message, heartbeat or status)
        self._pin_doubt = False  # a pull went out after a gap: the pin stays in doubt until confirmed
        self._pin_margin = pin_margin
        self._grace = pin_margin if grace is None else grace  # invariant 8
        self._pin_lost = 0.0  # when the pin was last lost (forgotten, or replaced by another)
        self.guarded = False  # invariant 7: a new pin waits for taken_over()
        self.on_freed: Callable[[], None] | None = None  # told when a dispatcher is done with a message
        self._taking_over = False
        self._held = False
        self._stopping = False
        self._closed = False
        self._await_reset = False
        self.gated = False  # when set, handlers of a pin start only once it is admitted
        self._admitted: str | None = None
        #: how many RESETs of the consumer this session has seen in its deliveries (invariant 6; read it only)
        self.epoch = 0
        self._last_cseq = 0  # the highest consumer sequence delivered in this epoch
        self._recent_acks = recent_acks
        self._last_ack: int | None = None

    # --- the pin (pull side) --------------------------------------------------------------
    @property
    def pin_id(self) -> str | None:
        return self._pin_id

    def pin_given(self, pin: str, now: float) -> None:
        """A delivery carried ``pin``: the server just gave (or kept) it, so its TTL starts now. A new pin
        starts a take-over when :attr:`guarded` (invariant 7)."""
        if pin != self._pin_id:
            self._lose_pin(now)
            self._taking_over = self.guarded
        self._pin_id = pin
        self._pin_confirmed = now
        self._pin_doubt = False

    def forget_pin(self) -> None:
        """The pin is gone (status 423, or another instance holds it now)."""
        self._lose_pin(time.monotonic())
        self._pin_id = None
        self._pin_doubt = False
        self._taking_over = False

    def _lose_pin(self, now: float) -> None:
        """The pin held is going: its messages' grace starts now (invariant 8), unless the pin was in doubt (a
        pause, a cut-off: their AckWait may have run out already, and another instance may have them)."""
        if self._pin_id is not None:
            self._pin_lost = now if not self.pin_doubtful() else now - self._grace

    @property
    def taking_over(self) -> bool:
        """A new pin waits for :meth:`taken_over` (invariant 7)."""
        return self._taking_over

    def own_pending(self, upto: int | None = None) -> int:
        """How many distinct messages of the current pin and epoch are buffered here (invariant 7); with ``upto``,
        only those delivered at consumer sequences up to it: what a consumer info whose ``delivered`` says
        ``upto`` counts in its num_ack_pending (a message delivered after it is here but not in that count)."""
        return len(
            {
                m.stream_sequence
                for m in self._buffer
                if m.pin_id == self._pin_id and m.epoch == self.epoch and (upto is None or m.consumer_sequence <= upto)
            }
        )

    def taken_over(self, pin: str | None) -> int:
        """The take-over of ``pin`` may proceed: the buffer goes in stream order, one copy per stream
        sequence (the last delivered), and handing out starts (invariant 7). Returns how many of the messages
        handed out are redeliveries (an earlier holder's)."""
        if pin != self._pin_id or not self._taking_over:
            return 0
        latest: dict[int, Msg] = {}
        for m in self._buffer:
            if m.pin_id == pin and m.epoch == self.epoch:
                latest[m.stream_sequence] = m
        self._buffer = deque(latest[seq] for seq in sorted(latest))
        self._taking_over = False
        self.wake()
        return sum(1 for m in self._buffer if m.deliveries > 1)

    def extend(self, m: Msg, now: float) -> bool:
        """``m`` may get ``+WPI`` now: of the current pin, or of a pin lost less than ``grace`` ago
        (invariant 8)."""
        return m.pin_id == self._pin_id or now - self._pin_lost < self._grace

    def heard(self, now: float) -> None:
        """The consumer answered (a message, a heartbeat, a status other than "no responders")."""
        self._heard = now

    def pulled(self, now: float) -> None:
        """A pull was sent. The first one after a gap leaves the pin in doubt until it is confirmed."""
        if self.pin_doubtful():
            self._pin_doubt = True
        self._last_pull = now

    @property
    def last_pull(self) -> float:
        """When the last pull was sent (monotonic)."""
        return self._last_pull

    def pin_doubtful(self) -> bool:
        """No pull carried the pin for the margin (a pause, a blocked loop: or one did only after such a gap,
        unconfirmed), or the consumer did not answer for as long (a partition: pulls go into a connection that
        delivers nothing, or find no responders)."""
        if self._pin_id is None:
            return False
        if self._pin_doubt:
            return True
        since = time.monotonic() - self._pin_margin
        return (self._last_pull < since or self._heard < since) and self._pin_confirmed < since

    def doubt_pin(self) -> None:
        """Put the pin in doubt until the pull side confirms it (invariant 1), whatever the gap: a worker pool's
        dispatcher does so when its connection comes back (a server restart gives pins anew and redelivers what
        was pending at once, to whoever pulls first)."""
        if self._pin_id is not None:
            self._pin_doubt = True

    def pin_confirmed(self, now: float) -> None:
        """Consumer info shows the pin still ours: handlers may start again."""
        self._pin_doubt = False
        self._pin_confirmed = now
        self.wake()

    def admit(self, pin: str | None) -> None:
        """With :attr:`gated`: the owner was told about ``pin`` (its rebalance hook ran), so handlers
        of messages received with it may start."""
        self._admitted = pin
        self.wake()

    def supersedes(self, m: Msg) -> bool:
        return self.superseded(m.pin_id)

    def superseded(self, pin: str | None) -> bool:
        """A message received with ``pin`` may now be handled by another instance: the session ended, the pin
        is in doubt, or it was lost ``grace`` ago or more (invariant 8)."""
        if self._closed or self.pin_doubtful():
            return True
        return pin != self._pin_id and time.monotonic() - self._pin_lost >= self._grace

    def current(self, m: Msg) -> bool:
        """``m`` came with the current pin."""
        return m.pin_id == self._pin_id

    def lost(self, m: Msg) -> bool:
        """``m`` may be with another instance now, for good (what a pin in doubt is not yet): the session ended, the
        consumer was RESET after its delivery, or its pin was lost ``grace`` ago or more, or while in doubt
        (invariant 8). Its acks must not be sent any more (a worker pool's dispatcher sends its workers' acks)."""
        if self._closed or m.epoch != self.epoch:
            return True
        return m.pin_id != self._pin_id and time.monotonic() - self._pin_lost >= self._grace

    # --- messages (pull side) -------------------------------------------------------------
    async def deliver(self, m: Msg) -> bool:
        """A message arrived: buffer it and wake the dispatcher. False when it is not buffered: sent
        before a pending RESET, or a redelivery of one acked already (acked again)."""
        got = self.receive(m)
        if got is None:
            await self.reack(m)
        return bool(got)

    def receive(self, m: Msg) -> bool | None:
        """:meth:`deliver` but for the ack again: None for a redelivery of a message acked already, which the caller
        acks again (:meth:`reack`)."""
        if self._await_reset:
            if m.consumer_sequence != 1:
                return False  # delivered before the RESET: it comes again
            self._await_reset = False
        self._track_epoch(m)
        if m.deliveries > 1 and m.stream_sequence in self._acks:
            # The ack crossed AckWait, or was lost (a reconnect). Acked again: else it comes back after
            # every AckWait and, with max_ack_pending 1, nothing else is ever delivered.
            return None
        self._buffer.append(m)
        self.wake()
        return True

    def _track_epoch(self, m: Msg) -> None:
        cseq = m.consumer_sequence
        if cseq > self._last_cseq:
            self._last_cseq = cseq
        elif m.deliveries == 1 and cseq > 0:
            self.epoch += 1
            self._buffer.clear()  # not pending on the server any more: no nak
            self._acks = RecentAcks(self._recent_acks)
            self._last_cseq = cseq
            if self._supersede is not None:
                self._supersede()  # the server never answers an old epoch's double ack
        m.epoch = self.epoch

    def expect_reset(self) -> None:
        """A RESET is coming: drop the buffer, and what arrives until the RESET's first delivery."""
        self._await_reset = True
        self._buffer.clear()

    def reset_failed(self) -> None:
        self._await_reset = False

    def take_all(self) -> list[Msg]:
        """Empty the buffer: the messages no handler started."""
        dropped = list(self._buffer)
        self._buffer.clear()
        return dropped

    # --- starting handlers (lifecycle) ----------------------------------------------------
    def hold(self) -> None:
        """Start no new handler until :meth:`release` (quiesce)."""
        self._held = True

    def release(self) -> None:
        """Handlers may start again (unless halted)."""
        self._held = False
        self.wake()

    def halt(self) -> None:
        """Start no new handler, for good (stop)."""
        self._stopping = self._held = True

    def close(self) -> None:
        self._closed = True
        self.wake()

    @property
    def halted(self) -> bool:
        """No handler starts any more: the session stops (:meth:`halt`) or is closed."""
        return self._stopping or self._closed

    @property
    def closed(self) -> bool:
        return self._closed

    def may_start(self) -> bool:
        """A handler may start now (invariant 1)."""
        return (
            not (self._held or self._stopping or self._closed or self._taking_over)
            and not self.pin_doubtful()
            and (not self.gated or self._pin_id in (None, self._admitted))
        )

    # --- the dispatcher's side ------------------------------------------------------------
    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def overdue(self, now: float, interval: float) -> list[Msg]:
        """Buffered messages of the current epoch waiting ``interval`` since their receipt or last ``+WPI``."""
        return [m for m in self._buffer if m.epoch == self.epoch and now - m.last_progress >= interval]

    async def take(self) -> Msg | None:
        """The oldest buffered message, if it may be handed out: None when the buffer is empty, during a
        take-over (invariant 7), when it came with another pin (nak'd: invariant 2) or belongs to a partition
        given up (invariant 5)."""
        m, other = self.take_nowait()
        if other is not None:
            await self.nak_quietly(other)
        return m

    def take_nowait(self) -> tuple[Msg | None, Msg | None]:
        """:meth:`take` without the await: (what it returns, a message of another pin taken, which the caller naks)."""
        if not self._buffer or self._taking_over:
            return None, None
        m = self._buffer.popleft()
        if m.epoch != self.epoch:
            return None, None
        if m.pin_id != self._pin_id:
            return None, m
        if self.partitions is not None and m.partition not in self.partitions:
            return None, None
        return m, None

    def take_ready(self) -> tuple[list[Msg], list[Msg]]:
        """Every buffered message :meth:`take` would hand out, in order, and those it would nak (invariant 2: the
        caller naks them, :meth:`nak_quietly`); none during a take-over (invariant 7)."""
        if self._taking_over:
            return [], []
        ready: list[Msg] = []
        naks: list[Msg] = []
        epoch, pin, partitions = self.epoch, self._pin_id, self.partitions
        for m in self._buffer:
            if m.epoch != epoch:
                continue
            if m.pin_id != pin:
                naks.append(m)
            elif partitions is None or m.partition in partitions:
                ready.append(m)
        self._buffer.clear()
        return ready, naks

    async def skip_acked(self, m: Msg) -> bool:
        """True (and ``m`` acked again) when ``m`` is a redelivery of a message acked meanwhile: it was
        redelivered while it waited here (AckWait ran out), and must not be handled again (invariant 3).
        Also True (nothing sent) when ``m`` belongs to an epoch before a RESET (invariant 6)."""
        if m.epoch != self.epoch:
            return True
        if m.deliveries > 1 and m.stream_sequence in self._acks:
            await self.reack(m)
            return True
        return False

    async def wait_for_work(self) -> None:
        """Sleep until something changed: a message arrived, handlers may start again, a handler task
        ended (:meth:`wake`), or the Delivery closed. Check the conditions first, without awaiting in
        between: a wake-up that came before this call is not remembered. One task waits at a time
        (the dispatcher's)."""
        self._waiter = waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def freed(self) -> None:
        """A dispatcher is done with a message (its call ended): room for another (the session's window)."""
        if self.on_freed is not None:
            self.on_freed()

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- acks -----------------------------------------------------------------------------
    def acked(self, seq: int, epoch: int | None = None) -> None:
        """``seq`` was acked (by a message of ``epoch``: an older epoch's ack is not remembered)."""
        self._last_ack = seq
        if epoch is None or epoch == self.epoch:
            self._acks.add(seq)

    def last_acked(self) -> int | None:
        """The stream sequence of the message acked last (None before the first ack), whatever its epoch."""
        return self._last_ack

    async def reack(self, m: Msg) -> None:
        try:
            await self.publish(m.reply, b"+ACK")
        except Exception:  # disconnected: it is redelivered, and acked again, later
            pass

    async def nak_quietly(self, m: Msg) -> None:
        try:
            await self.publish(m.reply, b"-NAK")
        except Exception:
            pass

    def call(self, coro: Coroutine[Any, Any, None]) -> Any:
        """Awaitable in the loop's thread; blocking (until sent) from a sync handler's thread."""
        if threading.get_ident() == self._loop_thread:
            return coro
        return call_in(self._loop, self._loop_thread, coro)

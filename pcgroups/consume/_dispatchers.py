"""The two dispatchers of a session: one handler at a time, or key-level concurrency.

Both implement :class:`~pcgroups.consume._delivery.Dispatcher` and talk to the session's
:class:`~pcgroups.consume._delivery.Delivery` through its public methods only; the session picks one at
construction (``concurrency`` 1 or more).

:class:`SerialDispatcher` runs the handler on one message at a time in delivery order. :class:`KeyedDispatcher`
is key-level concurrency. With partition order a burst on one key delays every other key of its partition. Here
each key keeps its own stream order and at most one message per key runs at a time, up to ``concurrency``
handlers at once; keys with work are served in turn, so a key with 1,000 queued messages gets one turn per round.

Both share what happens when a handler fails (:class:`Attempts`, :class:`~pcgroups.consume._retry.RetryPolicy`):

1. A handler that raises, or calls ``nak()``, never ends the instance: its message is retried in place with
   backoff, the partition (one at a time) or the key (key-level) waiting behind it, its ``+WPI`` going on, up to
   ``max_deliver`` attempts; then it is given up. A message waiting for its retry is not running: a stop or a lost
   pin gives it back to the server at once (``-NAK``), a RESET drops it (it comes again).
2. A given-up message goes to the group's dead-letter stream (:class:`~pcgroups.consume._dead.DeadLetters`), or to
   ``dead_letter_subject``, and is terminated (``+TERM`` with the reason) only once a stream acknowledged its dead
   letter (a JetStream publish answered with a PubAck); with ``drop`` it is terminated at once. It is given up only
   under a pin held for sure: a message whose pin is lost goes back to the server (the new holder decides).
3. A dead letter is refused when no stream takes the subject (and the group's can not be made), none answers in
   time, or the stream refuses it (full with ``discard new``, too large, ...): an error line names the stream or
   subject and the server's reason, the instance says ``dead-letter-refused`` (:mod:`pcgroups.events`), and the
   message stays held: its partition or key waits and the dead letter is tried again with the retries' backoff,
   until a stream takes it or the message is not ours any more (the new holder gets it).
4. A dead letter carries the message's data and headers but the ones JetStream acts on (``Nats-*``: it
   refuses a copy with ``Nats-Stream-Source``, dedupes on ``Nats-Msg-Id``, checks ``Nats-Expected-*``,
   expires on ``Nats-TTL``, ...): each is kept as ``Pcg-Orig-<name>``; plus the ``Pcg-*`` headers saying
   where it came from and why it was given up.
5. With ``park_keys`` a message of a parked key does not run: it follows its key into the dead-letter stream (the
   key waits for each PubAck); other keys go on (on the strict path too: the one case where the order across the
   keys of a partition gives way, by the user's choice). A replayed message (lane R) runs as a message of its key.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from ..deadletters import LANE_DEAD, copied_headers
from ..errors import SupersededError
from ._dead import DeadLetters
from ._delivery import Delivery
from ._keys import KeyFunc
from ._msg import Msg, message_size
from ._retry import RetryLater, RetryPolicy

log = logging.getLogger("pcgroups")

Handler = Callable[[Msg], Awaitable[None] | None]  # what the user gives: async, or sync (run in a thread)
Handle = Callable[[Msg], Awaitable[None]]  # the handler, sync ones already wrapped to run in a thread


def as_handle(handler: Handler) -> Handle:
    """The handler as a coroutine function: an ``async`` one as it is, a sync one run in a worker thread."""
    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(type(handler).__call__):
        return handler  # type: ignore[return-value]

    async def in_thread(m: Msg) -> None:
        await asyncio.to_thread(handler, m)

    return in_thread


REST_POLL = 0.05  # how often a message waiting for its retry looks whether it is still ours


def failure(error: BaseException | None) -> str:
    """Why an attempt failed: the exception's type and message (``nak`` for a ``nak()``)."""
    if error is None:
        return "nak"
    if type(error) is Exception:  # a worker's reason, as it said it
        return str(error) or "Exception"
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


async def _noop() -> None:
    return None


def _unsettled_after_loss(d: Delivery, m: Msg) -> bool:
    """A call ended without settling ``m`` after its pin was lost: to be nak'd, so that the new holder, which
    waits for the calls of the earlier one (Delivery invariant 7), gets it at once rather than after AckWait."""
    return not m.settled and not d.current(m) and m.epoch == d.epoch and not d.closed


class ConsumerControl(Protocol):
    """What a dispatcher asks of the consumer it dispatches for (``PullSession`` is one)."""

    stream: str
    consumer: str
    label: str

    @property
    def max_payload(self) -> int:
        """The server's max payload (a dead letter over it is not published)."""

    @property
    def dead_letters(self) -> DeadLetters | None:
        """The session's dead letters (the group's dead-letter stream, parked keys, lane R); None: none known."""

    async def dead_letter(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        """Publish a dead letter to a subject of the user's; returns once a stream acknowledged it, raises why not."""

    def dead_letter_refused(self, detail: str) -> None:
        """A dead letter was refused (``detail`` says which and why): tell the instance's owner."""


class Attempts:
    """What both dispatchers do with a message they hand out: run it, retry it in place, give it up, or let it
    follow its parked key (the module's invariants 1-5)."""

    _delivery: Delivery
    _handle: Handle
    _consumer: ConsumerControl
    key: KeyFunc
    retry: RetryPolicy

    def _init_attempts(
        self, delivery: Delivery, handle: Handle, consumer: ConsumerControl, key: KeyFunc, retry: RetryPolicy
    ) -> None:
        self._delivery = delivery
        self._handle = handle
        self._consumer = consumer
        self.key = key
        self.retry = retry
        self._naks: dict[Msg, float] = {}  # nak()s of running messages: retry in place after the delay
        self._resting = 0  # messages waiting for their retry (held, not running)
        self._dead: DeadLetters | None = getattr(consumer, "dead_letters", None)

    def nak(self, msg: Msg, delay: float | None) -> Coroutine[Any, Any, None]:
        self._naks[msg] = delay or 0.0
        return _noop()

    def _key_of(self, m: Msg) -> str:
        return m.key if m.key is not None else self.key(m)

    def _said(self, kind: str, m: Msg, detail: str) -> None:
        if self._dead is not None:
            self._dead.emit(kind, (m.partition,), detail)

    def _describe(self, m: Msg) -> str:
        return self._dead.describe(m) if self._dead is not None else f"message {m.sequence} ({m.subject})"

    async def _attempts(self, k: str | None, m: Msg) -> None:
        d = self._delivery
        if m.epoch != d.epoch or (m.deliveries > 1 and await d.skip_acked(m)):  # a first delivery was not acked
            return
        dead = self._dead
        try:
            if dead is not None and (dead.parking or dead.replays) and await self._diverted(m, dead):
                return
            attempt = 0
            while not d.closed:
                attempt += 1
                m.started = time.monotonic()
                if self._naks:
                    self._naks.pop(m, None)
                error: BaseException | None = None
                try:
                    await self._handle(m)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    error = e
                retry = self._naks.pop(m, None) if self._naks else None
                if isinstance(error, RetryLater):  # a remote call failed (a worker's): retry in place
                    retry, error = error.delay, (Exception(error.reason) if error.reason else None)
                if isinstance(error, SupersededError) or m.epoch != d.epoch:
                    return  # the consumer was RESET: the message is not pending any more (invariant 6)
                if error is None and retry is None:
                    # acked, termed, or left to the handler (no ack: redelivered after AckWait); a message of a pin
                    # lost meanwhile goes back to the server at once, for the new holder (it waited for this call)
                    if _unsettled_after_loss(d, m):
                        await d.nak_quietly(m)
                    return
                if not await self._failed(m, attempt, error, retry):
                    return
        finally:
            if dead is not None:
                dead.done_with(m)

    async def _failed(self, m: Msg, attempt: int, error: BaseException | None, retry: float | None) -> bool:
        """Attempt ``attempt`` of ``m`` failed: True to try it again (after its backoff), False when it was given
        up or is not ours any more."""
        reason = failure(error)
        deliveries = attempt + max(m.deliveries - 1, 0)
        if self._dead is not None:
            self._dead.failing.setdefault(m, time.monotonic())
        most = self.retry.max_deliver
        last = bool(most) and deliveries >= most
        delay = retry if retry else self._backoff(attempt)
        then = "given up" if last else f"tried again in {delay:.2f}s"
        self._said(
            "failed", m, f"{self._describe(m)} attempt {deliveries}{f' of {most}' if most else ''}: {reason}; {then}"
        )
        if last:
            await self._give_up(m, reason, deliveries)
            return False
        log.info(
            "%s: %s failed (%s), retry %d in %.2fs", self._consumer.label, self._describe(m), reason, attempt, delay
        )
        return await self._rest(m, delay)

    def _backoff(self, attempt: int) -> float:
        return min(self.retry.backoff * 2.0 ** (attempt - 1), self.retry.max_backoff)

    async def _rest(self, m: Msg, delay: float) -> bool:
        """Hold ``m`` for ``delay`` (its ``+WPI`` goes on), then until a handler may start; False when it is not
        ours to retry any more: the pin moved (back to the server: the new holder gets it), the session stops (back
        to the server at once), the consumer was RESET, or its partition was given up (invariant 1)."""
        d = self._delivery
        self._resting += 1
        try:
            until = time.monotonic() + delay
            while True:
                if m.epoch != d.epoch or d.closed:
                    return False
                if not d.current(m):
                    if _unsettled_after_loss(d, m):
                        await d.nak_quietly(m)
                    return False
                if d.halted:
                    await d.nak_quietly(m)
                    return False
                if d.partitions is not None and m.partition not in d.partitions:
                    return False
                left = until - time.monotonic()
                if left <= 0 and d.may_start():
                    return True
                await asyncio.sleep(min(left, REST_POLL) if left > 0 else REST_POLL)
        except asyncio.CancelledError:
            if not m.settled and m.epoch == d.epoch and d.current(m):
                await d.nak_quietly(m)  # the session stops: back to the server at once
            raise
        finally:
            self._resting -= 1

    async def _diverted(self, m: Msg, dead: DeadLetters) -> bool:
        """True when ``m`` does not run: it followed its parked key into the dead-letter stream, or was not ours any
        more meanwhile (invariant 5). While the stream can not say whether its key is parked, ``m`` waits."""
        entry = dead.replays.get(m)
        refusals = 0
        while True:
            try:
                if entry is not None:  # a replayed message: it runs unless an older one of its key is dead
                    lane = LANE_DEAD if dead.parking and await dead.blocked(entry) else None
                else:
                    lane = await dead.parked_lane(m, self._key_of(m))
                if lane is None:
                    return False
                break
            except Exception as e:
                refusals += 1
                delay = self._backoff(refusals)
                log.warning(
                    "%s: %s waits: whether its key is parked is not known (%s); asking again in %.2fs",
                    self._consumer.label,
                    self._describe(m),
                    e,
                    delay,
                )
                if not await self._rest(m, delay):
                    return True
        await self._give_up(m, "its key is parked", 0, lane=lane, parked=True)
        return True

    async def _give_up(
        self, m: Msg, reason: str, deliveries: int, *, lane: str = LANE_DEAD, parked: bool = False
    ) -> None:
        """Dead-letter ``m`` (or drop it), then terminate it; a refused dead letter holds it, tried again (invariants
        2, 3). Only under a pin held for sure: a message not ours any more goes back to the server."""
        c, policy, dead = self._consumer, self.retry, self._dead
        subject = policy.dead_letter_subject
        where = subject or (dead.stream if dead is not None else "the group's dead-letter stream")
        delay, refusals = 0.0, 0
        while True:
            if not await self._rest(m, delay):
                return
            try:
                if policy.drop:
                    pass
                elif subject:
                    await self._dead_letter(m, subject, reason, deliveries)
                elif dead is None:
                    raise LookupError("no dead-letter stream is known to this consumer")
                else:
                    await dead.store(m, self._key_of(m), reason, deliveries, lane=lane, parked=parked)
                break
            except Exception as e:
                refusals += 1
                delay = self._backoff(refusals)
                log.error(
                    "%s: %s not dead-lettered: %s refused it: %s; the message is held (its %s waits), trying "
                    "again in %.2fs",
                    c.label,
                    self._describe(m),
                    where,
                    e,
                    "key" if m.key is not None else "partition",
                    delay,
                )
                c.dead_letter_refused(f"{self._describe(m)} to {where}: {e}")
        said = (
            "terminated"
            if policy.drop
            else f"dead-lettered to {where}" + (f" (lane {lane})" if lane != LANE_DEAD else "")
        )
        done = f"{self._describe(m)} {said}" + (
            f" after {deliveries} deliveries: {reason}" if not parked else f": {reason}"
        )
        (log.info if parked else log.warning)("%s: %s", c.label, done)
        await m.respond(b"+TERM " + reason[:200].encode(), settle=True)
        self._said("terminated" if policy.drop else "dead-lettered", m, done)
        if policy.on_dead_letter is not None:
            policy.on_dead_letter(m, reason)

    async def _dead_letter(self, m: Msg, subject: str, reason: str, deliveries: int) -> None:
        c = self._consumer
        headers = copied_headers(m.headers)  # invariant 4
        headers.update(
            {
                "Pcg-Dead-Reason": reason[:512],
                "Pcg-Subject": m.subject,
                "Pcg-Stream": c.stream,
                "Pcg-Consumer": c.consumer,
                "Pcg-Stream-Seq": str(m.sequence),
                "Pcg-Deliveries": str(deliveries),
            }
        )
        if message_size(m.data, headers) > c.max_payload:  # the server would close the connection
            raise ValueError(
                f"{message_size(m.data, headers)} bytes with the dead letter's headers, over the "
                f"max payload ({c.max_payload})"
            )
        await c.dead_letter(subject, m.data, headers)


class SerialDispatcher(Attempts):
    """One handler at a time, in delivery order (concurrency 1).

    A failing handler (an exception, ``nak()``) has its message retried in place, the partition waiting behind it
    (the module's invariants). Only an error that is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``
    raised in a handler) ends the instance: its message is nak'd and ``on_fatal`` gets the error.
    """

    def __init__(
        self,
        delivery: Delivery,
        handle: Handle,
        consumer: ConsumerControl,
        *,
        key: KeyFunc,
        retry: RetryPolicy,
        on_fatal: Callable[[BaseException], None],
    ):
        self._init_attempts(delivery, handle, consumer, key, retry)
        self._on_fatal = on_fatal
        self._current: Msg | None = None

    @property
    def running(self) -> bool:
        return self._current is not None and not self._resting

    @property
    def busy(self) -> bool:
        return self._current is not None

    @property
    def held(self) -> int:
        return 1 if self._current is not None else 0

    starved = False  # one message at a time, in delivery order: a larger window would not help

    @property
    def idle_slot(self) -> bool:
        return self._current is None

    def drop_queued(self) -> list[Msg]:
        return []  # nothing waits here: the Delivery's buffer is the queue

    def overdue(self, now: float, interval: float) -> list[Msg]:
        """The running message once its handler has run ``interval`` (then at every check), and one waiting for its
        retry."""
        m = self._current
        return [m] if m is not None and not m.settled and now - m.started >= interval else []

    async def run(self) -> None:
        d = self._delivery
        while not d.closed:
            if not d.buffered or not d.may_start():
                await d.wait_for_work()
                continue
            m, other = d.take_nowait()
            if other is not None:
                await d.nak_quietly(other)
            if m is None:
                continue
            if not await self._run_one(m):
                return

    async def _run_one(self, m: Msg) -> bool:
        """Handle ``m`` (and its retries); False when the instance ends (an error that is not an Exception)."""
        self._current = m
        try:
            await self._attempts(None, m)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            if not m.settled and m.epoch == self._delivery.epoch:
                await self._delivery.nak_quietly(m)
            self._on_fatal(e)
            return False
        finally:
            self._current = None
        return True


class KeyedDispatcher(Attempts):
    """Runs the handler with up to ``concurrency`` keys at once, one message per key, keys served in turn.

    A failure (an exception, ``nak()``) retries in place: the key waits (later messages of the key too) and the
    message is handled again after its delay, up to ``retry.max_deliver`` deliveries, then it is dead-lettered (the
    module's invariants). Messages waiting for their key's turn get ``+WPI`` like running ones (:meth:`overdue`).
    """

    def __init__(
        self,
        delivery: Delivery,
        handle: Handle,
        consumer: ConsumerControl,
        *,
        concurrency: int,
        key: KeyFunc,
        retry: RetryPolicy,
    ):
        self._init_attempts(delivery, handle, consumer, key, retry)
        self.concurrency = concurrency
        #: told the new concurrency when it changes (a pool's slots: the session's window follows)
        self.on_resize: Callable[[int], None] = lambda slots: None
        self._keys: dict[str, deque[Msg]] = {}  # keys with queued messages
        self._ready: deque[str] = deque()  # keys with work and no handler running
        self._running: dict[str, Msg] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._queued = 0  # messages in self._keys
        self._probe: asyncio.Handle | None = None  # a pass's probe started, the others not yet (_after_probe)

    @property
    def running(self) -> bool:
        return len(self._running) > self._resting  # a message waiting for its retry is not running

    @property
    def busy(self) -> bool:
        return bool(self._running) or bool(self._keys)

    @property
    def held(self) -> int:
        """Messages taken from the Delivery and not done: running or waiting for their key."""
        return self._queued + len(self._running)

    @property
    def starved(self) -> bool:
        """A handler slot is free, and every message held waits behind a key that runs: only more messages
        (other keys, further in the stream) can use the slot (:class:`Window` grows)."""
        return len(self._running) < self.concurrency and not self._ready and self._queued > 0

    @property
    def idle_slot(self) -> bool:
        """A handler slot is free and no message waits for its key (:class:`Window` grows while hungry)."""
        return len(self._running) < self.concurrency and not self._queued

    def drop_queued(self) -> list[Msg]:
        self._queued = 0
        dropped = [m for q in self._keys.values() for m in q]
        self._keys.clear()
        self._ready.clear()
        return dropped

    def overdue(self, now: float, interval: float) -> list[Msg]:
        """Running messages and messages waiting for their key's turn, ``interval`` after their receipt
        or their last ``+WPI``."""
        waiting = [m for q in self._keys.values() for m in q]
        return [m for m in [*self._running.values(), *waiting] if not m.settled and now - m.last_progress >= interval]

    async def run(self) -> None:
        try:
            await self._dispatch()
        finally:
            await self._cancel_tasks()

    async def _dispatch(self) -> None:
        d = self._delivery
        loop = asyncio.get_running_loop()
        while not d.closed:
            while d.buffered and not d.taking_over:
                ready, naks = d.take_ready()
                for m in ready:
                    self._admit(m)
                for m in naks:
                    await d.nak_quietly(m)
            if self._probe is None and (taken := self._take()) is not None:
                self._start(taken)
                if self._ready and len(self._running) < self.concurrency:
                    self._probe = loop.call_soon(self._after_probe)
            if not d.buffered or d.taking_over:
                await d.wait_for_work()

    def _start(self, taken: tuple[str, Msg]) -> None:
        task = asyncio.create_task(self._run_one(*taken))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _after_probe(self) -> None:
        """Right after the first step of a pass's one task (the probe): keys still ready with slots free mean its
        handler suspended, so the others start now. Handlers that return at once run one after the other in the
        probe's chain (:meth:`_run_one`), without a task each."""
        self._probe = None
        while (taken := self._take()) is not None:
            self._start(taken)

    def _admit(self, m: Msg) -> None:
        k = m.key = self.key(m)
        q = self._keys.get(k)
        if q is None:
            q = self._keys[k] = deque()
            if k not in self._running:
                self._ready.append(k)
        q.append(m)
        self._queued += 1

    def _take(self) -> tuple[str, Msg] | None:
        """The next ready key (round-robin) and its next message, marked running; None when
        ``concurrency`` handlers run, no key is ready, or no handler may start."""
        while self._ready and len(self._running) < self.concurrency and self._delivery.may_start():
            k = self._ready.popleft()
            q = self._keys.get(k)
            if not q:
                self._keys.pop(k, None)
                continue
            m = q.popleft()
            self._queued -= 1
            if not q:
                del self._keys[k]
            self._running[k] = m
            return k, m
        return None

    async def _run_one(self, k: str, m: Msg) -> None:
        """Handle ``m`` of key ``k``, then chain: while a slot is free this task takes the next ready
        key itself (same round-robin, same ``running`` bookkeeping), without a round trip through the
        dispatcher. The dispatcher is woken only when the task ends, i.e. when a slot really frees."""
        try:
            while True:
                try:
                    await self._attempts(k, m)
                finally:
                    if self._naks:
                        self._naks.pop(m, None)
                    del self._running[k]
                    if k in self._keys:
                        self._ready.append(k)
                    self._delivery.freed()
                taken = self._take()
                if taken is None:
                    return
                k, m = taken
        finally:
            self._delivery.wake()

    async def _cancel_tasks(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass

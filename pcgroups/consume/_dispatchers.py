"""The two dispatchers of a session: one handler at a time, or key-level concurrency.

Both implement :class:`~pcgroups.consume._delivery.Dispatcher` and talk to the session's
:class:`~pcgroups.consume._delivery.Delivery` through its public methods only; the session picks one at
construction (``concurrency`` 1 or more).

:class:`SerialDispatcher` runs the handler on one message at a time in delivery order; a failed
handler ends the instance, ``nak()`` sends ``-NAK`` (the server redelivers).

:class:`KeyedDispatcher` is key-level concurrency. With partition order a burst on one key delays
every other key of its partition. Here each key keeps its own stream order and at most one message
per key runs at a time, up to ``concurrency`` handlers at once; keys with work are served in turn,
so a key with 1,000 queued messages gets one turn per round. A failed handler (exception or ``nak()``) blocks only its key: the message is retried in place
with backoff (later messages of the key wait), and after ``max_deliver`` attempts it goes to a
dead-letter subject and the key moves on.

Dead letters (``RetryPolicy.dead_letter_subject``):

1. A message is terminated (``+TERM``) only once a stream acknowledged its dead letter (a JetStream publish
   answered with a PubAck). Without a dead-letter subject it is terminated after ``max_deliver``.
2. A dead letter is refused when no stream takes the subject, none answers in time, or the stream refuses
   it (full with ``discard new``, too large, ...): an error line names the subject and the server's reason,
   the instance says ``dead-letter-refused`` (:mod:`pcgroups.events`), and the message stays held: its key
   waits and the dead letter is tried again with the retries' backoff, until a stream takes it or the pin
   moves (the new holder gets the message).
3. A dead letter carries the message's data and headers but the ones JetStream acts on (``Nats-*``: it
   refuses a copy with ``Nats-Stream-Source``, dedupes on ``Nats-Msg-Id``, checks ``Nats-Expected-*``,
   expires on ``Nats-TTL``, ...): each is kept as ``Pcg-Orig-<name>``; plus the ``Pcg-*`` headers saying
   where it came from and why it was given up.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from ..errors import SupersededError
from ._delivery import Delivery
from ._keys import KeyFunc
from ._msg import PIN_HEADER, Msg, message_size
from ._retry import RetryLater, RetryPolicy

log = logging.getLogger("pcgroups")

Handler = Callable[[Msg], Awaitable[None] | None]  # what the user gives: async, or sync (run in a thread)
Handle = Callable[[Msg], Awaitable[None]]  # the handler, sync ones already wrapped to run in a thread


def as_handle(handler: Handler) -> Handle:
    """The handler as a coroutine function: an ``async`` one as it is, a sync one run in a worker thread."""
    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None)):
        return handler  # type: ignore[return-value]

    async def in_thread(m: Msg) -> None:
        await asyncio.to_thread(handler, m)

    return in_thread


def dead_letter_headers(headers: dict[str, str] | None) -> dict[str, str]:
    """A dead letter's copy of a message's headers: the pin gone, each ``Nats-*`` header (JetStream acts on them)
    renamed ``Pcg-Orig-<name>`` (invariant 3)."""
    out: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if name.lower() == PIN_HEADER.lower():
            continue
        out[f"Pcg-Orig-{name}" if name.lower().startswith("nats-") else name] = value
    return out


async def _noop() -> None:
    return None


def _unsettled_after_loss(d: Delivery, m: Msg) -> bool:
    """A call ended without settling ``m`` after its pin was lost: to be nak'd, so that the new holder, which
    waits for the calls of the earlier one (Delivery invariant 7), gets it at once rather than after AckWait."""
    return not m.settled and not d.current(m) and m.epoch == d.epoch and not d.closed


class SerialDispatcher:
    """One handler at a time, in delivery order (concurrency 1).

    A handler that raises ends the instance: its message is nak'd if it was not settled, and
    ``on_fatal`` gets the error. ``nak()`` sends ``-NAK`` (with the delay, if any).
    """

    def __init__(self, delivery: Delivery, handle: Handle, on_fatal: Callable[[BaseException], None]):
        self._delivery = delivery
        self._handle = handle
        self._on_fatal = on_fatal
        self._current: Msg | None = None

    @property
    def running(self) -> bool:
        return self._current is not None

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
        """The running message once its handler has run ``interval`` (then at every check)."""
        m = self._current
        return [m] if m is not None and not m.settled and now - m.started >= interval else []

    def nak(self, msg: Msg, delay: float | None) -> Coroutine[Any, Any, None]:
        body = b"-NAK" if not delay else f'-NAK {{"delay":{int(delay * 1e9)}}}'.encode()
        return msg.respond(body, settle=True)

    async def run(self) -> None:
        d = self._delivery
        while not d.closed:
            if not d.buffered or not d.may_start():
                await d.wait_for_work()
                continue
            m, other = d.take_nowait()
            if other is not None:
                await d.nak_quietly(other)
            if m is None or (m.deliveries > 1 and await d.skip_acked(m)):  # a first delivery was not acked
                continue
            if not await self._run_one(m):
                return

    async def _run_one(self, m: Msg) -> bool:
        """Handle ``m``; False when the handler failed (the instance ends)."""
        self._current = m
        m.started = time.monotonic()
        try:
            await self._handle(m)
        except asyncio.CancelledError:
            raise
        except SupersededError as e:  # its ack_sync met a RESET: not pending any more, nothing to do
            log.info("%s", e)
        except BaseException as e:  # the handler failed: redeliver, end the instance
            if not m.settled and m.epoch == self._delivery.epoch:
                await self._delivery.nak_quietly(m)
            self._current = None
            self._on_fatal(e)
            return False
        self._current = None
        if _unsettled_after_loss(self._delivery, m):
            await self._delivery.nak_quietly(m)
        return True


class ConsumerControl(Protocol):
    """What the keyed dispatcher asks of the consumer it dispatches for (``PullSession`` is one)."""

    stream: str
    consumer: str
    label: str

    @property
    def max_payload(self) -> int:
        """The server's max payload (a dead letter over it is not published)."""

    async def dead_letter(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        """Publish a dead letter; returns once a stream acknowledged it, raises why not."""

    def dead_letter_refused(self, detail: str) -> None:
        """A dead letter was refused (``detail`` says which and why): tell the instance's owner."""


class KeyedDispatcher:
    """Runs the handler with up to ``concurrency`` keys at once, one message per key, keys served in turn.

    ``nak()`` retries in place: the key waits (later messages of the key too) and the message is handled
    again after its delay, up to ``retry.max_deliver`` deliveries, then it is dead-lettered. Messages
    waiting for their key's turn get ``+WPI`` like running ones (:meth:`overdue`).
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
        self._delivery = delivery
        self._handle = handle
        self._consumer = consumer
        self.concurrency = concurrency
        self.key = key
        self.retry = retry
        #: told the new concurrency when it changes (a pool's slots: the session's window follows)
        self.on_resize: Callable[[int], None] = lambda slots: None
        self._keys: dict[str, deque[Msg]] = {}  # keys with queued messages
        self._ready: deque[str] = deque()  # keys with work and no handler running
        self._running: dict[str, Msg] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._naks: dict[Msg, float] = {}  # nak()s of running messages: retry in place after the delay
        self._queued = 0  # messages in self._keys
        self._probe: asyncio.Handle | None = None  # a pass's probe started, the others not yet (_after_probe)

    @property
    def running(self) -> bool:
        return bool(self._running)

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

    def nak(self, msg: Msg, delay: float | None) -> Coroutine[Any, Any, None]:
        self._naks[msg] = delay or 0.0
        return _noop()

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

    async def _attempts(self, k: str, m: Msg) -> None:
        d = self._delivery
        if m.epoch != d.epoch or (m.deliveries > 1 and await d.skip_acked(m)):  # a first delivery was not acked
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
            reason = (str(error) if type(error) is Exception else repr(error)) if error is not None else "nak"
            deliveries = attempt + max(m.metadata.num_delivered - 1, 0)
            if self.retry.max_deliver and deliveries >= self.retry.max_deliver:
                await self._give_up(m, reason, deliveries)
                return
            delay = retry if retry else self._backoff(attempt)
            log.info(
                "%s: key %r message %d failed (%s), retry %d in %.2fs",
                self._consumer.label,
                k,
                m.sequence,
                reason,
                attempt,
                delay,
            )
            if not await self._wait(m, delay):
                return

    def _backoff(self, attempt: int) -> float:
        return min(self.retry.backoff * 2.0 ** (attempt - 1), self.retry.max_backoff)

    async def _wait(self, m: Msg, delay: float) -> bool:
        """Sleep ``delay`` holding ``m``; False when it is not ours to handle any more (the pin moved: the new
        holder gets it, it waited for this call; or the consumer was RESET)."""
        d = self._delivery
        await asyncio.sleep(delay)
        if m.epoch != d.epoch:
            return False
        if not d.current(m):
            if _unsettled_after_loss(d, m):
                await d.nak_quietly(m)
            return False
        return not d.closed

    async def _give_up(self, m: Msg, reason: str, deliveries: int) -> None:
        """Dead-letter ``m``, then terminate it; a refused dead letter holds it, tried again (invariants 1, 2)."""
        c, subject = self._consumer, self.retry.dead_letter_subject
        refusals = 0
        while subject:
            try:
                await self._dead_letter(m, subject, reason, deliveries)
                break
            except Exception as e:
                refusals += 1
                delay = self._backoff(refusals)
                log.error(
                    "%s: message %d (%s) not dead-lettered: %s refused it: %s; the message is held (its key "
                    "waits), trying again in %.2fs",
                    c.label,
                    m.sequence,
                    m.subject,
                    subject,
                    e,
                    delay,
                )
                c.dead_letter_refused(f"message {m.sequence} ({m.subject}) to {subject}: {e}")
            if not await self._wait(m, delay):
                return
        log.warning(
            "%s: message %d (%s) %s after %d deliveries: %s",
            c.label,
            m.sequence,
            m.subject,
            "dead-lettered" if subject else "terminated",
            deliveries,
            reason,
        )
        await m.respond(b"+TERM " + reason[:200].encode(), settle=True)
        if self.retry.on_dead_letter is not None:
            self.retry.on_dead_letter(m, reason)

    async def _dead_letter(self, m: Msg, subject: str, reason: str, deliveries: int) -> None:
        c = self._consumer
        headers = dead_letter_headers(m.headers)
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

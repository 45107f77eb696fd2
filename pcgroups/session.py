"""The one consume loop both flavours use: pinned pulls, dispatch, in-progress, drain.

A :class:`PullSession` is one member instance attached to one member consumer. It keeps pulls
outstanding with the pin id (which is what keeps the pin), hands messages one at a time to the
handler, sends ``+WPI`` while a handler runs long, drops what it buffered when its pin moves, and
can *drain*: stop pulling, let what was delivered finish, and only then report idle, so a partition
is released only after its in-flight message is settled.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg

from .errors import NotFoundError
from .jsapi import SILENT_SERVER, JetStreamApi, pull_request
from .scheduler import KeyedDispatcher, KeyFunc, RetryPolicy, key_by_subject

log = logging.getLogger("pcgroups")

PIN_HEADER = "Nats-Pin-Id"
DEFAULT_BATCH = 500
RECENT_ACKS = 4096

Handler = Callable[["Msg"], Awaitable[None] | None]


def pull_expiry(ack_wait: float) -> float:
    """Pull ``expires`` = max(AckWait/2, 1 s): pins are renewed well inside PinnedTTL."""
    return max(ack_wait / 2, 1.0)


def pinned_ttl(ack_wait: float) -> float:
    """PinnedTTL (``priority_timeout``) = max(AckWait, 1 s)."""
    return max(ack_wait, 1.0)


async def _noop() -> None:
    return None


def _ack_numbers(reply: str) -> tuple[int, int, int]:
    """(deliveries, stream sequence, consumer sequence) of a JetStream ack subject (v1 and v2 forms),
    zeros when it is not one."""
    tokens = reply.split(".") if reply else ()
    try:
        if len(tokens) == 9:
            return int(tokens[4]), int(tokens[5]), int(tokens[6])
        return int(tokens[-6]), int(tokens[-5]), int(tokens[-4])
    except (ValueError, IndexError):
        return 0, 0, 0


class _RecentSet:
    """A set that remembers only its last ``size`` members."""

    def __init__(self, size: int):
        self._order: deque[int] = deque()
        self._members: set[int] = set()
        self._size = size

    def add(self, item: int) -> None:
        if item in self._members:
            return
        self._order.append(item)
        self._members.add(item)
        if len(self._order) > self._size:
            self._members.discard(self._order.popleft())

    def __contains__(self, item: int) -> bool:
        return item in self._members

    def __len__(self) -> int:
        return len(self._order)


class Msg:
    """A message as a handler sees it: the partition token stripped from the subject.

    Acks pass straight to JetStream. In an ``async`` handler await them (``await msg.ack()``); in a
    sync handler (run in a worker thread) call them plainly: they block until sent.
    """

    __slots__ = ("_msg", "_session", "subject", "partition", "pin_id", "_done", "_meta", "_retry", "received",
                 "_last_wpi", "_deliveries", "_stream_seq", "_consumer_seq")

    def __init__(self, msg: NatsMsg, session: "PullSession", pin_id: str | None, now: float | None = None):
        self._msg = msg
        self._session = session
        self.pin_id = pin_id
        # The ack subject is parsed once: the delivery count and the sequences serve dedup, resets and acks.
        self._deliveries, self._stream_seq, self._consumer_seq = _ack_numbers(msg.reply)
        token, _, rest = msg.subject.partition(".")
        self.subject = rest if _ else msg.subject
        self.partition = int(token) if _ and token.isdigit() else -1
        self._done = False
        self._meta = None
        self._retry: float | None = None
        self.received = self._last_wpi = time.monotonic() if now is None else now

    # --- what the handler reads ---------------------------------------------------------
    @property
    def partitioned_subject(self) -> str:
        return self._msg.subject

    @property
    def data(self) -> bytes:
        return self._msg.data

    @property
    def headers(self) -> dict[str, str] | None:
        return self._msg.headers

    @property
    def reply(self) -> str:
        return self._msg.reply

    @property
    def metadata(self):
        """JetStream metadata (stream and consumer sequences, deliveries, timestamp, pending)."""
        if self._meta is None:
            self._meta = self._msg.metadata
        return self._meta

    @property
    def sequence(self) -> int:
        return self._stream_seq or self.metadata.sequence.stream

    @property
    def superseded(self) -> bool:
        """True once this instance lost the pin it received the message with, or may have lost it (it
        sent no pull carrying the pin for nearly PinnedTTL: the process was paused or its event loop
        blocked): another instance may now own the partition, so a long handler should stop and not ack."""
        s = self._session
        return s.pin_id != self.pin_id or s.closed or s._pin_doubtful()

    # --- acks ---------------------------------------------------------------------------
    def ack(self):
        return self._send(b"+ACK", settle=True)

    def ack_sync(self, timeout: float = 5.0):
        """Double ack: wait until the server confirmed the ack."""
        return self._session._call(self._ack_sync(timeout))

    async def _ack_sync(self, timeout: float) -> None:
        await self._session.nc.request(self._msg.reply, b"+ACK", timeout=timeout)
        self._settled(acked=True)

    def nak(self, delay: float | None = None):
        """Ask for redelivery. With key-level concurrency the retry happens in place (the key waits)."""
        if self._session._keyed is not None:
            self._retry = delay or 0.0
            return self._session._call(_noop())
        body = b"-NAK" if not delay else f'-NAK {{"delay":{int(delay * 1e9)}}}'.encode()
        return self._send(body, settle=True)

    def in_progress(self):
        return self._send(b"+WPI", settle=False)

    def term(self, reason: str | None = None):
        return self._send(b"+TERM" + (f" {reason}".encode() if reason else b""), settle=True)

    def _send(self, body: bytes, *, settle: bool):
        return self._session._call(self._publish(body, settle))

    async def _publish(self, body: bytes, settle: bool) -> None:
        await self._session.nc.publish(self._msg.reply, body)
        if settle:
            self._settled(acked=body == b"+ACK")

    def _settled(self, *, acked: bool) -> None:
        if not self._done:
            self._done = True
            if acked:
                self._session._recent_acks.add(self._stream_seq)

    @property
    def settled(self) -> bool:
        return self._done

    def __repr__(self) -> str:
        return f"<Msg partition={self.partition} subject={self.subject!r}>"


class PullSession:
    """One member instance pulling one consumer as a candidate for its priority group's pin."""

    def __init__(self, nc: Client, api: JetStreamApi, *, stream: str, consumer: str, handler: Handler,
                 ack_wait: float, batch: int = DEFAULT_BATCH, auto_in_progress: bool = True,
                 on_fatal: Callable[[BaseException], None] | None = None,
                 on_gone: Callable[[str], None] | None = None, label: str = "",
                 concurrency: int = 1, key: "KeyFunc | None" = None, retry: "RetryPolicy | None" = None):
        self.nc = nc
        self.api = api
        self.stream = stream
        self.consumer = consumer
        self.handler = handler
        self.ack_wait = ack_wait
        self.batch = batch
        self.expires = pull_expiry(ack_wait)
        self.heartbeat = self.expires / 2
        # A pin is kept only by pulls carrying it more often than PinnedTTL; with AckWait < 2 s the
        # pull expiry equals the TTL, so the pinned instance also re-pulls every TTL/3.
        self.keepalive = pinned_ttl(ack_wait) / 3
        self.auto_in_progress = auto_in_progress
        self.on_fatal = on_fatal
        self.on_gone = on_gone
        self.label = label or consumer
        self.pin_id: str | None = None
        self.partitions: set[int] | None = None   # when set, messages of other partitions are not handled
        self.closed = False
        self.delivered = 0
        self._is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None))
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._pending = 0                 # messages requested by outstanding pulls, not yet delivered
        self._pulling = False
        self._last_seen = time.monotonic()
        self._heard = time.monotonic()   # the consumer's last answer: a message, heartbeat or status but 503
        self._silent_limit = max(SILENT_SERVER, 3 * pinned_ttl(ack_wait))   # (heartbeats come every expires/2)
        self._last_pull = 0.0
        self._last_refill = 0.0          # the last pull that topped the batch up (not a keep-alive)
        self._wake = asyncio.Event()
        self._queue: deque[Msg] = deque()
        self._queued = asyncio.Event()
        self._inflight: Msg | None = None
        self._inflight_since = 0.0
        self._idle = asyncio.Event()
        self._idle.set()
        self._recent_acks = _RecentSet(RECENT_ACKS)
        self._sub = None
        self._tasks: list[asyncio.Task] = []
        self._pull_subject = api.pull_subject(stream, consumer)
        self._paused = False            # quiesce(): no new handler starts
        self._stopping = False          # stop(): no new handler starts, for good
        self._await_reset = False       # after a RESET: drop stragglers until consumer sequence 1 arrives
        # No pull carried the pin for this long (a SIGSTOP, a blocked loop): the server may have moved
        # it (it unpins PinnedTTL after the last pull), so no handler starts before consumer info confirms it.
        self._pin_margin = pinned_ttl(ack_wait) * 0.9
        self._pin_doubt = False
        self._pin_confirmed = 0.0
        self._keyed: KeyedDispatcher | None = None
        if concurrency > 1:
            self._keyed = KeyedDispatcher(self, concurrency=concurrency, key=key or key_by_subject,
                                          retry=retry or RetryPolicy())

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(self._inbox, cb=self._on_msg)
        self._pulling = True
        self._tasks = [asyncio.create_task(self._pull_loop(), name=f"pcg-pull-{self.label}"),
                       asyncio.create_task(self._dispatch_loop(), name=f"pcg-dispatch-{self.label}")]
        if self.auto_in_progress:
            self._tasks.append(asyncio.create_task(self._progress_loop(), name=f"pcg-wpi-{self.label}"))

    @property
    def pinned(self) -> bool:
        return self.pin_id is not None

    @property
    def _paused(self) -> bool:
        """No new handler starts: quiesce() or stop(); with key-level concurrency also while the pin is in
        doubt after a gap in the pulls (the pull loop confirms it; the one-handler loop checks it itself)."""
        return self._hold or (self._keyed is not None and self._pin_doubtful())

    @_paused.setter
    def _paused(self, value: bool) -> None:
        self._hold = value

    @property
    def busy(self) -> bool:
        return (self._inflight is not None or bool(self._queue)
                or (self._keyed is not None and self._keyed.busy))

    async def drain(self, timeout: float | None = None) -> bool:
        """Stop pulling; wait until outstanding pulls have ended and every delivered message is done.

        Returns False if ``timeout`` (default AckWait + pull expiry) ran out first.
        """
        self._pulling = False
        self._wake.set()
        deadline = time.monotonic() + (timeout if timeout is not None else self.ack_wait + self.expires + 1)
        while time.monotonic() < deadline:
            if self._pending <= 0 and not self.busy:
                return True
            # Nothing comes for a pull whose answers stopped (no heartbeat for a while): it is gone.
            if self._pending > 0 and time.monotonic() - self._last_seen > 3 * self.heartbeat:
                self._pending = 0
            await asyncio.sleep(0.005)
        return False

    async def quiesce(self, timeout: float | None = None) -> bool:
        """Start no new handler and wait (default: AckWait) until none runs. Pulls go on, so the pin
        is kept; what arrives meanwhile waits. Follow with :meth:`reset_and_resume`."""
        self._paused = True
        deadline = time.monotonic() + (timeout if timeout is not None else self.ack_wait)
        while time.monotonic() < deadline:
            running = self._keyed.running if self._keyed is not None else self._inflight
            if not running:
                return True
            await asyncio.sleep(0.002)
        return False

    async def reset_and_resume(self, seq: int, before_reset: Callable[[], Awaitable[None]] | None = None) -> None:
        """Drop what is buffered, optionally run ``before_reset`` (a consumer update), RESET the consumer
        to stream sequence ``seq`` and hand out messages again: delivery restarts in stream order."""
        self._await_reset = True
        self._queue.clear()
        if self._keyed is not None:
            self._keyed.drop_queued()
        try:
            if before_reset is not None:
                await before_reset()
            await self.api.reset(self.stream, self.consumer, seq)
        except BaseException:
            self._await_reset = False
            raise
        finally:
            self._paused = self._stopping
            self._queued.set()
            if self._keyed is not None:
                self._keyed.slot.set()

    def resume(self) -> None:
        if not self.closed:
            self._pulling = True
            self._wake.set()

    def halt(self) -> None:
        """Start no new handler from now on and pull no more: the first step of :meth:`stop`, for callers
        that stop the session a little later (what arrives meanwhile waits, and is nak'd by stop())."""
        self._stopping = self._paused = True
        self._pulling = False

    async def stop(self, *, drain: bool = True, timeout: float | None = None) -> None:
        """End the instance: by default let the handlers in flight finish first (bounded by AckWait).

        No handler starts once stop() is called: what the still-open pull delivers meanwhile stays
        buffered and is nak'd after the subscription is gone (so it is not delivered to us again)."""
        if self.closed:
            return
        self.halt()  # first of all: nothing more is dispatched (the open pull may still deliver)
        if drain:
            limit = timeout if timeout is not None else self.ack_wait
            if not await self.quiesce(limit):
                log.warning("%s: handler still running after %.1fs, stopping anyway", self.label, limit)
        self.closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # connection already closed
                pass
        dropped = self._take_buffered()
        if not self.nc.is_closed:
            for m in dropped:
                await self._nak_quietly(m)

    # --- receiving ------------------------------------------------------------------------
    async def _on_msg(self, msg: NatsMsg) -> None:
        self._last_seen = now = time.monotonic()
        headers = msg.headers
        status = headers.get("Status") if headers else None
        if status != "503":   # no responders: the server found nobody to answer for the consumer
            self._heard = now
        if status and not msg.data and not msg.reply:
            self._on_status(status, headers)
            return
        self._pending -= 1
        if self._pending <= self.batch // 2:
            self._wake.set()
        pin = headers.get(PIN_HEADER) if headers else None
        if pin is None:
            log.warning("%s: received a message without a %s header", self.label, PIN_HEADER)
        elif pin != self.pin_id:
            if self.pin_id is None:
                log.info("%s: pinned (%s)", self.label, pin)
            self.pin_id = pin
            self._pin_confirmed = now   # the server just gave it: its TTL starts now
            self._pin_doubt = False
        m = Msg(msg, self, pin, now)
        if self._await_reset:
            if m._consumer_seq != 1:
                return  # delivered before the RESET: it comes again
            self._await_reset = False
        if m._deliveries > 1 and m._stream_seq in self._recent_acks:
            # A redelivery of something this instance acked already: the ack crossed AckWait, or was lost
            # (a reconnect). Not handled again, but acked again: else it comes back after every AckWait and,
            # with max_ack_pending 1, nothing else is ever delivered.
            await self._reack(m)
            return
        self.delivered += 1
        self._queue.append(m)
        self._idle.clear()
        self._queued.set()

    def _on_status(self, status: str, headers: dict[str, str]) -> None:
        if status == "100":
            return
        description = headers.get("Description", "")
        log.debug("%s: pull status %s %s (pending %d)", self.label, status, description, self._pending)
        if status in ("408", "409"):
            left = headers.get("Nats-Pending-Messages")
            self._pending = self._pending - int(left) if left and left.isdigit() else 0
            if self._pending < 0:
                self._pending = 0
            if status == "409" and "Deleted" in description:
                self._gone(f"consumer deleted: {description}")
                return
            self._wake.set()
        elif status == "423":
            if self.pin_id is not None:
                log.info("%s: lost the pin (%s)", self.label, description or "423")
            self.pin_id = None
            self._pending = 0
            self._drop_queued(nak=True)
            self._wake.set()
        elif status == "404":
            self._pending = 0
            self._wake.set()
        elif status == "503":
            # No responders: the consumer is gone, or (in a cluster) has no leader right now. Pulls go on
            # (one per heartbeat); only the consumer's "not found" ends the session.
            self._pending = 0
            if not any(t.get_name() == "pcg-503" and not t.done() for t in self._tasks):
                self._tasks.append(asyncio.create_task(self._check_consumer(), name="pcg-503"))
        else:
            self._pending = 0
            self._gone(f"pull failed: {status} {description}".strip())

    async def _check_consumer(self) -> None:
        """After a pull without responders: end the session only when the consumer does not exist."""
        try:
            await self.api.consumer_info(self.stream, self.consumer)
        except NotFoundError:
            if not self.closed:
                self._gone("no responders: the consumer or its stream does not exist")
            return
        except Exception as e:  # no leader yet, a timeout, reconnecting: the consumer may well be there
            log.info("%s: consumer not answering (%s), pulling again", self.label, e)
            return
        log.info("%s: a pull found no responders but the consumer exists (a leader change?), pulling again",
                 self.label)

    def _gone(self, reason: str) -> None:
        self._pulling = False
        self._pending = 0
        if self.on_gone is not None:
            self.on_gone(reason)

    def _take_buffered(self) -> list[Msg]:
        """Empty the buffer (and the key queues): the messages no handler started."""
        dropped = list(self._queue)
        self._queue.clear()
        if self._keyed is not None:
            dropped += self._keyed.drop_queued()
        return dropped

    def _drop_queued(self, *, nak: bool) -> None:
        """Forget buffered messages no handler started; nak them so they come back at once."""
        for m in self._take_buffered():
            if nak and not self.nc.is_closed:
                asyncio.ensure_future(self._nak_quietly(m))
        if not self.busy:
            self._idle.set()

    async def _reack(self, m: Msg) -> None:
        try:
            await self.nc.publish(m.reply, b"+ACK")
        except Exception:  # disconnected: it is redelivered, and acked again, later
            pass

    async def _nak_quietly(self, m: Msg) -> None:
        try:
            await self.nc.publish(m.reply, b"-NAK")
        except Exception:
            pass

    # --- pulling --------------------------------------------------------------------------
    async def _pull_loop(self) -> None:
        while not self.closed:
            if self._keyed is not None and self._pin_doubtful():
                await self._confirm_pin()   # the keyed dispatcher starts nothing meanwhile (_paused)
                self._keyed.slot.set()
            now = time.monotonic()
            if self._pulling and self.api.reconnect_if_silent(self._heard, self._silent_limit):
                # pulls outstanding, no answer from the consumer: the server is cut off from the rest of the cluster
                # (a partition), or the link is dead without the socket knowing
                log.info("%s: no answer from the consumer for %.1fs although pulls are outstanding", self.label,
                         now - self._heard)
            if self._pulling:
                if self._pending > 0 and now - self._last_seen > 3 * self.heartbeat:
                    log.debug("%s: no heartbeat for %.1fs, pulling again", self.label, now - self._last_seen)
                    self._pending = 0
                elif self._pending > 0 and now - self._last_refill > self.expires + 2 * self.heartbeat:
                    # Every pull has ended by now (expired, with a 408 that says what it had left): what is
                    # still counted belongs to pulls lost with a connection. The keep-alive pulls' messages
                    # and heartbeats hide that from the check above, and one message per keep-alive is all
                    # that would come.
                    log.debug("%s: %d requested messages of expired pulls never came, pulling again", self.label,
                              self._pending)
                    self._pending = 0
                if self._pending <= self.batch // 2:
                    self._last_refill = now
                    await self._pull(self.batch - max(self._pending, 0))
                elif self.pin_id is not None and now - self._last_pull >= self.keepalive:
                    await self._pull(1)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), min(self.heartbeat, self.keepalive))
            except asyncio.TimeoutError:
                pass

    def _pin_doubtful(self) -> bool:
        """No pull carried the pin for nearly PinnedTTL (a pause, a blocked loop), or the consumer did not answer for
        as long (a partition: pulls go into a connection that delivers nothing, or find no responders)."""
        if self.pin_id is None:
            return False
        if self._pin_doubt:
            return True
        since = time.monotonic() - self._pin_margin
        return min(self._last_pull, self._heard) < since and self._pin_confirmed < since

    async def _confirm_pin(self) -> bool:
        """After a gap in the pulls: True if consumer info still shows our pin; if another (or none)
        is pinned, forget the pin and what was buffered under it (not handled, not nak'd: those
        messages are redelivered to the new pin holder)."""
        pin = self.pin_id
        try:
            info = await self.api.consumer_info(self.stream, self.consumer)
        except Exception as e:  # disconnected, no leader: ask again shortly, start nothing meanwhile
            log.info("%s: cannot confirm the pin after a pause (%s)", self.label, e)
            await asyncio.sleep(0.1)
            return False
        if self.pin_id != pin:
            return False
        pinned = {g.get("pinned_client_id") for g in info.get("priority_groups") or []}
        self._pin_doubt = False
        if pin in pinned:
            self._pin_confirmed = time.monotonic()
            return True
        log.info("%s: the pin moved while this instance was paused; dropping %d buffered message(s)", self.label,
                 len(self._take_buffered()))
        self.pin_id = None
        self._wake.set()
        return False

    async def _pull(self, n: int) -> None:
        if self._pin_doubtful():
            self._pin_doubt = True  # the first pull after a gap: the pin may be gone, confirm before handling
        body = pull_request(batch=n, expires=self.expires, heartbeat=self.heartbeat, pin_id=self.pin_id)
        try:
            await self.nc.publish(self._pull_subject, body, reply=self._inbox)
        except Exception as e:  # disconnected: the heartbeat check pulls again later
            log.debug("%s: pull not sent: %s", self.label, e)
            return
        if self._pending <= 0:
            self._last_seen = time.monotonic()
        self._pending += n
        log.debug("%s: pulled %d (pending %d, pin %s)", self.label, n, self._pending, self.pin_id)
        self._last_pull = time.monotonic()

    # --- dispatching ----------------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        if self._keyed is not None:
            try:
                await self._keyed.run()
            finally:
                await self._keyed.cancel()
            return
        while not self.closed:
            if not self._queue or self._paused:
                self._queued.clear()
                if self._inflight is None and not self._queue:
                    self._idle.set()
                await self._queued.wait()
                continue
            if self._pin_doubtful() and not await self._confirm_pin():
                continue
            if not self._queue:
                continue
            m = self._queue.popleft()
            if m.pin_id != self.pin_id:
                # The pin moved after this was delivered: another instance owns it now.
                await self._nak_quietly(m)
                continue
            if self.partitions is not None and m.partition not in self.partitions:
                continue  # a partition this member gave up: its new owner handles it
            if m._deliveries > 1 and m._stream_seq in self._recent_acks:
                await self._reack(m)  # redelivered while it waited here (AckWait ran out), and acked meanwhile
                continue
            self._inflight, self._inflight_since = m, time.monotonic()
            try:
                if self._is_async:
                    await self.handler(m)
                else:
                    await asyncio.to_thread(self.handler, m)
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # the handler failed: redeliver, end the instance
                if not m.settled:
                    await self._nak_quietly(m)
                self._inflight = None
                self._fatal(e)
                return
            self._inflight = None

    def _fatal(self, error: BaseException) -> None:
        self._pulling = False
        self._drop_queued(nak=True)
        self._idle.set()
        if self.on_fatal is not None:
            self.on_fatal(error)

    async def _progress_loop(self) -> None:
        """Send +WPI for a handler running longer than a third of AckWait, so it is not redelivered."""
        interval = max(self.ack_wait / 3, 0.2)
        while not self.closed:
            await asyncio.sleep(interval / 2)
            now = time.monotonic()
            if self._keyed is not None:
                # running handlers, and messages waiting for their key's turn, must not be redelivered
                due = [m for m in list(self._keyed.running.values()) + list(self._keyed.queued())
                       if not m.settled and now - m._last_wpi >= interval]
            else:
                m = self._inflight
                due = [m] if m is not None and not m.settled and now - self._inflight_since >= interval else []
            for m in due:
                m._last_wpi = now
                try:
                    await self.nc.publish(m.reply, b"+WPI")
                except Exception:
                    pass

    # --- helpers --------------------------------------------------------------------------
    def _call(self, coro) -> Any:
        """Awaitable in the loop's thread; blocking (until sent) from a sync handler's thread."""
        if threading.get_ident() == self._loop_thread:
            return coro
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

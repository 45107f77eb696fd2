"""The one consume loop both flavours use: pinned pulls, dispatch, in-progress, drain.

A :class:`PullSession` is one member instance attached to one member consumer. It keeps one pull
outstanding, with the pin id once it has one (which is what keeps the pin): the next pull is sent when
the last one has ended (used up or expired), and the pinned instance's keep-alive pulls expire at
once (1 ms), so each running instance is one waiting pull on its member's consumer (what
``pcgroups.ops._status`` counts as an instance). It feeds what arrives to its
:class:`~pcgroups.consume._delivery.Delivery` (the buffer, the pin, the recent acks and the rules for handing
messages out), lets a dispatcher (``scheduler.SerialDispatcher``, or ``scheduler.KeyedDispatcher``
with key-level concurrency) run the handler, sends ``+WPI`` for what the dispatcher says is overdue,
drops what it buffered when its pin moves, and can *drain*: stop pulling (its keep-alives go on while
a call runs, so the pin, and with it the call's ack, holds until the call ends), let what was delivered
finish, and only then report idle, so a partition is released only after its in-flight message is
settled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from ..errors import NotFoundError, SupersededError
from ..jetstream._api import SILENT_SERVER, JetStreamApi, keepalive_request, pinned_client_id, pull_request
from ..tracing import NO_TRACING, InstanceTracing
from ._dead import DeadLetters
from ._delivery import Delivery, Dispatcher
from ._msg import PIN_HEADER, Msg
from ._options import ConsumeOptions, DispatcherFactory
from ._window import PULL_BYTES, MessageSize, Window

log = logging.getLogger("pcgroups")

TAKEOVER_POLL = 0.05  # how often a take-over asks consumer info while an earlier holder's calls run


class SessionOwner(Protocol):
    """What a session tells the instance that runs it."""

    def pin_changed(self) -> None:
        """The pin changed (given, lost, moved during a pause)."""

    def consumer_gone(self, reason: str) -> None:
        """The member's consumer went away (deleted, or its stream)."""

    def fatal(self, error: BaseException) -> None:
        """An error the session can not recover from (a handler raised an error that is not an ``Exception``)."""

    def dead_letter_refused(self, detail: str) -> None:
        """A dead letter was refused (``detail`` says which and why); its message is held."""


def pull_expiry(ack_wait: float) -> float:
    """Pull ``expires`` = max(AckWait/2, 1 s): pins are renewed well inside PinnedTTL."""
    return max(ack_wait / 2, 1.0)


def pinned_ttl(ack_wait: float) -> float:
    """PinnedTTL (``priority_timeout``) = max(AckWait, 1 s)."""
    return max(ack_wait, 1.0)


class AckReplies:
    """Double acks (``Msg.ack_sync``) on one reply subscription of the session's own.

    ``nc.request()`` would do, but it costs two more event-loop turns per call (it waits through
    ``asyncio.wait_for``) and a random token from the OS; the strict path double-acks every message,
    so this waits on a plain future, with a timer for the timeout and a counter for the token.
    """

    def __init__(self, nc: Client):
        self.nc = nc
        self._prefix = ""
        self._count = 0
        self._waiting: dict[str, asyncio.Future[NatsMsg]] = {}
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._prefix = self.nc.new_inbox() + "."
        self._sub = await self.nc.subscribe(self._prefix + "*", cb=self._reply)

    async def stop(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # connection already closed
                pass

    async def _reply(self, msg: NatsMsg) -> None:
        waiter = self._waiting.pop(msg.subject[len(self._prefix) :], None)
        if waiter is not None and not waiter.done():
            waiter.set_result(msg)

    async def request(self, subject: str, body: bytes, timeout: float) -> NatsMsg:
        """Publish ``body`` with a reply subject and wait (``timeout``) for the reply: nats-py's
        ``TimeoutError`` when none comes, ``NoRespondersError`` for a no-responders status, as ``request()``."""
        self._count += 1
        token = str(self._count)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[NatsMsg] = loop.create_future()
        self._waiting[token] = waiter
        timer = loop.call_later(timeout, _expire, waiter)
        try:
            await self.nc.publish(subject, body, reply=self._prefix + token)
            reply = await waiter
        finally:
            timer.cancel()
            self._waiting.pop(token, None)
        if reply.headers and reply.headers.get("Status") == "503":
            raise NoRespondersError
        return reply

    def supersede(self) -> None:
        """The double acks waiting now stop waiting: SupersededError (the consumer was RESET, so the
        server answers none of them)."""
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            if not waiter.done():
                waiter.set_exception(SupersededError("not acked: the consumer was reset after its delivery"))


class Waker:
    """Wakes the pull loop: an ``asyncio.Event`` without a task per wait (``wait_for`` makes one, and the pull
    loop waits once per wake-up). A :meth:`set` while nobody waits is kept for the next :meth:`wait`."""

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Return when set (at once if it was set since the last wait), or after ``timeout``."""
        if not self._set:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            timer = loop.call_later(timeout, _wake_up, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        self._set = False


def _wake_up(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _expire(waiter: asyncio.Future[NatsMsg]) -> None:
    if not waiter.done():
        waiter.set_exception(NatsTimeoutError())


class PullSession:
    """One member instance pulling one consumer as a candidate for its priority group's pin."""

    def __init__(
        self,
        nc: Client,
        api: JetStreamApi,
        *,
        stream: str,
        consumer: str,
        ack_wait: float,
        options: ConsumeOptions,
        dispatcher: DispatcherFactory,
        owner: SessionOwner | None = None,
        label: str = "",
        gated: bool = False,
        trace: InstanceTracing = NO_TRACING,
        dead_letters: DeadLetters | None = None,
    ):
        self.nc = nc
        self.trace = trace
        self.api = api
        self.stream = stream
        self.consumer = consumer
        self.ack_wait = ack_wait
        self.batch = options.batch
        self.expires = pull_expiry(ack_wait)
        self.heartbeat = self.expires / 2
        # A pin is kept only by pulls carrying it more often than PinnedTTL; with AckWait < 2 s the
        # pull expiry equals the TTL, so the pinned instance also re-pulls every TTL/3.
        self.keepalive = pinned_ttl(ack_wait) / 3
        self.auto_in_progress = options.auto_in_progress
        self.owner = owner
        self.label = label or consumer
        self._pending = 0  # messages requested by outstanding pulls, not yet delivered
        self._used_up = False  # the last pull delivered all it asked for
        self._pulling = False
        self._last_seen = time.monotonic()
        self._heard = time.monotonic()  # the consumer's last answer: a message, heartbeat or status but 503
        self._silent_limit = max(SILENT_SERVER, 3 * pinned_ttl(ack_wait))  # (heartbeats come every expires/2)
        self._last_refill = 0.0  # the last pull that topped the batch up (not a keep-alive)
        self._wake = Waker()  # wakes the pull loop
        self._delivered = Waker()  # a message arrived during a take-over
        self._sub: Subscription | None = None
        self._keepalive_sub: Subscription | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._naks: set[asyncio.Task[None]] = set()  # naks of dropped messages, held until sent
        self._pull_subject = api.pull_subject(stream, consumer)
        # No pull carried the pin for this long (a SIGSTOP, a blocked loop): the server may have moved
        # it (it unpins PinnedTTL after the last pull), so no handler starts before consumer info confirms it.
        self._ack_replies = AckReplies(nc)
        self.delivery = Delivery(
            nc.publish,
            self._ack_replies.request,
            pin_margin=pinned_ttl(ack_wait) * 0.9,
            supersede=self._ack_replies.supersede,
            grace=ack_wait,
        )
        # A new pin waits until the earlier holder's calls ended (Delivery invariant 7): one consumer info with
        # max_ack_pending 1 (the message delivered is then the only one pending), a wait with a larger window.
        self.delivery.guarded = True
        # gated: handlers of a new pin wait until the owner admits it (admit()), told by owner.pin_changed: its hooks run first
        self.delivery.gated = gated
        self.sizes = MessageSize()  # bounds pulls (PULL_BYTES) and the window (WINDOW_BYTES) by bytes
        #: the group's dead-letter stream, the parked keys and lane R, as this session sees them (its dispatcher's)
        self.dead_letters = dead_letters
        if dead_letters is not None:
            dead_letters.attach(self.delivery)
        self.dispatcher: Dispatcher
        #: with key-level concurrency, how many messages the instance holds (None: as many as the server gives)
        self.window: Window | None
        self.dispatcher, self.window = dispatcher(self.delivery, self, self.sizes, self._fatal)
        if self.window is not None:
            self.delivery.on_freed = self._freed

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        await self._ack_replies.start()
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(self._inbox, cb=self._on_msg)
        self._keepalive_inbox = self.nc.new_inbox()
        self._keepalive_sub = await self.nc.subscribe(self._keepalive_inbox, cb=self._on_keepalive)
        self._pulling = True
        self._tasks = [
            asyncio.create_task(self._pull_loop(), name=f"pcg-pull-{self.label}"),
            asyncio.create_task(self.dispatcher.run(), name=f"pcg-dispatch-{self.label}"),
        ]
        if self.auto_in_progress:
            self._tasks.append(asyncio.create_task(self._progress_loop(), name=f"pcg-wpi-{self.label}"))
        if self.dead_letters is not None:
            replays = self.dead_letters.run(self.dispatcher, lambda: self.dispatcher.busy, self.nc, self.ack_wait)
            self._tasks.append(asyncio.create_task(replays, name=f"pcg-replays-{self.label}"))

    @property
    def pin_id(self) -> str | None:
        return self.delivery.pin_id

    @property
    def pinned(self) -> bool:
        return self.delivery.pin_id is not None

    def admit(self) -> None:
        """Handlers of the current pin may start (the owner has run its hooks for it: see ``SessionOwner.pin_changed``)."""
        self.delivery.admit(self.delivery.pin_id)

    def _pin_changed(self) -> None:
        if self.owner is not None:
            self.owner.pin_changed()

    @property
    def closed(self) -> bool:
        return self.delivery.closed

    @property
    def partitions(self) -> set[int] | None:
        """When set, messages of other partitions are not handled (their new owner handles them)."""
        return self.delivery.partitions

    @partitions.setter
    def partitions(self, value: set[int] | None) -> None:
        self.delivery.partitions = value

    @property
    def busy(self) -> bool:
        return bool(self.delivery.buffered) or self.dispatcher.busy

    def last_acked(self) -> int | None:
        """The stream sequence of the message this session acked last (None before the first ack)."""
        return self.delivery.last_acked()

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
        self.delivery.hold()
        return await self.idle(timeout)

    async def idle(self, timeout: float | None = None) -> bool:
        """Wait (default: AckWait) until no handler runs; False if the time ran out first."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.ack_wait)
        while time.monotonic() < deadline:
            if not self.dispatcher.running:
                return True
            await asyncio.sleep(0.002)
        return False

    async def reset_and_resume(self, seq: int, before_reset: Callable[[], Awaitable[None]] | None = None) -> None:
        """Drop what is buffered, optionally run ``before_reset`` (a consumer update), RESET the consumer
        to stream sequence ``seq`` and hand out messages again: delivery restarts in stream order."""
        self.delivery.expect_reset()
        self.dispatcher.drop_queued()
        try:
            if before_reset is not None:
                await before_reset()
            await self.reset_consumer(seq)
        except BaseException:
            self.delivery.reset_failed()
            raise
        finally:
            self.delivery.release()

    def resume(self) -> None:
        if not self.closed:
            self._pulling = True
            self._wake.set()

    def halt(self) -> None:
        """Start no new handler from now on and pull no more: the first step of :meth:`stop`, for callers
        that stop the session a little later (what arrives meanwhile waits, and is nak'd by stop())."""
        self.delivery.halt()
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
        self.delivery.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        for sub in (self._sub, self._keepalive_sub):
            if sub is not None:
                try:
                    await sub.unsubscribe()
                except Exception:  # connection already closed
                    pass
        await self._ack_replies.stop()
        dropped = self._take_buffered()
        if not self.nc.is_closed:
            for m in dropped:
                await self.delivery.nak_quietly(m)

    # --- what the keyed dispatcher asks of its consumer (scheduler.ConsumerControl) ----------
    async def consumer_info(self) -> dict[str, Any]:
        return await self.api.consumer_info(self.stream, self.consumer)

    async def reset_consumer(self, seq: int | None = None) -> None:
        """RESET the consumer to stream sequence ``seq`` (None: its ack floor)."""
        with self.trace.reset(self.consumer, seq):
            if seq is None:
                await self.api.reset(self.stream, self.consumer)
            else:
                await self.api.reset(self.stream, self.consumer, seq)

    @property
    def max_payload(self) -> int:
        return self.nc.max_payload

    async def dead_letter(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        await self.api.publish(subject, data, headers)

    def dead_letter_refused(self, detail: str) -> None:
        if self.owner is not None:
            self.owner.dead_letter_refused(detail)

    # --- receiving ------------------------------------------------------------------------
    async def _on_msg(self, msg: NatsMsg) -> None:
        self._last_seen = now = time.monotonic()
        headers = msg.headers
        status = headers.get("Status") if headers else None
        if status != "503":  # no responders: the server found nobody to answer for the consumer
            self._heard = now
            self.delivery.heard(now)
        if status and headers and not msg.data and not msg.reply:
            self._on_status(status, headers)
            return
        self._pending -= 1
        if self._pending <= 0:
            self._used_up = True
            self._wake.set()
        self.sizes.saw(len(msg.data))
        if (again := self._received(msg, headers, now)) is not None:
            await self.delivery.reack(again)

    async def _on_keepalive(self, msg: NatsMsg) -> None:
        """The answer to a keep-alive pull: a message (handled as any), a lost pin (the waiting pull ends
        in its turn: the next one goes without the pin), the consumer deleted; anything else (it expired,
        nothing to deliver, no responders) the waiting pull hears too, and handles."""
        now = time.monotonic()
        headers = msg.headers
        status = headers.get("Status") if headers else None
        if status != "503":
            self._heard = now
            self.delivery.heard(now)
        if status and headers and not msg.data and not msg.reply:
            description = headers.get("Description", "")
            if status == "423":
                self._lost_pin(description)
            elif status == "409" and "Deleted" in description:
                self._gone(f"consumer deleted: {description}")
            return
        if (again := self._received(msg, headers, now)) is not None:
            await self.delivery.reack(again)

    def _received(self, msg: NatsMsg, headers: dict[str, str] | None, now: float) -> Msg | None:
        """A message to hand to the Delivery; returns it when it is a redelivery of one acked already, to be acked
        again (Delivery invariant 3)."""
        delivery = self.delivery
        pin = headers.get(PIN_HEADER) if headers else None
        if pin is None:
            log.warning("%s: received a message without a %s header", self.label, PIN_HEADER)
        elif pin != delivery.pin_id:
            if delivery.pin_id is None:
                log.info("%s: pinned (%s)", self.label, pin)
            else:  # a new pin without a 423 first: what waits under the old one goes back to the server
                self._drop_queued()
            delivery.pin_given(pin, now)
            if delivery.taking_over:
                self._spawn(self._take_over(pin), f"pcg-takeover-{self.label}")
            self._pin_changed()
        m = Msg(msg, delivery, self.dispatcher, pin, now)
        got = delivery.receive(m)
        if delivery.taking_over:
            self._delivered.set()
        return m if got is None else None

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
            self._lost_pin(description)
            self._pending = 0
            self._wake.set()
        elif status == "404":
            self._pending = 0
            self._wake.set()
        elif status == "503":
            # No responders: the consumer is gone, or (in a cluster) has no leader right now. Pulls go on
            # (one per heartbeat); only the consumer's "not found" ends the session.
            self._pending = 0
            if not any(t.get_name() == "pcg-503" and not t.done() for t in self._tasks):
                self._spawn(self._check_consumer(), "pcg-503")
        else:
            self._pending = 0
            self._gone(f"pull failed: {status} {description}".strip())

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """A task of the session's (stop() cancels it); those that ended are forgotten."""
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.create_task(coro, name=name))

    async def _take_over(self, pin: str) -> None:
        """Delivery invariant 7: hand nothing out under the new ``pin`` until every message pending on the
        consumer was delivered here, i.e. the earlier holder's calls in flight ended (acked, nak'd, or their
        AckWait ran out: a dead holder's come here then). Bounded: after 2 x AckWait + 2 s it goes on anyway."""
        d = self.delivery
        started = time.monotonic()
        deadline = started + 2 * self.ack_wait + 2.0
        waited_for = 0
        while d.pin_id == pin and d.taking_over and not self.closed:
            try:
                info = await self.consumer_info()
            except Exception as e:  # disconnected, no leader: ask again shortly
                log.debug("%s: consumer info for the take-over: %s", self.label, e)
                info = None
            if info is not None:
                pending = int(info.get("num_ack_pending", 0))
                # ours as of the info: a message delivered since is not in its count (nor to be taken as ours)
                upto = int((info.get("delivered") or {}).get("consumer_seq", 0))
                foreign = pending - d.own_pending(upto)
                if foreign <= 0:
                    break
                waited_for = max(waited_for, foreign)
                if self.window is not None:  # room for every pending message to come here
                    self.window.at_least(pending + self.window.base)
                    self._wake.set()
            if time.monotonic() >= deadline:
                log.warning(
                    "%s: took over the pin with %d message(s) of the earlier holder still pending after "
                    "%.1fs; handing out in stream order anyway",
                    self.label,
                    waited_for,
                    time.monotonic() - started,
                )
                break
            await self._delivered.wait(TAKEOVER_POLL)
        redelivered = d.taken_over(pin)
        if waited_for or redelivered:
            log.info(
                "%s: took over the pin with unacked message(s) of the earlier holder (%d still pending "
                "elsewhere, %d redelivered here): waited %.2fs, handing out in stream order",
                self.label,
                waited_for,
                redelivered,
                time.monotonic() - started,
            )

    def _lost_pin(self, description: str) -> None:
        if self.pin_id is not None:
            log.info("%s: lost the pin (%s)", self.label, description or "423")
        self.delivery.forget_pin()
        self._pin_changed()
        self._drop_queued()

    async def _check_consumer(self) -> None:
        """After a pull without responders: end the session only when the consumer does not exist."""
        try:
            await self.consumer_info()
        except NotFoundError:
            if not self.closed:
                self._gone("no responders: the consumer or its stream does not exist")
            return
        except Exception as e:  # no leader yet, a timeout, reconnecting: the consumer may well be there
            log.info("%s: consumer not answering (%s), pulling again", self.label, e)
            return
        log.info("%s: a pull found no responders but the consumer exists (a leader change?), pulling again", self.label)

    def _gone(self, reason: str) -> None:
        self._pulling = False
        self._pending = 0
        if self.owner is not None:
            self.owner.consumer_gone(reason)

    def _take_buffered(self) -> list[Msg]:
        """Empty the buffer and the dispatcher's queues: the messages no handler started."""
        return self.delivery.take_all() + self.dispatcher.drop_queued()

    def _drop_queued(self) -> None:
        """Forget buffered messages no handler started; nak them so they come back at once."""
        for m in self._take_buffered():
            if not self.nc.is_closed:
                nak = asyncio.ensure_future(self.delivery.nak_quietly(m))
                self._naks.add(nak)
                nak.add_done_callback(self._naks.discard)

    # --- pulling --------------------------------------------------------------------------
    async def _pull_loop(self) -> None:
        while not self.closed:
            if self.delivery.pin_doubtful():
                await self._confirm_pin()  # no handler starts meanwhile (Delivery.may_start)
            now = time.monotonic()
            if self._pulling and self.api.reconnect_if_silent(self._heard, self._silent_limit):
                # pulls outstanding, no answer from the consumer: the server is cut off from the rest of the cluster
                # (a partition), or the link is dead without the socket knowing
                log.info(
                    "%s: no answer from the consumer for %.1fs although pulls are outstanding",
                    self.label,
                    now - self._heard,
                )
            if self._pulling:
                if self._pending > 0 and now - self._last_seen > 3 * self.heartbeat:
                    log.debug("%s: no heartbeat for %.1fs, pulling again", self.label, now - self._last_seen)
                    self._pending = 0
                elif self._pending > 0 and now - self._last_refill > self.expires + 2 * self.heartbeat:
                    # The pull has ended by now (expired, with a 408 that says what it had left): what is
                    # still counted belongs to a pull lost with a connection.
                    log.debug(
                        "%s: %d requested messages of expired pulls never came, pulling again",
                        self.label,
                        self._pending,
                    )
                    self._pending = 0
                want, least = self._want(now) if self._pending <= 0 else (0, 1)  # one pull waits at a time
                if want >= least:
                    self._last_refill = now
                    await self._pull(want)
                elif self.pin_id is not None and now - self.delivery.last_pull >= self.keepalive:
                    await self._keepalive(self.pin_id)
            elif (
                self.pin_id is not None and self.dispatcher.running and now - self.delivery.last_pull >= self.keepalive
            ):
                # stopping (drain, halt): the calls in flight keep the pin until they end, so their acks are
                # not taken for a pause's (a pin in doubt supersedes them) and no other instance starts their
                # keys meanwhile; a message this delivers waits, and is nak'd by stop()
                await self._keepalive(self.pin_id)
            await self._wake.wait(min(self.heartbeat, self.keepalive))

    def _freed(self) -> None:
        """A message is done: room in the window, worth a turn of the pull loop when no pull waits."""
        if self._pending <= 0:
            self._wake.set()

    def _want(self, now: float) -> tuple[int, int]:
        """How many messages the next pull asks for (one pull waits at a time), and the least worth a pull: a
        batch, or as many as :data:`PULL_BYTES` hold at the average message size; with a
        :class:`~pcgroups.consume._dispatchers.Window`, no more than it has room for (a quarter of it at least, but any
        room during a take-over, which makes room for the earlier holder's messages as it learns of them)."""
        batch = self.sizes.fit(self.batch, PULL_BYTES)
        window = self.window
        if window is None:
            return batch, 1
        buffered = self.delivery.buffered
        outstanding = buffered + self.dispatcher.held + max(self._pending, 0)
        hungry = self._used_up and not buffered and self.dispatcher.idle_slot
        window.update(outstanding, self.dispatcher.starved, now, hungry)
        room = min(batch, window.room(outstanding))
        if self.delivery.taking_over:  # an earlier holder's messages come a few at a time: pull each room there is
            return room, 1
        return room, max(1, min(batch, window.room(0)) // 4)

    async def _confirm_pin(self) -> None:
        """After a gap in the pulls: ask consumer info whether the pin is still ours. If another (or none)
        is pinned, forget the pin and what was buffered under it (not handled, not nak'd: those
        messages are redelivered to the new pin holder)."""
        pin = self.pin_id
        try:
            info = await self.consumer_info()
        except Exception as e:  # disconnected, no leader: ask again shortly, start nothing meanwhile
            log.info("%s: cannot confirm the pin after a pause (%s)", self.label, e)
            await asyncio.sleep(0.1)
            return
        if self.pin_id != pin:
            return
        if pinned_client_id(info) == pin:
            self.delivery.pin_confirmed(time.monotonic())
            return
        log.info(
            "%s: the pin moved while this instance was paused; dropping %d buffered message(s)",
            self.label,
            len(self._take_buffered()),
        )
        self.delivery.forget_pin()
        self._pin_changed()
        self._wake.set()

    async def _keepalive(self, pin_id: str) -> None:
        """Renew the pin while the one waiting pull has not ended yet: a pull of one message that expires
        at once, so it is never counted as another instance's waiting pull."""
        try:
            await self.nc.publish(self._pull_subject, keepalive_request(pin_id), reply=self._keepalive_inbox)
        except Exception as e:  # disconnected: the heartbeat check pulls again later
            log.debug("%s: keep-alive pull not sent: %s", self.label, e)
            return
        self.delivery.pulled(time.monotonic())

    async def _pull(self, n: int) -> None:
        body = pull_request(batch=n, expires=self.expires, heartbeat=self.heartbeat, pin_id=self.pin_id)
        try:
            await self.nc.publish(self._pull_subject, body, reply=self._inbox)
        except Exception as e:  # disconnected: the heartbeat check pulls again later
            log.debug("%s: pull not sent: %s", self.label, e)
            return
        if self._pending <= 0:
            self._last_seen = time.monotonic()
        self._pending += n
        self._used_up = False
        log.debug("%s: pulled %d (pending %d, pin %s)", self.label, n, self._pending, self.pin_id)
        self.delivery.pulled(time.monotonic())

    # --- handler failures and +WPI --------------------------------------------------------
    def _fatal(self, error: BaseException) -> None:
        """A handler raised an error that is not an ``Exception`` (one at a time): pull no more, nak what waits, end
        the instance."""
        self._pulling = False
        self._drop_queued()
        if self.owner is not None:
            self.owner.fatal(error)

    async def _progress_loop(self) -> None:
        """Send +WPI for what the dispatcher says is overdue (a handler running longer than a third of
        AckWait; with key-level concurrency also messages waiting for their key) and for messages waiting in
        the buffer as long, so they are not redelivered."""
        interval = max(self.ack_wait / 3, 0.2)
        while not self.closed:
            await asyncio.sleep(interval / 2)
            now = time.monotonic()
            for m in [*self.dispatcher.overdue(now, interval), *self.delivery.overdue(now, interval)]:
                if not self.delivery.extend(m, now):
                    continue  # its pin was lost long enough ago: let its AckWait run out (Delivery invariant 8)
                m.last_progress = now
                try:
                    await self.nc.publish(m.reply, b"+WPI")
                except Exception:
                    pass

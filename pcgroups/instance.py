"""The consume context ``*_consume`` returns: one member instance, its control loop and its end.

The control loop also follows the pin (the session reports each change of it): it decides pinned or
standby, runs the rebalance hooks at the points their promises hold and emits the instance events
(:mod:`pcgroups.events`, :mod:`pcgroups.hooks`). The server gives the pin with a message, so an
instance is not a standby merely for having none: it is one once it was seen without the pin twice,
half a PinnedTTL apart, and consumer info shows another instance's pin (asked every half PinnedTTL
until then).
"""

from __future__ import annotations

import asyncio
import logging
import time
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Generator
from dataclasses import replace
from typing import Any, Generic, ParamSpec, TypeVar

from nats.aio.client import Client

from .connect import ConnectionWatch
from .delivery import Msg
from .errors import ConfigError, PCGroupsError
from .events import EventCallback, PartitionsHook
from .hooks import Handoff, HookError, Reporter
from .jsapi import PINNED_CLIENT, PRIORITY_GROUP, ConsumerConfig, JetStreamApi, pinned_client_id
from .permissions import PermissionWatch, Violation
from .scheduler import KeyFunc, RetryPolicy
from .session import Handler, PullSession, pinned_ttl

log = logging.getLogger("pcgroups")

DEFAULT_ACK_WAIT = 5.0


def member_template(template: ConsumerConfig | None) -> ConsumerConfig:
    """The user's consumer template with AckWait defaulted (5 s), as the reference does."""
    cfg = replace(template) if template is not None else ConsumerConfig()
    if cfg.ack_wait <= 0:
        cfg.ack_wait = DEFAULT_ACK_WAIT
    return cfg


def with_priority_group(cfg: ConsumerConfig, filters: list[str]) -> ConsumerConfig:
    """The member consumer: the template plus filters and the ``PCG`` pinned-client group."""
    return replace(cfg, filter_subjects=list(filters), priority_groups=[PRIORITY_GROUP],
                   priority_policy=PINNED_CLIENT, priority_timeout=pinned_ttl(cfg.ack_wait))


P = ParamSpec("P")
T = TypeVar("T")


class Starting(Generic[T]):
    """What a consume entry point returns: ``await`` it for the instance, or enter it directly with
    ``async with`` (the instance starts on entry and stops on exit)."""

    def __init__(self, start: Coroutine[Any, Any, T]):
        self._start = start
        self._instance: Any = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._start.__await__()

    async def __aenter__(self) -> T:
        self._instance = await self._start
        return await self._instance.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        await self._instance.__aexit__(*exc)


def startable(start: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Starting[T]]:
    """A consume entry point whose result is awaited or used with ``async with`` (:class:`Starting`)."""
    @functools.wraps(start)
    def entry(*args: P.args, **kwargs: P.kwargs) -> Starting[T]:
        return Starting(start(*args, **kwargs))
    return entry


class ConsumerInstance:
    """A running member instance. ``stop()`` ends it; ``await done()`` gives None or the error.

    Use it as an async context manager to stop it on exit. Events (config updates, a lost consumer,
    a failed handler, a change of the pin, stop) are handled one at a time by the control loop in
    arrival order. Started with ``handler=None`` it is iterated instead: ``async for msg in instance``
    (:class:`~pcgroups.hooks.Handoff`).
    """

    def __init__(self, nc: Client, api: JetStreamApi, *, stream: str, group: str, member: str,
                 handler: Handler | None, template: ConsumerConfig, batch: int, auto_in_progress: bool,
                 concurrency: int = 1, key: KeyFunc | None = None, retry: RetryPolicy | None = None,
                 on_assigned: PartitionsHook | None = None, on_revoked: PartitionsHook | None = None,
                 on_event: EventCallback | None = None):
        if handler is None and concurrency != 1:
            raise ConfigError("an instance iterated with async for takes one message at a time: concurrency "
                              f"must be 1 without a handler, got {concurrency}")
        self.nc = nc
        self.api = api
        self.stream_name = stream
        self.group_name = group
        self.member_name = member
        self.template = template
        self.batch = batch
        self.auto_in_progress = auto_in_progress
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = concurrency
        self.key = key
        self.retry = retry
        self.session: PullSession | None = None
        self.error: BaseException | None = None
        self.recovered_errors = 0
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._done: asyncio.Future = asyncio.get_running_loop().create_future()
        self._handoff: Handoff | None = None
        if handler is None:
            self._handoff = Handoff(self._done)
            handler = self._handoff.handler
        self.handler: Handler = handler
        self._reporter = Reporter(member, on_assigned=on_assigned, on_revoked=on_revoked, on_event=on_event,
                                  on_failure=lambda e: self._events.put_nowait(("fatal", e)))
        self._pin_state: str | None = None        # "pinned", "lost-pin" or "standby" once said
        self._unpinned_since: float | None = None  # first seen without the pin (since the last pin)
        self._pin_check: asyncio.TimerHandle | None = None
        self._consuming = asyncio.Event()
        self._stop_requested = False
        self._task: asyncio.Task | None = None
        self._watcher: Any = None   # nats-py KeyWatcher of the group's config key, set by _start
        self._watch_task: asyncio.Task | None = None
        self._unlisten: Callable[[], None] = lambda: None
        self._unwatch: Callable[[], None] = lambda: None

    # --- public surface -------------------------------------------------------------------
    @property
    def consuming(self) -> bool:
        """True while this instance has a consumer and is pulling (pinned or standby)."""
        return self._consuming.is_set() and not self._done.done()

    @property
    def pinned(self) -> bool:
        """True while this instance holds the pin (gets the member's messages)."""
        return self.session is not None and self.session.pinned and not self._done.done()

    async def wait_for_consuming(self, timeout: float | None = None) -> None:
        """Wait until the instance is attached to its consumer; raises if it ended first."""
        waiter = asyncio.ensure_future(self._consuming.wait())
        try:
            await asyncio.wait({waiter, self._done}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if self._done.done():
            raise self._done.result() or PCGroupsError("the instance ended before consuming")
        if not self._consuming.is_set():
            raise asyncio.TimeoutError(f"{self.member_name} did not start consuming within {timeout}s")

    def stop(self) -> asyncio.Future:
        """Ask the instance to end (idempotent, safe from a handler). Await the result to wait for it."""
        if not self._done.done():
            self._stop_requested = True
            if self.session is not None:
                self.session.halt()  # no handler starts from now on; the control loop drains and ends it
            self._events.put_nowait(("stop", None))
        return asyncio.shield(self._done)

    async def done(self) -> BaseException | None:
        """Wait for the end: None for a normal end (stop, group deleted), the error otherwise."""
        return await asyncio.shield(self._done)

    async def __aenter__(self) -> "ConsumerInstance":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    def __aiter__(self) -> AsyncIterator[Msg]:
        """The messages, for an instance started with ``handler=None`` (see :mod:`pcgroups.hooks`)."""
        if self._handoff is None:
            raise ConfigError("this instance runs a handler: only an instance started with handler=None "
                              "is iterated with async for")
        return self._handoff.messages()

    # --- for subclasses -------------------------------------------------------------------
    def _start(self, watcher: Any) -> None:
        self._unlisten = PermissionWatch.of(self.nc).listen(self._denied)
        self._unwatch = ConnectionWatch.of(self.nc).listen(
            lambda kind, url: self._reporter.emit(kind, detail=url))
        self._watcher = watcher
        self._watch_task = asyncio.create_task(self._pump_watch(), name=f"pcg-watch-{self.member_name}")
        self._task = asyncio.create_task(self._control(), name=f"pcg-control-{self.member_name}")

    def _denied(self, violation: Violation) -> None:
        """A publish or subscription of this connection was refused: a permission the instance needs is
        missing (docs/SECURITY.md). It ends with the error; waiting would never help."""
        s = self.session
        names = [self.api.pull_subject(s.stream, s.consumer), f"$JS.ACK.{s.stream}.{s.consumer}.>"] if s else []
        self._events.put_nowait(("fatal", violation.error(names)))

    async def _pump_watch(self) -> None:
        try:
            async for entry in self._watcher:
                self._events.put_nowait(("kv", entry))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._events.put_nowait(("watch-error", e))
            return
        self._events.put_nowait(("watch-closed", None))

    async def _control(self) -> None:
        result: BaseException | None = None
        try:
            while True:
                kind, value = await self._next_event()
                outcome = await self._handle(kind, value)
                if outcome is not _CONTINUE:
                    result = outcome
                    break
        except asyncio.CancelledError:
            result = None
        except HookError as e:  # logged by the reporter
            result = e.error
        except Exception as e:  # a bug or an unexpected server answer: end, never idle as a zombie
            log.exception("%s: control loop failed", self.member_name)
            result = e
        await self._finish(result)

    async def _next_event(self) -> tuple[str, Any]:
        return await self._events.get()

    async def _handle(self, kind: str, value: Any):
        """Handle one event; return ``_CONTINUE`` or the instance's result (None or an error)."""
        if kind == "stop":
            await self._stop_session(drain=True)
            return None
        if kind == "fatal":
            await self._stop_session(drain=False)
            return value
        if kind == "pin":
            await self._follow_pin()
            return _CONTINUE
        if kind == "watch-closed":
            await self._stop_session(drain=True)
            return PCGroupsError(f"the {self.flavour} consumer group config watcher has been closed, stopping")
        if kind == "watch-error":
            await self._stop_session(drain=True)
            return PCGroupsError(f"the {self.flavour} consumer group config watcher failed: {value}")
        return await self._handle_other(kind, value)

    flavour = "static"

    async def _handle_other(self, kind: str, value: Any):
        raise NotImplementedError

    async def _start_session(self, consumer: str) -> PullSession:
        session = PullSession(self.nc, self.api, stream=self._consume_stream, consumer=consumer,
                              handler=self.handler, ack_wait=self.template.ack_wait, batch=self.batch,
                              auto_in_progress=self.auto_in_progress,
                              on_fatal=lambda e: self._events.put_nowait(("fatal", e)),
                              on_gone=lambda r: self._events.put_nowait(("gone", r)),
                              label=f"{self.group_name}/{self.member_name}", concurrency=self.concurrency,
                              key=self.key or self._default_key(), retry=self.retry,
                              on_pin=lambda: self._events.put_nowait(("pin", None)), gated=self._reporter.gates)
        if self._stop_requested:
            session.halt()
        await session.start()
        self.session = session
        self._consuming.set()
        self._events.put_nowait(("pin", None))   # starts the standby check
        return session

    async def _stop_session(self, *, drain: bool) -> None:
        """Stop consuming (``drain``: in-flight handlers finish first); then ``on_revoked`` for what the
        owner was told it owns."""
        session, self.session = self.session, None
        self._consuming.clear()
        if session is not None:
            await session.stop(drain=drain)
        self._pin_state = self._unpinned_since = None
        if self._pin_check is not None:
            self._pin_check.cancel()
        self._reporter.forget("pin")
        await self._reporter.settle(())

    # --- the pin, the hooks and the events ----------------------------------------------------
    @property
    def partitions(self) -> list[int]:
        """The partitions this instance's member owns under the current config."""
        raise NotImplementedError

    def _handed_out(self, session: PullSession) -> set[int]:
        """The partitions ``session`` hands out (what a pinned instance owns for its hooks)."""
        return set(session.partitions) if session.partitions is not None else set(self.partitions)

    async def _follow_pin(self) -> None:
        """The pin changed, or a standby check is due: hooks and events for the instance's pin state."""
        session = self.session
        if session is None or session.closed or self._stop_requested:
            return
        if session.pinned:
            self._unpinned_since = None
            if self._pin_state != "pinned":
                owned = self._handed_out(session)
                await self._reporter.settle(owned)
                self._pin_state = "pinned"
                self._reporter.emit("pinned", owned)
            session.admit()
            return
        if self._pin_state == "pinned":
            await session.idle()   # the handlers in flight under the lost pin finish first
            await self._reporter.settle(())
            self._pin_state = "lost-pin"
            self._reporter.emit("lost-pin")
        if self._pin_state == "standby":
            return
        now = time.monotonic()
        if self._unpinned_since is None:
            self._unpinned_since = now
        half = pinned_ttl(self.template.ack_wait) / 2
        due = self._unpinned_since + half
        if now >= due and await self._other_pinned(session):
            self._pin_state = "standby"
            self._reporter.emit("standby")
            return
        # Not yet, or nobody holds the pin (the server gives it with a message): look again later.
        if self._pin_check is not None:
            self._pin_check.cancel()
        self._pin_check = asyncio.get_running_loop().call_later(
            max(due - now, 0.0) + (0.01 if now < due else half), self._events.put_nowait, ("pin", None))

    async def _other_pinned(self, session: PullSession) -> bool:
        """Consumer info shows another instance's pin (None: no answer, or nobody is pinned)."""
        try:
            info = await session.consumer_info()
        except Exception as e:  # noqa: BLE001 - disconnected, no leader: asked again later
            log.debug("%s: consumer info for the pin: %s", self.member_name, e)
            return False
        pin = pinned_client_id(info)
        return pin is not None and not session.pinned and pin != session.pin_id

    async def _settle_pinned(self, owned: set[int]) -> None:
        """While pinned: the hooks for a change of the partitions handed out (the caller made sure no handler
        of a partition given up runs, and none of a partition gained started)."""
        if self._pin_state == "pinned":
            try:
                await self._reporter.settle(owned)
            except HookError:
                if self.session is not None:
                    self.session.halt()   # the instance ends: no handler starts meanwhile
                raise

    _consume_stream = ""

    def _default_key(self) -> KeyFunc | None:
        return None  # the stripped subject

    async def _finish(self, result: BaseException | None) -> None:
        self._unlisten()
        self._unwatch()
        try:
            await self._stop_session(drain=result is None)
        except HookError as e:
            result = result or e.error
        if self._watch_task is not None:
            self._watch_task.cancel()
        if self._watcher is not None:
            try:
                await self._watcher.stop()
            except Exception:
                pass
        self.error = result
        if not self._done.done():
            self._done.set_result(result)


_CONTINUE = object()

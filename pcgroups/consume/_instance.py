"""The consume context ``*_consume`` returns: one member instance, its control loop and its end.

The instance is a :class:`~pcgroups.consume._loop.ControlLoop` over the events below (frozen dataclasses,
handled with ``match``): :class:`~pcgroups.consume._loop.Stop`, :class:`Fatal`, :class:`PinChanged` and
:class:`WatchEnded` here, :class:`ConfigUpdate`, :class:`ConsumerGone` and :class:`Reconcile` by each
flavour (``_config_update``, ``_consumer_gone``, ``_handle_flavour``).

The control loop also follows the pin (the session reports each change of it): it decides pinned or
standby, runs the rebalance hooks at the points their promises hold and emits the instance events
(:mod:`pcgroups.events`, :mod:`pcgroups.consume._report`). The server gives the pin with a message, so an
instance is not a standby merely for having none: it is one once it was seen without the pin twice,
half a PinnedTTL apart, and consumer info shows another instance's pin (asked every half PinnedTTL
until then). Likewise it says it lost the pin only once consumer info shows another instance's: a pin
that merely went away (a server restart, a step-down with nothing to deliver) is not news, and a new
pin of its own after it says nothing more (unless the partitions changed).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Generator
from dataclasses import dataclass, replace
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.kv import KeyValue

from ..errors import ConfigError, JetStreamAPIError, PCGroupsError
from ..events import InstanceEvent
from ..jetstream._api import (
    ERR_JETSTREAM_UNAVAILABLE,
    PINNED_CLIENT,
    PRIORITY_GROUP,
    ConsumerConfig,
    ConsumerTemplate,
    JetStreamApi,
    pinned_client_id,
)
from ..jetstream._connection import Connection
from ..jetstream._permissions import Violation
from ..jetstream._store import Watch, stop_watch
from ..tracing import NO_TRACING, InstanceTracing
from ._dead import DeadLetters
from ._dispatchers import Handler, as_handle
from ._handoff import Handoff
from ._keys import KeyFunc, key_by_subject
from ._loop import CONTINUE, ConsumeContext, ControlLoop, Outcome, Stop
from ._msg import Msg
from ._options import ConsumeOptions, Member, Remote, dispatcher_factory
from ._report import HookError, Reporter
from ._retry import RetryPolicy
from ._session import PullSession, pinned_ttl

log = logging.getLogger("pcgroups")

START_RETRY = (0.25, 2.0)  # a start that found the server not answering: first and longest wait before trying again


#: Consumer settings that are the member's, not an instance's (its name, filters and priority group).
KEPT_SETTINGS = {"name", "durable_name", "filter_subjects", "priority_groups", "priority_policy", "priority_timeout"}
_DURATIONS = {"ack_wait", "max_expires", "inactive_threshold", "priority_timeout"}


def setting_differences(
    have: dict[str, Any], want: dict[str, Any], *, only: set[str] | None = None
) -> list[tuple[str, str, str]]:
    """What differs between two consumer configs (wire JSON): ``(key, have, want)`` shown for people
    (durations in seconds); ``only``: those keys."""

    def shown(key: str, value: Any) -> str:
        if key in _DURATIONS and isinstance(value, int):
            return f"{value / 1e9:g}s"
        if key == "backoff" and isinstance(value, list):
            return ",".join(f"{v / 1e9:g}s" for v in value) or "none"
        return "unset" if value is None else str(value)

    keys = sorted(only if only is not None else (set(have) | set(want)) - {"created"})
    return [(k, shown(k, have.get(k)), shown(k, want.get(k))) for k in keys if have.get(k) != want.get(k)]


def member_template(template: ConsumerTemplate | None) -> ConsumerConfig:
    """The user's consumer template (pcgroups' or nats-py's type) with AckWait defaulted (5 s), as the reference
    does."""
    return ConsumeOptions(config=template).template()


async def _no_handler(msg: Msg) -> None:  # a dispatching instance's (its dispatcher never calls it)
    raise RuntimeError("a dispatching instance runs no handler")


def with_priority_group(cfg: ConsumerConfig, filters: list[str]) -> ConsumerConfig:
    """The member consumer: the template plus filters and the ``PCG`` pinned-client group."""
    return replace(
        cfg,
        filter_subjects=list(filters),
        priority_groups=[PRIORITY_GROUP],
        priority_policy=PINNED_CLIENT,
        priority_timeout=pinned_ttl(cfg.ack_wait),
    )


@dataclass(frozen=True)
class Fatal:
    """An error that ends the instance at once (no drain): a refused permission, a failed hook, the
    session's unrecoverable error."""

    error: BaseException


@dataclass(frozen=True)
class ConsumerGone:
    """The session lost the member's consumer (deleted, or the stream went away)."""

    reason: str


@dataclass(frozen=True)
class ConfigUpdate:
    """The group's KV entry changed (a put, a delete or a purge)."""

    entry: KeyValue.Entry


@dataclass(frozen=True)
class WatchEnded:
    """The config watch ended: closed (``error`` None) or failed."""

    error: BaseException | None


@dataclass(frozen=True)
class PinChanged:
    """The pin changed, or a standby check is due (``_follow_pin``)."""


@dataclass(frozen=True)
class Reconcile:
    """Elastic: bring the member's consumer to the filters the config gives it."""


ControlEvent = Stop | Fatal | ConsumerGone | ConfigUpdate | WatchEnded | PinChanged | Reconcile


P = ParamSpec("P")
T = TypeVar("T", bound=ConsumeContext)
S = TypeVar("S", bound="AsyncContext")


class AsyncContext(Protocol):
    """Something used with ``async with`` (a consume context, a worker)."""

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: Any) -> Any: ...


class Starting(Generic[S]):
    """What a consume entry point (or ``serve_worker``) returns: ``await`` it for the instance (a
    :class:`ConsumeContext`), or enter it directly with ``async with`` (the instance starts on entry and stops
    on exit)."""

    def __init__(self, start: Coroutine[Any, Any, S]):
        self._start = start
        self._instance: Any = None

    def __await__(self) -> Generator[Any, None, S]:
        return self._start.__await__()

    async def __aenter__(self) -> S:
        self._instance = await self._start
        entered: S = await self._instance.__aenter__()
        return entered

    async def __aexit__(self, *exc: Any) -> None:
        await self._instance.__aexit__(*exc)


def startable(start: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Starting[T]]:
    """A consume entry point whose result is awaited or used with ``async with`` (:class:`Starting`); the
    start is tried again while the server does not answer (:func:`start_patiently`)."""

    @functools.wraps(start)
    def entry(*args: P.args, **kwargs: P.kwargs) -> Starting[T]:
        return Starting(start_patiently(start, inspect.signature(start).bind(*args, **kwargs)))

    return entry


def traced_retry(retry: RetryPolicy | None, trace: InstanceTracing) -> RetryPolicy | None:
    """``retry`` (None: the default policy) telling ``trace`` of dead letters too, when it traces."""
    if not trace.enabled:
        return retry
    retry = retry or RetryPolicy()
    told = retry.on_dead_letter

    def on_dead_letter(msg: Msg, reason: str) -> None:
        trace.dead_letter(msg, reason)
        if told is not None:
            told(msg, reason)

    return replace(retry, on_dead_letter=on_dead_letter)


async def start_patiently(start: Callable[..., Coroutine[Any, Any, T]], call: inspect.BoundArguments) -> T:
    """``start(*call.args, **call.kwargs)``, again and again while it fails because the server or JetStream does
    not answer (:func:`unavailable`): started while the server restarts, an instance waits for it as a running
    one does. The first such failure is said once, as an ``unavailable`` event (a warning without ``on_event``);
    any other error is raised. Cancel the start (or close the connection) to give up."""
    member, on_event = call.arguments.get("member") or "", call.arguments.get("on_event")
    delay, told = START_RETRY[0], False
    while True:
        try:
            return await start(*call.args, **call.kwargs)
        except Exception as e:
            if not unavailable(e) or call.arguments["nc"].is_closed:
                raise
            if not told:
                told = True
                if on_event is not None:
                    on_event(InstanceEvent("unavailable", member, detail=str(e) or type(e).__name__))
                else:
                    log.warning("%s: not started: %s; trying again until the server answers", member, e)
            log.debug("%s: not started (%r); trying again in %.2fs", member, e, delay)
        await asyncio.sleep(delay)
        delay = min(2 * delay, START_RETRY[1])


def unavailable(error: BaseException) -> bool:
    """The server or JetStream did not answer (a timeout, no responders, "temporarily unavailable", the client
    reconnecting): asking again later may work."""
    if isinstance(error, JetStreamAPIError):
        return error.code in (408, 503) or error.err_code == ERR_JETSTREAM_UNAVAILABLE
    return isinstance(
        error,
        (
            TimeoutError,
            nats.errors.NoRespondersError,
            nats.errors.ConnectionReconnectingError,
            nats.js.errors.ServiceUnavailableError,
        ),
    )


class ConsumerInstance(ControlLoop[ControlEvent]):
    """A running member instance. ``stop()`` ends it; ``await done()`` gives None or the error.

    Use it as an async context manager to stop it on exit. Events (config updates, a lost consumer,
    a failed handler, a change of the pin, stop) are handled one at a time by the control loop in
    arrival order. Started with ``handler=None`` it is iterated instead: ``async for msg in instance``
    (:class:`~pcgroups.consume._report.Handoff`).
    """

    def __init__(
        self,
        nc: Client,
        api: JetStreamApi,
        *,
        stream: str,
        group: str,
        member: str,
        options: ConsumeOptions,
        remote: Remote | None = None,
        template: ConsumerConfig | None = None,
    ):
        super().__init__()
        self.nc = nc
        self.api = api
        self.stream_name = stream
        self.group_name = group
        self.member_name = member
        self.options = options
        self.remote = remote  # with options.dispatch: the worker pool (made by the flavour that starts it)
        #: the member consumer's template (the options' own, or the flavour's, made from it)
        self.template = template if template is not None else options.template()
        self.concurrency = options.concurrency
        self.key = options.key
        #: the instance's spans (:mod:`pcgroups.tracing`; :data:`~pcgroups.tracing.NO_TRACING` without ``tracing``)
        tracing = options.tracing
        self.trace: InstanceTracing = (
            NO_TRACING if tracing is None else tracing.instance(self.flavour, stream, group, member)
        )
        self.retry = traced_retry(options.retry, self.trace)
        self.session: PullSession | None = None
        #: Faults the instance absorbed without ending: how many times its member's consumer went away
        #: under it (deleted by hand, or by the server after its inactive threshold, as after a long
        #: pause of the process) while the group and its work queue remained, and it created the consumer
        #: again and went on (elastic instances; a static instance ends with ``ConsumerGoneError``
        #: instead, so its count stays 0). Each one is also logged at info level.
        self.recovered_errors = 0
        self._handoff: Handoff | None = None
        handler = options.handler
        if options.dispatch:  # the group's workers run the handler
            handler = _no_handler
        elif handler is None:
            self._handoff = Handoff(self._done)
            handler = self._handoff.handler
        self.handler: Handler = handler if options.dispatch else self.trace.wrap(handler)
        self._reporter = Reporter(
            member,
            on_assigned=options.on_assigned,
            on_revoked=options.on_revoked,
            on_event=options.on_event,
            on_failure=lambda e: self._post(Fatal(e)),
        )
        # "pinned", "lost-pin" or "standby" once said; "unpinned": lost the pin, nobody else seen with it yet
        self._pin_state: str | None = None
        self._held_pin: str | None = None  # the pin this instance held last (not another's)
        self._unpinned_since: float | None = None  # first seen without the pin (since the last pin)
        self._pin_check: asyncio.TimerHandle | None = None
        self._consuming = asyncio.Event()
        self._watcher: Watch | None = None  # the group's config key, set by _start
        self._watch_task: asyncio.Task[None] | None = None
        self._unlisten: Callable[[], None] = lambda: None
        self._unwatch: Callable[[], None] = lambda: None
        self._leaving = False  # its own leave is under way: the membership change it makes is no news

    # --- public surface -------------------------------------------------------------------
    @property
    def dispatching(self) -> bool:
        """True for an instance started with ``dispatch=True``: the group's workers run its handler."""
        return self.options.dispatch

    @property
    def member(self) -> Member:
        return Member(self.flavour, self.stream_name, self.group_name, self.member_name)

    def pool_status(self) -> dict[str, Any] | None:
        """A dispatching instance's pool: its workers, messages in flight and waiting (None otherwise)."""
        session = self.session
        if session is None or not self.options.dispatch:
            return None
        status: dict[str, Any] = session.dispatcher.status()  # type: ignore[attr-defined]
        return status

    def dead_letter_status(self) -> dict[str, Any]:
        """What the pinned instance knows of its member's dead letters: ``parked_keys`` (the keys parked in its
        partitions) and ``oldest_failing`` (seconds since the oldest message failing now first failed; 0 without
        one). A standby says 0 for both."""
        session = self.session
        if session is None or session.dead_letters is None or not session.pinned:
            return {"parked_keys": 0, "oldest_failing": 0.0}
        return session.dead_letters.status()

    # --- what its pull session tells it (SessionOwner) --------------------------------------------
    def pin_changed(self) -> None:
        self._post(PinChanged())

    def consumer_gone(self, reason: str) -> None:
        self._post(ConsumerGone(reason))

    def fatal(self, error: BaseException) -> None:
        self._post(Fatal(error))

    def dead_letter_refused(self, detail: str) -> None:
        self._reporter.emit("dead-letter-refused", detail=detail)

    def _worker_said(self, kind: str, name: str, detail: str) -> None:
        self._reporter.emit(kind, detail=f"{name}: {detail}")

    @property
    def consuming(self) -> bool:
        """True while this instance has a consumer and is pulling (pinned or standby)."""
        return self._consuming.is_set() and not self._done.done()

    @property
    def pinned(self) -> bool:
        """True while this instance holds the pin (gets the member's messages)."""
        return self.session is not None and self.session.pinned and not self._done.done()

    def leaving(self) -> None:
        """Its owner is taking the member out of the group to stop it (automatic membership): the
        member's removal is not reported as ``dropped`` (the instance is not waiting to be added)."""
        self._leaving = True

    def __aiter__(self) -> AsyncIterator[Msg]:
        """The messages, for an instance started with ``handler=None`` (see :mod:`pcgroups.consume._report`)."""
        if self._handoff is None:
            raise ConfigError(
                "this instance runs a handler: only an instance started with handler=None is iterated with async for"
            )
        return self._handoff.messages()

    # --- the control loop -------------------------------------------------------------------
    def _halt(self) -> None:
        if self.session is not None:
            self.session.halt()  # no handler starts from now on; the control loop drains and ends it
        if not self.nc.is_connected:
            self._interrupt()  # disconnected: a reconcile in progress would wait out its timeouts

    async def _attached(self) -> None:
        await self._consuming.wait()

    def _start(self, watcher: Watch) -> None:
        self._unlisten = Connection.of(self.nc).permissions.listen(self._denied)
        self._unwatch = Connection.of(self.nc).watch.listen(lambda kind, url: self._reporter.emit(kind, detail=url))
        self._watcher = watcher
        self._watch_task = asyncio.create_task(self._pump_watch(), name=f"pcg-watch-{self.member_name}")
        self._launch(f"pcg-control-{self.member_name}")

    def _denied(self, violation: Violation) -> None:
        """A publish or subscription of this connection was refused: a permission the instance needs is
        missing (docs/SECURITY.md). It ends with the error; waiting would never help."""
        s = self.session
        names = [self.api.pull_subject(s.stream, s.consumer), f"$JS.ACK.{s.stream}.{s.consumer}.>"] if s else []
        if self.remote is not None:
            names += self.remote.subjects(self.member)
        self._post(Fatal(violation.error(names)))

    async def _pump_watch(self) -> None:
        assert self._watcher is not None
        try:
            async for entry in self._watcher:
                if isinstance(entry, KeyValue.Entry):  # not None (the end of the current values) nor RESTARTED
                    self._post(ConfigUpdate(entry))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._post(WatchEnded(e))
            return
        self._post(WatchEnded(None))

    def _failed(self, error: Exception) -> BaseException | None:
        if isinstance(error, HookError):  # logged by the reporter
            return error.error
        return super()._failed(error)

    async def _handle(self, event: ControlEvent) -> Outcome:
        match event:
            case Stop():
                await self._stop_session(drain=True)
                return None
            case Fatal(error=error):
                await self._stop_session(drain=False)
                return error
            case PinChanged():
                await self._follow_pin()
                return CONTINUE
            case WatchEnded(error=None):
                await self._stop_session(drain=True)
                return PCGroupsError(f"the {self.flavour} consumer group config watcher has been closed, stopping")
            case WatchEnded(error=error):
                await self._stop_session(drain=True)
                return PCGroupsError(f"the {self.flavour} consumer group config watcher failed: {error}")
            case ConfigUpdate(entry=entry):
                return await self._ended_by(await self._config_update(entry))
            case ConsumerGone(reason=reason):
                return await self._ended_by(await self._consumer_gone(reason))
        return await self._handle_flavour(event)

    async def _ended_by(self, outcome: Outcome) -> Outcome:
        """A config change or a lost consumer ends the instance with None when the group was deleted: a
        dispatching instance tells the group's workers, which end too (its ``Remote``)."""
        if outcome is None and self.remote is not None and self.options.dispatch:
            await self.remote.group_ended(self.nc, self.member, "deleted")
        return outcome

    flavour = "static"

    async def _config_update(self, entry: KeyValue.Entry) -> Outcome:
        """The group's config changed (or was deleted): follow it, or end with why not."""
        raise NotImplementedError

    async def _consumer_gone(self, reason: str) -> Outcome:
        """The member's consumer went away under the session."""
        raise NotImplementedError

    async def _handle_flavour(self, event: ControlEvent) -> Outcome:
        """A flavour's own further events (elastic: :class:`Reconcile`)."""
        return CONTINUE

    async def _start_session(self, consumer: str) -> PullSession:
        retry = self.retry or RetryPolicy()
        sessions: list[PullSession] = []  # the one made below, for what its dead letters ask
        dead = DeadLetters(
            self.api,
            flavour=self.flavour,
            stream=self.stream_name,
            group=self.group_name,
            member=self.member_name,
            origin=self._consume_stream,
            consumer=consumer,
            park_keys=retry.park_keys and retry.to_group_stream,
            label=f"{self.group_name}/{self.member_name}",
            owned=lambda: self._handed_out(sessions[0]) if sessions else set(),
            emit=self._reporter.emit,
        )
        dispatcher = dispatcher_factory(
            self.nc,
            self.options,
            self.member,
            remote=self.remote,
            handle=as_handle(self.handler),
            key=self.key or self._default_key() or key_by_subject,
            retry=retry,
            max_ack_pending=self.template.max_ack_pending,
            on_worker=self._worker_said,
        )
        session = PullSession(
            self.nc,
            self.api,
            stream=self._consume_stream,
            consumer=consumer,
            ack_wait=self.template.ack_wait,
            options=self.options,
            dispatcher=dispatcher,
            owner=self,
            label=f"{self.group_name}/{self.member_name}",
            gated=self._reporter.gates,
            trace=self.trace,
            dead_letters=dead,
        )
        sessions.append(session)
        if self._stop_requested:
            session.halt()
        await session.start()
        self.session = session
        self._consuming.set()
        self._post(PinChanged())  # starts the standby check
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
            self._held_pin = session.pin_id
            if self._pin_state != "pinned":
                owned = self._handed_out(session)
                with self.trace.take_over(owned, session.pin_id, self._pin_state):
                    await self._reporter.settle(owned)
                    self._pin_state = "pinned"
                    self._reporter.emit("pinned", owned)
            session.admit()
            return
        if self._pin_state == "pinned":
            await session.idle()  # the handlers in flight under the lost pin finish first
            await self._reporter.settle(())
            # Said only once consumer info shows another pin: after a server restart or a step-down with
            # nothing to deliver, nobody holds it, and this instance may well get the next one.
            self._pin_state = "unpinned"
            if await self._other_pinned(session):
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
            if self._pin_state == "unpinned":
                self._reporter.emit("lost-pin")
            self._pin_state = "standby"
            self._reporter.emit("standby", self.partitions)
            return
        # Not yet, or nobody holds the pin (the server gives it with a message): look again later.
        if self._pin_check is not None:
            self._pin_check.cancel()
        self._pin_check = asyncio.get_running_loop().call_later(
            max(due - now, 0.0) + (0.01 if now < due else half), self._post, PinChanged()
        )

    async def _other_pinned(self, session: PullSession) -> bool:
        """Consumer info shows another instance's pin (None: no answer, or nobody is pinned)."""
        try:
            info = await session.consumer_info()
        except Exception as e:
            log.debug("%s: consumer info for the pin: %s", self.member_name, e)
            return False
        pin = pinned_client_id(info)
        return pin is not None and not session.pinned and pin not in (session.pin_id, self._held_pin)

    async def _settle_pinned(self, owned: set[int]) -> None:
        """While pinned: the hooks for a change of the partitions handed out (the caller made sure no handler
        of a partition given up runs, and none of a partition gained started)."""
        if self._pin_state == "pinned":
            try:
                await self._reporter.settle(owned)
            except HookError:
                if self.session is not None:
                    self.session.halt()  # the instance ends: no handler starts meanwhile
                raise

    _consume_stream = ""

    def _default_key(self) -> KeyFunc | None:
        return None  # the stripped subject

    async def _close(self, result: BaseException | None) -> BaseException | None:
        self.trace.close()
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
                await stop_watch(self._watcher)
            except Exception:
                pass
        return result

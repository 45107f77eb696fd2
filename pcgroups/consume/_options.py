"""How a member instance consumes: one frozen :class:`ConsumeOptions`, built once and handed down whole.

``static_consume`` and ``elastic_consume`` build it from their keyword arguments, or take the one the caller
built (``options=``: the CLI does); the instance keeps it and makes its pull session's dispatcher from it
(:func:`dispatcher_factory`). With ``dispatch`` the handlers run in other processes, the worker pool: the
flavour that starts the instance hands it a :class:`Remote` (made by ``pcgroups.pool``), so the consume core
does not know the pool.

Invariants:

1. A ``ConsumeOptions`` that exists is consistent: ``concurrency`` >= 1; without a handler (``async for``)
   one message at a time; with ``dispatch`` no handler and no ``concurrency`` (the workers' capacities are
   the concurrency), ``max_in_flight`` >= 0. Anything else is a :class:`~pcgroups.errors.ConfigError` when
   it is built, before anything connects.
2. The dispatcher follows from it and the instance's :class:`Remote` alone: the remote's with
   ``dispatch``, key-level concurrency when ``concurrency`` > 1, else one handler at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Protocol

from nats.aio.client import Client

from ..errors import ConfigError
from ..events import EventCallback, PartitionsHook
from ..jetstream._api import ConsumerConfig, ConsumerTemplate
from ..tracing import Tracing
from ._delivery import Delivery, Dispatcher
from ._dispatchers import ConsumerControl, Handle, Handler, KeyedDispatcher, SerialDispatcher
from ._keys import KeyFunc
from ._retry import RetryPolicy
from ._window import FAIR_WINDOW, WINDOW_PER_SLOT, MessageSize, Window

DEFAULT_BATCH = 500
DEFAULT_ACK_WAIT = 5.0

#: What a pull session asks for its dispatcher: (its delivery, itself, its message sizes, its fatal-error
#: callback) -> the dispatcher and, with key-level concurrency, the window of messages it holds.
DispatcherFactory = Callable[
    [Delivery, ConsumerControl, MessageSize, Callable[[BaseException], None]], tuple[Dispatcher, Window | None]
]
#: What a dispatcher says of its workers: (kind, worker name, detail), as instance events.
WorkerNews = Callable[[str, str, str], None]


@dataclass(frozen=True)
class Member:
    """Which member an instance runs: its flavour, its stream (as the user names it), group and member."""

    flavour: str
    stream: str
    group: str
    member: str


class Remote(Protocol):
    """Handlers that run in other processes: how a dispatching instance hands its messages out."""

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
    ) -> KeyedDispatcher:
        """A keyed dispatcher whose calls run elsewhere; its ``on_resize`` is told the slots it has."""

    def subjects(self, member: Member) -> list[str]:
        """The subjects it publishes and subscribes to (named in a permission error)."""

    async def group_ended(self, nc: Client, member: Member, why: str) -> None:
        """The group is gone (``why``: ``deleted``): tell whatever runs the handlers."""


@dataclass(frozen=True)
class ConsumeOptions:
    """How a member instance consumes (see the module docstring). ``config`` is the consumer template
    (``max_ack_pending=1`` for strict order; AckWait defaults to 5 s); ``dispatch``: the handlers run on the
    group's workers (:func:`pcgroups.serve_worker`), at most ``max_in_flight`` at once (0: their capacities)."""

    handler: Handler | None = None
    config: ConsumerTemplate | None = None
    batch: int = DEFAULT_BATCH
    auto_in_progress: bool = True
    concurrency: int = 1
    key: KeyFunc | None = None
    retry: RetryPolicy | None = None
    on_assigned: PartitionsHook | None = None
    on_revoked: PartitionsHook | None = None
    on_event: EventCallback | None = None
    tracing: Tracing | None = None
    dispatch: bool = False
    max_in_flight: int = 0

    def __post_init__(self) -> None:
        if self.dispatch:
            if self.handler is not None:
                raise ConfigError(
                    "a dispatching instance (dispatch=True) runs no handler: the group's workers do "
                    "(pcgroups.serve_worker); pass handler=None"
                )
            if self.concurrency != 1:
                raise ConfigError(
                    "with dispatch=True the workers' capacities are the concurrency: cap the messages "
                    f"in flight with max_in_flight, not concurrency (got {self.concurrency})"
                )
        elif self.handler is None and self.concurrency != 1:
            raise ConfigError(
                "an instance iterated with async for takes one message at a time: concurrency "
                f"must be 1 without a handler, got {self.concurrency}"
            )
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.max_in_flight < 0:
            raise ConfigError(f"max_in_flight must be >= 0 (0: the workers' capacities), got {self.max_in_flight}")

    @property
    def keyed(self) -> bool:
        """More than one message at a time: key-level concurrency, here or at the workers."""
        return self.concurrency > 1 or self.dispatch

    def template(self) -> ConsumerConfig:
        """The member consumer's template: ``config`` (pcgroups' or nats-py's type) with AckWait defaulted (5 s, as
        the reference), and a fair window (:data:`FAIR_WINDOW`) when keyed and ``max_ack_pending`` is unset."""
        cfg = ConsumerConfig.of(self.config) if self.config is not None else ConsumerConfig()
        if cfg.ack_wait <= 0:
            cfg.ack_wait = DEFAULT_ACK_WAIT
        if self.keyed and cfg.max_ack_pending <= 0:
            cfg.max_ack_pending = FAIR_WINDOW
        return cfg


def consume_options(options: ConsumeOptions | None, **given: Any) -> ConsumeOptions:
    """A consume call's options: ``options`` as given, or built from the keyword arguments ``given``; a
    keyword argument other than its default beside ``options`` is a ConfigError (which would win?)."""
    if options is None:
        return ConsumeOptions(**given)
    defaults = {f.name: f.default for f in fields(ConsumeOptions)}
    both = sorted(name for name, value in given.items() if value != defaults[name])
    if both:
        raise ConfigError(
            f"give the consume options as options= or as keyword arguments, not both: "
            f"{', '.join(both)} given beside options="
        )
    return options


def dispatcher_factory(
    nc: Client,
    options: ConsumeOptions,
    member: Member,
    *,
    remote: Remote | None,
    handle: Handle,
    key: KeyFunc,
    retry: RetryPolicy,
    max_ack_pending: int,
    on_worker: WorkerNews,
) -> DispatcherFactory:
    """How the instance's pull sessions make their dispatcher (invariant 2)."""
    cap = max_ack_pending if max_ack_pending > 0 else FAIR_WINDOW
    if options.dispatch and remote is None:
        raise ConfigError(
            "dispatch=True needs the worker pool (start the instance with static_consume or elastic_consume)"
        )

    def make(
        delivery: Delivery, control: ConsumerControl, sizes: MessageSize, on_fatal: Callable[[BaseException], None]
    ) -> tuple[Dispatcher, Window | None]:
        if options.dispatch and remote is not None:
            remote_dispatcher = remote.dispatcher(
                nc, delivery, control, member, key=key, retry=retry, on_worker=on_worker
            )
            window = Window(WINDOW_PER_SLOT, cap, sizes, reach=options.batch)
            remote_dispatcher.on_resize = lambda slots: window.rebase(WINDOW_PER_SLOT * max(slots, 1))
            return remote_dispatcher, window
        if options.concurrency > 1:
            keyed = KeyedDispatcher(delivery, handle, control, concurrency=options.concurrency, key=key, retry=retry)
            return keyed, Window(WINDOW_PER_SLOT * options.concurrency, cap, sizes, reach=options.batch)
        return SerialDispatcher(delivery, handle, control, key=key, retry=retry, on_fatal=on_fatal), None

    return make

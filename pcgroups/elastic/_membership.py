"""Automatic membership for elastic groups: instances join a group by starting and leave by stopping
(or dying); the partitions rebalance by themselves, with the fewest moves.

Each instance keeps a **lease**, the KV key ``<stream>.<group>.<member>.<instance>`` in the bucket
``pcgroups-leases`` (history 1, per-message TTL, limit markers, so an expired key shows up in a watch
as a purge). It is created with ``Nats-Expected-Last-Subject-Sequence: 0`` and renewed every TTL/3
by a compare-and-set publish carrying ``Nats-TTL`` (nats-py's ``kv.put``/``kv.update`` take no TTL,
and its ``kv.get``/``kv.create`` mishandle the server's TTL markers, so neither is used here).

The membership is the set of members with at least one live lease. Every instance watches its
group's leases and config; ``debounce`` seconds after the last change it computes the sticky
assignment (:func:`pcgroups.elastic._sticky.sticky_assignment`, previous = the config's mappings or the
balanced assignment of its members) and writes it as ``member_mappings`` with compare-and-set. The
computation is deterministic and a fixed point, so there is no coordinator: concurrent writers write
the same value or find it written; joins and leaves close together make one rebalance. Go members
read the result as ordinary mappings.

The entry point is ``elastic_consume(..., auto=True)``: it starts the member's regular elastic
instance, which follows the config (drain before hand-off, standbys, step-down). A member name given by the user
makes its instances hot standbys of each other (one pinned); without one, each instance is a member
of its own (``auto-<8 hex>``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, cast

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from ..config import ElasticConfig, MemberMapping, parse_elastic_config, validate_name
from ..consume._instance import ConsumerInstance
from ..consume._loop import CONTINUE, ControlLoop, Outcome, Stop
from ..consume._msg import Msg
from ..errors import ConfigError, NotFoundError, PCGroupsError
from ..flavour import work_queue_name
from ..jetstream._api import ERR_WRONG_LAST_SEQUENCE, JetStreamApi, pinned_client_id
from ..jetstream._store import (
    ELASTIC_BUCKET,
    Entry,
    Restarted,
    Watch,
    bucket_call,
    group_key,
    kv_call,
    kv_jetstream,
    open_bucket,
    snapshot,
    stop_watch,
    update,
)
from ._sticky import moved_partitions, previous_assignment, sticky_mappings

log = logging.getLogger("pcgroups")

__all__ = [
    "LEASE_BUCKET",
    "AutoInstance",
    "Lease",
    "auto_member_name",
    "check_joinable",
    "check_lease_ttl",
    "hand_added_members",
    "join",
    "lease_key",
    "list_leases",
    "open_lease_bucket",
]

LEASE_BUCKET = "pcgroups-leases"
LEASE_STREAM = f"KV_{LEASE_BUCKET}"
MARKER_TTL = 1.0  # how long the server's expiry marker stays (its minimum): keeps the bucket small
MIN_LEASE_TTL = 1.0  # the server's smallest per-message TTL
DEFAULT_LEASE_TTL = 5.0
DEFAULT_DEBOUNCE = 0.4
LEAVE_TIMEOUT = 1.0  # at stop, how long the lease delete and the membership write may take
WATCH_ATTEMPTS = 8  # restarts of a failed watch in a row before the instance gives up


@dataclass(frozen=True)
class LeaseEntry:
    """The lease watch saw a change (None: the end of its current values; RESTARTED: it started again after a
    reconnect, its current values follow)."""

    entry: KeyValue.Entry | Restarted | None


@dataclass(frozen=True)
class ConfigEntry:
    """The config watch saw a change of the group's config."""

    entry: KeyValue.Entry


@dataclass(frozen=True)
class Tick:
    """Nothing happened for a while: a debounced rebalance or the periodic re-check is due."""


@dataclass(frozen=True)
class WatchFailed:
    """The ``which`` watch (``lease`` or ``config``) failed (``error``) or closed (None)."""

    which: str
    error: BaseException | None


@dataclass(frozen=True)
class WatchRetry:
    """Time to try restarting the ``which`` watch again."""

    which: str


@dataclass(frozen=True)
class MemberEnded:
    """The member's instance (``consumer``) ended with ``result``."""

    result: BaseException | None


AutoEvent = Stop | LeaseEntry | ConfigEntry | Tick | WatchFailed | WatchRetry | MemberEnded


def auto_member_name() -> str:
    """A fresh member name for an instance started without one: ``auto-<8 hex>``."""
    return f"auto-{secrets.token_hex(4)}"


def lease_key(stream: str, group: str, member: str, instance: str) -> str:
    return f"{stream}.{group}.{member}.{instance}"


def _ttl_header(ttl: float) -> str:
    return f"{max(int(MIN_LEASE_TTL * 1000), round(ttl * 1000))}ms"


@dataclass
class Lease:
    """A live lease: one running instance of ``member`` (what ``cg elastic status`` shows)."""

    member: str
    instance: str
    expires_in: float  # seconds until it expires unless renewed (the server's clock vs ours)
    ttl: float
    host: str = ""
    pid: int = 0
    revision: int = 0
    pin: str = ""  # the pin id this instance held at its last renewal ("": a standby)


@dataclass
class _Held:
    """A lease seen in the watch."""

    member: str
    instance: str
    ttl: float
    created: datetime | None
    revision: int
    host: str = ""
    pid: int = 0
    pin: str = ""

    def lease(self, now: datetime) -> Lease:
        age = (now - self.created).total_seconds() if self.created is not None else 0.0
        return Lease(
            self.member, self.instance, max(0.0, self.ttl - age), self.ttl, self.host, self.pid, self.revision, self.pin
        )


def _parse_entry(prefix: str, entry: KeyValue.Entry) -> _Held | None:
    """The lease of a watch entry, None for deletes, purges, expiry markers and foreign keys."""
    if entry.operation is not None or not entry.value:
        return None
    rest = entry.key[len(prefix) :] if entry.key.startswith(prefix) else ""
    member, dot, instance = rest.partition(".")
    if not dot or not member or not instance or "." in instance:
        return None
    try:
        value = json.loads(entry.value)
    except ValueError:
        value = {}
    if not isinstance(value, dict):
        value = {}
    try:
        ttl = float(value.get("ttl", 0)) or DEFAULT_LEASE_TTL
    except (TypeError, ValueError):
        ttl = DEFAULT_LEASE_TTL
    pid = value.get("pid")
    return _Held(
        member,
        instance,
        ttl,
        cast("datetime | None", entry.created),  # nats-py declares an int and gives the message's datetime
        entry.revision or 0,
        str(value.get("host", "")),
        pid if type(pid) is int else 0,
        str(value.get("pin") or ""),
    )


# --- the lease bucket ---------------------------------------------------------------------------
async def open_lease_bucket(api: JetStreamApi, *, create: bool = True, replicas: int = 1) -> KeyValue:
    """The lease bucket, created if missing (history 1, per-message TTL, 1 s limit markers)."""
    js = kv_jetstream(api)
    try:
        kv = await bucket_call(api, js.key_value(LEASE_BUCKET), LEASE_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        if not create:
            raise NotFoundError(f"the lease bucket doesn't exist: {LEASE_BUCKET}") from None
        config = KeyValueConfig(
            bucket=LEASE_BUCKET,
            history=1,
            replicas=replicas,
            storage=StorageType.FILE,
            limit_marker_ttl=MARKER_TTL,
            description="pcgroups instance leases",
        )
        try:
            kv = await bucket_call(api, js.create_key_value(config), LEASE_BUCKET)
        except nats.js.errors.BadRequestError:  # a concurrent creator won (or the config differs: checked below)
            kv = await bucket_call(api, js.key_value(LEASE_BUCKET), LEASE_BUCKET)
    info = (await _lease_stream_info(api))["config"]
    if (
        not info.get("allow_msg_ttl")
        or not info.get("subject_delete_marker_ttl")
        or info.get("max_msgs_per_subject") != 1
    ):
        raise ConfigError(
            f"the lease bucket {LEASE_BUCKET} exists without per-message TTLs, limit markers or "
            "history 1: expired leases would not be seen; delete it (it is re-created)"
        )
    return kv


async def _lease_stream_info(api: JetStreamApi) -> dict[str, Any]:
    """The lease bucket's stream info. Just created (by this instance or one joining at the same time), it can
    be "not found" for a moment on another node of a cluster: asked again for up to the API timeout."""
    deadline = time.monotonic() + api.timeout
    while True:
        try:
            return await api.stream_info(LEASE_STREAM)
        except NotFoundError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def list_leases(nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None) -> list[Lease]:
    """The live leases of a group, by member then instance (empty when there is no lease bucket)."""
    validate_name("stream", stream)
    validate_name("group", group)
    api = api if api is not None else JetStreamApi(nc)
    prefix = f"{stream}.{group}."
    try:
        entries = await snapshot(api, LEASE_BUCKET, prefix + ">")
    except NotFoundError:
        return []
    now = datetime.now(UTC)
    held = [h for h in (_parse_entry(prefix, e) for e in entries) if h is not None]
    return sorted((h.lease(now) for h in held), key=lambda x: (x.member, x.instance))


def hand_added_members(cfg: ElasticConfig, leases: list[Lease]) -> list[str]:
    """The members of a group's config that automatic membership would take over from their owner:
    none when automatic membership wrote the config (its ``automatic`` mark: members whose leases
    expired are its own), else every member no live lease backs (added by hand: ``add``, mappings)."""
    if cfg.automatic:
        return []
    live = {lease.member for lease in leases}
    return [m for m in cfg.membership() if m not in live]


async def check_joinable(
    nc: Client, stream: str, group: str, cfg: ElasticConfig, *, api: JetStreamApi | None = None
) -> None:
    """A ConfigError when the group ``cfg`` is managed by hand (:func:`hand_added_members`): joining
    it with automatic membership would drop those members. Reads only, and the leases only when the
    config is not marked and has members (an instance's permissions need not allow the read)."""
    if cfg.automatic or not cfg.membership():
        return
    hand = hand_added_members(cfg, await list_leases(nc, stream, group, api=api))
    if not hand:
        return
    names = " ".join(hand)
    undo = (
        f"delete the mappings first (cg elastic delete-mapping {stream} {group})"
        if cfg.member_mappings
        else f"drop them first (cg elastic drop {stream} {group} {names})"
    )
    raise ConfigError(
        f"elastic consumer group {group} on stream {stream} is managed by hand (members {names}, "
        f"added without automatic membership): joining it with --auto would drop them; {undo}, or "
        "consume as one of them without --auto"
    )


# --- the instance -------------------------------------------------------------------------------
def check_lease_ttl(lease_ttl: float) -> None:
    """A ConfigError unless ``lease_ttl`` is a number of seconds the server takes as a TTL (>= 1 s)."""
    if not isinstance(lease_ttl, (int, float)) or lease_ttl < MIN_LEASE_TTL:
        raise ConfigError(f"the lease TTL must be at least {MIN_LEASE_TTL:g}s, got {lease_ttl!r}")


async def join(consumer: ConsumerInstance, *, user_named: bool, lease_ttl: float) -> AutoInstance:
    """Run ``consumer`` (a started elastic member instance) in automatic membership: its lease, the
    group's membership (see the module docs). ``elastic_consume(..., auto=True)`` is the entry point;
    ``consumer`` is stopped if joining fails.
    """
    check_lease_ttl(lease_ttl)
    api = consumer.api
    try:
        # the work queue's replicas: the group's name need not be a stream (partition streams)
        wq = work_queue_name(consumer.stream_name, consumer.group_name)
        replicas = (await api.stream_info(wq))["config"].get("num_replicas", 1)
        leases = await open_lease_bucket(api, replicas=replicas)
        configs = await open_bucket(api, ELASTIC_BUCKET, kind="elastic")
        inst = AutoInstance(consumer, user_named=user_named, lease_ttl=float(lease_ttl), leases=leases, configs=configs)
        await inst._start()
    except BaseException:
        await consumer.stop()
        raise
    return inst


class AutoInstance(ControlLoop[AutoEvent]):
    """An elastic instance in automatic membership: its lease, the group's membership, its consumer.

    A consume context (:class:`~pcgroups.consume._loop.ConsumeContext`) whose control loop follows the leases
    and the config; ``consumer`` is the underlying :class:`~pcgroups.elastic._instance.ElasticInstance`, whose
    pin, partitions and messages this instance's are.
    """

    def __init__(
        self,
        consumer: ConsumerInstance,
        *,
        user_named: bool,
        lease_ttl: float,
        leases: KeyValue,
        configs: KeyValue,
        debounce: float = DEFAULT_DEBOUNCE,
    ):
        super().__init__()
        self.consumer = consumer
        self.nc, self.api = consumer.nc, consumer.api
        stream, group, member = consumer.stream_name, consumer.group_name, consumer.member_name
        self.stream_name, self.group_name, self.member_name = stream, group, member
        self.user_named = user_named
        self.instance_id = secrets.token_hex(4)
        self.lease_ttl = lease_ttl
        self.debounce = debounce
        self.ack_wait = consumer.template.ack_wait
        self.rebalances = 0  # membership changes this instance wrote
        self._leases_kv = leases
        self._configs_kv = configs
        self._js = kv_jetstream(self.api)  # the lease writes: routed through a domain as the KV's
        self._prefix = f"{stream}.{group}."
        self._key = lease_key(stream, group, member, self.instance_id)
        self._subject = f"{leases._pre}{self._key}"
        self._config_key = group_key(stream, group)
        self._lease_rev = 0
        self._leases: dict[str, _Held] = {}  # the group's live leases, by key (what the watch shows)
        self._leases_ready = False  # the watch's initial snapshot is in
        self._expired: set[str] = set()  # members whose last lease expired (not deleted)
        self._config: ElasticConfig | None = None  # the group's config, as last seen
        self._due: float | None = None  # when to rebalance (debounced)
        self._next_check = 0.0  # when to re-check the membership, in case a write was lost
        self._renew_now = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._watchers: list[Any] = []
        self._consumer_task: asyncio.Task[None] | None = None
        self._consumer_ended = False
        self._lease_dropped = False
        self._watch_failures = 0

    # --- public surface -------------------------------------------------------------------
    @property
    def pinned(self) -> bool:
        """True while this instance holds its member's pin (gets the member's messages)."""
        return not self._done.done() and self.consumer.pinned

    @property
    def consuming(self) -> bool:
        """True while this instance is attached to its member's consumer (pinned or standby)."""
        return not self._done.done() and self.consumer.consuming

    @property
    def partitions(self) -> list[int]:
        """The partitions this instance's member owns under the current config."""
        return self.consumer.partitions

    def pool_status(self) -> dict[str, Any] | None:
        """A dispatching instance's pool (``ConsumerInstance.pool_status``)."""
        return self.consumer.pool_status()

    def dead_letter_status(self) -> dict[str, Any]:
        """Its parked keys and oldest failing message (``ConsumerInstance.dead_letter_status``)."""
        return self.consumer.dead_letter_status()

    @property
    def recovered_errors(self) -> int:
        """How many times its member's consumer went away under it and it joined again
        (:attr:`ConsumerInstance.recovered_errors <pcgroups.consume._instance.ConsumerInstance.recovered_errors>`)."""
        return self.consumer.recovered_errors

    @property
    def live_members(self) -> list[str]:
        """The members with at least one live lease, as this instance sees them."""
        return sorted({h.member for h in self._leases.values()})

    @property
    def settled(self) -> bool:
        """The config holds the membership this instance's view of the leases gives (nothing to write)."""
        cfg = self._config
        return (
            cfg is not None
            and self._leases_ready
            and self._key in self._leases
            and not cfg.members
            and cfg.automatic
            and cfg.member_mappings == sticky_mappings(cfg, self.live_members)
        )

    async def wait_settled(self, timeout: float | None = None) -> None:
        """Wait until the group's config holds the membership of the live leases (including this one)."""

        async def poll() -> None:
            while not self.settled:  # noqa: ASYNC110 - settled is computed from what several watchers change
                await asyncio.sleep(0.02)

        try:
            await self._race(asyncio.wait_for(poll(), timeout))
        except TimeoutError:
            raise TimeoutError(f"{self.member_name}: membership not settled within {timeout}s") from None

    def __aiter__(self) -> AsyncIterator[Msg]:
        """The member's messages, for an instance started with ``handler=None``."""
        return self.consumer.__aiter__()

    def __repr__(self) -> str:
        return (
            f"<AutoInstance {self.stream_name}/{self.group_name} member={self.member_name} "
            f"instance={self.instance_id} partitions={self.partitions}>"
        )

    # --- the control loop -------------------------------------------------------------------
    # stop() leaves: the lease is dropped (the member leaves at once if this was its last instance;
    # its partitions are handed over after in-flight messages finish), then the consumer stops.
    async def _attached(self) -> None:
        """An idle member is never attached (``wait_for_consuming`` times out)."""
        await self.consumer.wait_for_consuming()

    def _label(self) -> str:
        return f"{self.member_name}/{self.instance_id}"

    def _halt(self) -> None:
        if not self.nc.is_connected:
            self._interrupt()  # disconnected: no leave to write (the lease expires), nothing to wait for

    async def _start(self) -> None:
        await self._first_lease()
        try:
            lease_watch = await self._watch("lease")
            self._watchers.append(lease_watch)
            config_watch = await self._watch("config")
            self._watchers.append(config_watch)
        except BaseException:
            await self._drop_lease()
            for w in self._watchers:
                await _quietly(stop_watch(w))
            raise
        label = f"{self.member_name}/{self.instance_id}"
        self._tasks = [
            asyncio.create_task(self._pump(lease_watch, "lease"), name=f"pcg-leases-{label}"),
            asyncio.create_task(self._pump(config_watch, "config"), name=f"pcg-config-{label}"),
            asyncio.create_task(self._renew_loop(), name=f"pcg-renew-{label}"),
        ]
        self._consumer_task = asyncio.create_task(self._watch_consumer(), name=f"pcg-consumer-{label}")
        self._tasks.append(self._consumer_task)
        self._next_check = time.monotonic() + self._resync
        self._launch(f"pcg-auto-{label}")
        log.info(
            "%s/%s: joined %s/%s with lease %s (TTL %gs)",
            self.member_name,
            self.instance_id,
            self.stream_name,
            self.group_name,
            self._key,
            self.lease_ttl,
        )

    async def _pump(self, watcher: Watch, which: str) -> None:
        try:
            async for entry in watcher:
                if which == "lease":
                    self._post(LeaseEntry(entry))
                elif isinstance(entry, KeyValue.Entry):  # not None (the end of the current values) nor RESTARTED
                    self._post(ConfigEntry(entry))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._post(WatchFailed(which, e))
            return
        self._post(WatchFailed(which, None))

    async def _watch_consumer(self) -> None:
        result = await self.consumer.done()
        self._consumer_ended = True
        self._post(MemberEnded(result))

    @property
    def _resync(self) -> float:
        return max(self.lease_ttl, 1.0)

    async def _next_event(self) -> AutoEvent:
        """The next event, or :class:`Tick` when a rebalance or the periodic re-check is due."""
        wake = min(self._due if self._due is not None else self._next_check, self._next_check)
        try:
            return await asyncio.wait_for(self._events.get(), max(0.0, wake - time.monotonic()))
        except TimeoutError:
            return Tick()

    async def _handle(self, event: AutoEvent) -> Outcome:
        match event:
            case LeaseEntry(entry=entry):
                if self._apply_lease(entry):
                    self._due = time.monotonic() + self.debounce
            case ConfigEntry(entry=entry):
                if self._apply_config(entry) and not self.settled:
                    self._due = time.monotonic() + self.debounce
            case Tick():
                await self._tick()
            case WatchFailed(which=which, error=error):
                await self._restart_watch(which, error)
            case WatchRetry(which=which):
                await self._restart_watch(which, None, retry=True)
            case Stop():
                return await self._leave()
            case MemberEnded(result=result):
                log.info("%s/%s: consumer ended (%s)", self.member_name, self.instance_id, result or "normally")
                return result
        return CONTINUE

    async def _tick(self) -> None:
        """Rebalance when due (debounced); every ``_resync`` check the config holds the membership."""
        now = time.monotonic()
        if self._due is not None and now >= self._due:
            self._due = None
            if not await self._rebalance():
                self._due = time.monotonic() + 1.0  # a failed write: try again
        if now >= self._next_check:
            self._next_check = now + self._resync
            if self._due is None and self._leases_ready and not self.settled:
                self._due = now + self.debounce

    def _apply_lease(self, entry: KeyValue.Entry | Restarted | None) -> bool:
        """Update the lease view; True when the membership (the set of live members) may have changed."""
        if entry is None:
            self._leases_ready = True
            return True
        if isinstance(entry, Restarted):  # after a reconnect: the view is rebuilt from the current leases
            self._leases.clear()
            self._leases_ready = False
            return False
        before = self.live_members
        held = _parse_entry(self._prefix, entry)
        if held is None:
            gone = self._leases.pop(entry.key, None)
            if gone is not None and entry.key != self._key:
                if entry.operation == "PURGE":  # expired (the server's marker): the instance is dead or stalled
                    self._expired.add(gone.member)
                else:
                    self._expired.discard(gone.member)
            if entry.key == self._key and not self._stop_requested:
                log.warning(
                    "%s/%s: our lease expired (the process stalled for longer than the lease TTL?); renewing",
                    self.member_name,
                    self.instance_id,
                )
                self._renew_now.set()
            if gone is None:
                return False
        else:
            self._leases[entry.key] = held
            self._expired.discard(held.member)
        return self._leases_ready and self.live_members != before

    def _apply_config(self, entry: KeyValue.Entry) -> bool:
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            self._config = None  # the group was deleted: our consumer ends, and so do we
            return False
        try:
            self._config = parse_elastic_config(entry.value)
        except ConfigError:
            self._config = None  # the consumer ends with the error
            return False
        return True

    async def _restart_watch(self, which: str, error: BaseException | None, *, retry: bool = False) -> None:
        """A watch failed or closed: start it again (the lease view is rebuilt from the new snapshot).
        Retried with a growing delay; after ``WATCH_ATTEMPTS`` failures in a row the instance ends."""
        if not retry:
            log.warning(
                "%s/%s: %s watch %s; restarting it",
                self.member_name,
                self.instance_id,
                which,
                f"failed: {error}" if error else "closed",
            )
            self._watch_failures = 0
        try:
            watcher = await self._watch(which)
            if which == "lease":
                self._leases.clear()
                self._leases_ready = False
        except Exception as e:
            self._watch_failures += 1
            if self._watch_failures >= WATCH_ATTEMPTS:
                raise PCGroupsError(
                    f"the {which} watch of {self.stream_name}/{self.group_name} could not be restarted: {e}"
                ) from e
            delay = min(0.2 * 2**self._watch_failures, 5.0)
            asyncio.get_running_loop().call_later(delay, self._post, WatchRetry(which))
            return
        self._watchers.append(watcher)
        self._tasks.append(asyncio.create_task(self._pump(watcher, which)))

    async def _rebalance(self, live: list[str] | None = None) -> bool:
        """Write the sticky assignment of ``live`` (default: the live leases) with compare-and-set.

        True when done (written, or nothing to write); False when the write failed (retried later).
        """
        if live is None:
            if not self._leases_ready or (self._key not in self._leases and not self._stop_requested):
                return True  # our own lease lapsed: renew it first (the others drop us meanwhile, if need be)
            live = self.live_members
        started = time.time_ns()
        changed: list[tuple[dict[str, list[int]], dict[str, list[int]]]] = []

        async def change(entry: Entry | None) -> bytes | None:
            if entry is None:
                return None  # the group was deleted
            try:
                cfg = parse_elastic_config(entry.value)
            except ConfigError:
                return None  # our consumer ends with that error
            mappings = sticky_mappings(cfg, live)
            if not cfg.members and cfg.automatic and cfg.member_mappings == mappings:
                return None
            new = replace(cfg, members=[], member_mappings=mappings, automatic=True)
            new.validate()
            changed[:] = [(previous_assignment(cfg), _as_dict(mappings))]
            return new.to_json()

        try:
            written = await _cas(self._configs_kv, self._config_key, change)
        except (TimeoutError, PCGroupsError, nats.errors.Error, OSError) as e:
            log.warning("%s/%s: membership not written yet: %s", self.member_name, self.instance_id, e)
            return False
        dead = sorted(m for m in self._expired if m not in live)
        self._expired.clear()
        if written is not None and changed:
            before, after = changed[0]
            self.rebalances += 1
            moved = len(moved_partitions(before, after))
            log.info(
                "%s/%s: membership %s -> %s (%d partitions moved)",
                self.member_name,
                self.instance_id,
                sorted(before),
                sorted(after),
                moved,
            )
            self.consumer.trace.assigned(started, before, after, moved)
            for m in dead:
                if before.get(m):
                    await self._delete_dead_consumer(m)
        return True

    async def _delete_dead_consumer(self, member: str) -> None:
        """Delete the consumer of a member dropped because its leases expired, so the new owners of
        its partitions need not wait for the server to reap it (inactive threshold). Only when nobody
        holds its pin: a pinned client still pulls, and its partitions are released by itself."""
        wq = work_queue_name(self.stream_name, self.group_name)
        try:
            info = await self.api.consumer_info(wq, member)
            if pinned_client_id(info) is not None:
                log.info(
                    "%s/%s: dropped member %s still has a pinned client; its consumer is left to the "
                    "server's inactive threshold",
                    self.member_name,
                    self.instance_id,
                    member,
                )
                return
            await self.api.delete_consumer(wq, member)
            log.info("%s/%s: deleted the consumer of dead member %s", self.member_name, self.instance_id, member)
        except NotFoundError:
            pass
        except PCGroupsError as e:
            log.warning(
                "%s/%s: could not delete the consumer of dead member %s: %s",
                self.member_name,
                self.instance_id,
                member,
                e,
            )

    def _watch(self, which: str) -> Awaitable[Watch]:
        """A watch of the group's leases or of its config (refused permissions raise at once)."""
        if which == "lease":
            return Watch.start(self._leases_kv, self._prefix + ">")
        return Watch.start(self._configs_kv, self._config_key)

    # --- the lease ------------------------------------------------------------------------
    def _lease_value(self) -> bytes:
        """The lease's JSON: who runs it, and the pin it holds now (what ``cg elastic status`` matches)."""
        session = self.consumer.session if self.consumer.pinned else None
        pin = {"pin": session.pin_id} if session is not None and session.pin_id else {}
        return json.dumps(
            {
                "member": self.member_name,
                "instance": self.instance_id,
                "ttl": self.lease_ttl,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                **pin,
            },
            separators=(",", ":"),
        ).encode()

    async def _write_lease(self, *, expected: int) -> None:
        headers = {"Nats-TTL": _ttl_header(self.lease_ttl), "Nats-Expected-Last-Subject-Sequence": str(expected)}
        ack = await kv_call(
            self._leases_kv,
            self._js.publish(self._subject, self._lease_value(), headers=headers, timeout=max(self.lease_ttl / 3, 1.0)),
            self._key,
        )
        self._lease_rev = ack.seq

    async def _first_lease(self) -> None:
        """Write the lease as the instance joins. Right after the lease bucket was created (by this instance or
        another joining at the same time), a client of another node of a cluster finds no responders for a
        moment (its server does not know the new stream's subjects yet): retried for up to the lease TTL. A
        write that timed out may have been stored: the retry takes the key over then (``_renew``)."""
        deadline = time.monotonic() + max(self.lease_ttl, 2.0)
        write: Callable[[], Awaitable[None]] = functools.partial(self._write_lease, expected=0)
        while True:
            try:
                return await write()
            except (nats.js.errors.NoStreamResponseError, nats.errors.TimeoutError) as e:
                if time.monotonic() > deadline:
                    raise
                log.debug("%s/%s: lease not written yet (%s); again", self.member_name, self.instance_id, e)
                write = self._renew
                await asyncio.sleep(0.05)

    async def _renew(self) -> None:
        try:
            await self._write_lease(expected=self._lease_rev)
        except nats.js.errors.APIError as e:
            if e.err_code != ERR_WRONG_LAST_SEQUENCE:
                raise
            # The lease expired (the server's marker is the key's last message now), or vanished:
            # take the key over at whatever is last, and the member joins again if it had left.
            try:
                last = (
                    await kv_call(self._leases_kv, self._js.get_last_msg(LEASE_STREAM, self._subject), self._key)
                ).seq or 0
            except nats.js.errors.NotFoundError:
                last = 0
            await self._write_lease(expected=last)
            log.warning("%s/%s: lease was lost and is taken again", self.member_name, self.instance_id)

    async def _renew_loop(self) -> None:
        interval = self.lease_ttl / 3
        while True:
            try:
                await asyncio.wait_for(self._renew_now.wait(), interval)
            except TimeoutError:
                pass
            self._renew_now.clear()
            try:
                await self._renew()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.log(
                    logging.WARNING if self.nc.is_connected else logging.DEBUG,  # disconnected: said already
                    "%s/%s: lease renewal failed: %s",
                    self.member_name,
                    self.instance_id,
                    e,
                )

    async def _drop_lease(self) -> bool:
        """Delete the lease now: the member leaves at once if this was its last instance. False when the
        server did not take it (disconnected, or no answer within ``LEAVE_TIMEOUT``): it expires."""
        if self._lease_dropped:
            return True
        self._lease_dropped = True
        if not self.nc.is_connected:  # a publish would wait for the server: the lease expires by itself
            log.info(
                "%s/%s: disconnected: the lease is left to expire (in %gs)",
                self.member_name,
                self.instance_id,
                self.lease_ttl,
            )
            return False
        # A delete (not a purge: expiry shows as a purge, so watchers tell a leave from a death) that
        # itself expires, so the bucket keeps nothing of this instance.
        headers = {"KV-Operation": "DEL", "Nats-TTL": _ttl_header(MIN_LEASE_TTL)}
        try:
            await self._js.publish(self._subject, b"", headers=headers, timeout=LEAVE_TIMEOUT)
        except Exception as e:
            log.warning(
                "%s/%s: could not delete the lease (it expires in %gs): %s",
                self.member_name,
                self.instance_id,
                self.lease_ttl,
                e,
            )
            return False
        return True

    # --- leaving --------------------------------------------------------------------------
    async def _leave(self) -> BaseException | None:
        """stop(): drop the lease; as the member's last instance, write the membership without it
        (after the same debounce as everyone, so leaves close together make one rebalance) and hand its
        partitions over (drain, release) before the consumer stops."""
        for t in self._tasks:
            if t.get_name().startswith("pcg-renew-"):
                t.cancel()
        others = [h for k, h in self._leases.items() if k != self._key and h.member == self.member_name]
        if not others:
            self.consumer.leaving()
        dropped = await self._drop_lease()
        if not others and self._leases_ready and not self._consumer_ended and dropped:
            held = bool(self.consumer.partitions) or self.consumer.consuming
            await self._quiet_leases()
            self._leases.pop(self._key, None)
            if await self._leave_written() and held:
                await self._cancel_tasks()
                await self._wait_released()
        await self._cancel_tasks()
        await self.consumer.stop()
        return await self.consumer.done()

    async def _leave_written(self) -> bool:
        """The membership without this member written (bounded by ``LEAVE_TIMEOUT``: the server
        stopped answering, the others drop it once its lease is seen gone)."""
        try:
            return await asyncio.wait_for(self._rebalance(self.live_members), LEAVE_TIMEOUT)
        except TimeoutError:
            log.warning(
                "%s/%s: the membership without this member was not written in time: the other instances write it",
                self.member_name,
                self.instance_id,
            )
            return False

    async def _quiet_leases(self) -> None:
        """Follow the lease watch until our own delete is seen and nothing changed for ``debounce``."""
        limit = time.monotonic() + 3 * self.debounce + 1.0
        quiet_from = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= limit or (self._key not in self._leases and now - quiet_from >= self.debounce):
                return
            wait = min(limit, quiet_from + self.debounce if self._key not in self._leases else limit) - now
            try:
                event = await asyncio.wait_for(self._events.get(), max(0.01, wait))
            except TimeoutError:
                continue
            match event:
                case LeaseEntry(entry=KeyValue.Entry(key=key)) if key == self._key:
                    self._leases.pop(self._key, None)
                    quiet_from = time.monotonic()
                case LeaseEntry(entry=entry):
                    if self._apply_lease(entry):
                        quiet_from = time.monotonic()
                case ConfigEntry(entry=entry):
                    self._apply_config(entry)
                case MemberEnded():
                    self._post(event)
                    return

    async def _wait_released(self) -> None:
        """Until our consumer has seen the new config and let go of its partitions (bounded)."""
        deadline = time.monotonic() + 2 * self.ack_wait + 2.0
        while time.monotonic() < deadline and not self._consumer_ended:
            if not self.consumer.partitions and not self.consumer.consuming:
                return
            await asyncio.sleep(0.01)
        if not self._consumer_ended:
            log.warning("%s/%s: partitions not released in time; stopping anyway", self.member_name, self.instance_id)

    async def _cancel_tasks(self) -> None:
        """Stop renewing and watching (the task that waits for the consumer's end stays)."""
        for t in self._tasks:
            if t is not self._consumer_task:
                t.cancel()
        watchers, self._watchers = self._watchers, []
        for w in watchers:
            await _quietly(stop_watch(w))

    async def _close(self, result: BaseException | None) -> BaseException | None:
        """The end, whatever the cause: nothing of ours is left running, the lease is gone."""
        self._stop_requested = True
        try:
            await self._cancel_tasks()
            await self._drop_lease()
            if not self._consumer_ended:
                await self.consumer.stop()
        finally:
            for t in self._tasks:
                t.cancel()
        return result


async def _cas(
    kv: KeyValue, key: str, change: Callable[[Entry | None], Awaitable[bytes | None]], attempts: int = 20
) -> bytes | None:
    """``store.update`` (compare-and-set), also retrying the conflicts it lets through: nats-py raises
    a conflict as ``KeyWrongLastSequenceError``, which carries no ``err_code``."""
    for attempt in range(attempts):
        try:
            return await update(kv, key, change)
        except nats.js.errors.KeyWrongLastSequenceError:
            await asyncio.sleep(0.005 * (attempt + 1))
    raise PCGroupsError(f"could not update {key}: too many concurrent changes ({attempts} attempts)")


def _as_dict(mappings: list[MemberMapping]) -> dict[str, list[int]]:
    return {m.member: list(m.partitions) for m in mappings}


async def _quietly(aw: Awaitable[Any]) -> None:
    try:
        await asyncio.wait_for(aw, 2.0)
    except Exception:
        pass

"""The config KV buckets: lookup or create (as nats.go makes them), read, compare-and-set, watch.

:class:`Watch` is nats-py's KV watch started again whenever its client reconnects. nats-py's watch is an
ordered push consumer that the server keeps in memory only: a server restart loses it, and nats-py notices
that only after missing two idle heartbeats (10-20 s), so every config change written meanwhile reached the
instances that late. Its invariants:

1. Iterating it gives the watched keys' entries, None at the end of the current values, then the changes,
   as nats-py's watch does.
2. After each reconnect it starts a new nats-py watch (retrying every 0.1-1 s until JetStream answers, while
   connected) and gives :data:`RESTARTED`, then the current values again, None, then the changes: an entry
   may come twice, and a change made while the client was away comes at the latest then.
3. A refused permission, or a failed or closed nats-py watch it did not replace, ends the iteration (the
   error is raised); ``stop()`` ends it quietly.

Buckets are opened through the caller's JetStream (:func:`kv_jetstream`): with a domain or an API prefix
(``$JS.leaf.API``), the KV's writes (create, update, delete, purge; the leases' publishes) go to
``<prefix>.$KV.<bucket>.<key>``, as nats.go writes them, because a leaf node connection between
domains carries the API prefix but not ``$KV.>``. Reads (direct gets), watches and the keys of the
entries keep the bare ``$KV.<bucket>.<key>``: the subjects the bucket stores.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import PubAck
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from ..config import go_json
from ..errors import JetStreamAPIError, NotFoundError, PCGroupsError, PermissionDeniedError
from ._api import (
    ERR_MAXIMUM_CONSUMERS,
    ERR_STREAM_NAME_IN_USE,
    ERR_STREAM_NOT_FOUND,
    ERR_WRONG_LAST_SEQUENCE,
    ConsumerConfig,
    JetStreamApi,
    consumer_limit_error,
    kv_bucket_config,
)
from ._connection import DEFAULT_API_PREFIX, Connection
from ._permissions import kv_subjects

log = logging.getLogger("pcgroups")

STATIC_BUCKET = "static-consumer-groups"
ELASTIC_BUCKET = "elastic-consumer-groups"

CAS_ATTEMPTS = 100
SNAPSHOT_BATCH = 256
WATCH_RETRY = (0.1, 1.0)  # a watch restarted after a reconnect: first and longest wait between attempts
WATCH_INACTIVE = 30.0  # a replaced watch's consumer goes away this long after nobody listens

T = TypeVar("T")


@dataclass
class Entry:
    """A config value and the KV revision it was read at (for compare-and-set)."""

    value: bytes
    revision: int


def group_key(stream: str, group: str) -> str:
    return f"{stream}.{group}"


class KVJetStream(JetStreamContext):
    """nats-py's JetStream context, with the publishes of the KVs opened through it (their writes) sent to
    ``<API prefix>.$KV.<bucket>.<key>`` when the prefix is not ``$JS.API`` (see the module docs)."""

    def __init__(self, nc: Client, prefix: str, timeout: float):
        super().__init__(nc, prefix=prefix, timeout=timeout)
        self.write_prefix = "" if prefix == DEFAULT_API_PREFIX else prefix + "."

    async def publish(self, subject: str, *args: Any, **kwargs: Any) -> PubAck:
        if subject.startswith("$KV."):
            subject = self.write_prefix + subject
        return await super().publish(subject, *args, **kwargs)


def kv_jetstream(api: JetStreamApi) -> KVJetStream:
    """The nats-py JetStream context buckets are opened with: ``api``'s JetStream, KV writes routed."""
    return KVJetStream(api.nc, api.prefix, api.timeout)


async def kv_call(kv: KeyValue, aw: Awaitable[T], key: str = ">") -> T:
    """A nats-py call on ``kv`` (get, create, update, delete, watch) that fails at once with a
    PermissionDeniedError when the user's permissions refuse it (see :mod:`pcgroups.jetstream._permissions`), and names
    the bucket's stream when a watch finds it out of consumers."""
    try:
        return await Connection.of(kv._js._nc).permissions.call(aw, kv_subjects(kv._name, key, kv._js._prefix))
    except nats.js.errors.APIError as e:
        if getattr(e, "err_code", None) == ERR_MAXIMUM_CONSUMERS:  # nats-py's KV errors may lack it
            raise consumer_limit_error(f"KV_{kv._name}") from None
        raise


async def stop_watch(watcher: Any, timeout: float = 1.0) -> None:
    """Stop a KV watch and delete its consumer. nats-py only unsubscribes, and the server keeps the watch's
    (ordered) consumer for its inactive threshold, 5 minutes: every one counts against the bucket stream's
    limit of consumers (a restarted fleet held twice its watches; docs/SCALE.md). Best effort: without a
    connection, or without the permission to delete it, the server removes it in time."""
    sub: Any = getattr(watcher, "_sub", None)
    try:
        await watcher.stop()
    finally:
        stream, consumer = getattr(sub, "_stream", None), getattr(sub, "_consumer", None)
        nc = getattr(sub, "_conn", None)
        if stream and consumer and nc is not None and nc.is_connected:
            subject = f"{sub._js._prefix}.CONSUMER.DELETE.{stream}.{consumer}"
            try:
                await Connection.of(nc).permissions.call(nc.request(subject, b"", timeout=timeout), [subject])
            except Exception as e:
                log.debug("the consumer %s of a watch of %s is left to the server: %s", consumer, stream, e)


def bucket_call(api: JetStreamApi, aw: Awaitable[T], bucket: str) -> Awaitable[T]:
    """:func:`kv_call` for a nats-py call that looks up or creates ``bucket``."""
    return api.permissions.call(aw, kv_subjects(bucket, prefix=api.prefix))


async def open_bucket(api: JetStreamApi, bucket: str, *, kind: str) -> KeyValue:
    """Look up an existing config bucket; a clear NotFoundError when there is none."""
    js = kv_jetstream(api)
    try:
        return await bucket_call(api, js.key_value(bucket), bucket)
    except nats.js.errors.BucketNotFoundError:
        raise NotFoundError(f"the {kind} consumer group KV bucket doesn't exist: {bucket}") from None


async def open_or_create_bucket(api: JetStreamApi, bucket: str, key: str, *, replicas: int) -> KeyValue:
    """Look up the bucket, creating it exactly as nats.go's KV defaults do when it is missing (then
    waiting until it answers a read of ``key``, the key the caller reads next)."""
    js = kv_jetstream(api)
    try:
        return await bucket_call(api, js.key_value(bucket), bucket)
    except nats.js.errors.BucketNotFoundError:
        pass
    try:
        await api.create_stream(kv_bucket_config(bucket, replicas=replicas))
    except JetStreamAPIError as e:
        if e.err_code != ERR_STREAM_NAME_IN_USE:  # a concurrent creator won: use theirs
            raise
    kv = await bucket_call(api, js.key_value(bucket), bucket)
    await _answering(kv, key, api.timeout)
    return kv


async def _answering(kv: KeyValue, key: str, timeout: float) -> None:
    """Wait (up to ``timeout``) until a bucket just created answers a get; "not found" is an answer.

    In a cluster the create request is answered once the new stream has a leader, but for a moment a get
    or a write from a client of another server can still find no responders (that server does not know
    the leader's subscriptions yet). Seen in the cluster tests: the first read of create_static and of
    create_elastic, right after they created the bucket, failed with "no responders" in 2 of ~90 runs.
    """
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await kv_call(kv, kv.get(key), key)  # the caller's key: one its permissions allow
            return
        except nats.js.errors.KeyNotFoundError:
            return
        except nats.errors.NoRespondersError:
            if asyncio.get_running_loop().time() > deadline:
                return  # the caller's own request reports it
            log.debug("bucket %s does not answer yet", kv._name)
            await asyncio.sleep(0.01)


async def read(kv: KeyValue, key: str) -> Entry | None:
    """The current value, or None when the key is absent, deleted, purged or TTL-expired."""
    try:
        entry = await kv_call(kv, kv.get(key), key)
    except nats.js.errors.KeyNotFoundError:
        return None
    if entry.operation in ("DEL", "PURGE") or entry.value is None:
        return None
    return Entry(entry.value or b"", entry.revision or 0)


async def update(
    kv: KeyValue, key: str, change: Callable[[Entry | None], Awaitable[bytes | None]], *, attempts: int = CAS_ATTEMPTS
) -> bytes | None:
    """Read-modify-write with compare-and-set, retrying on conflicts.

    ``change`` gets the current entry (None if absent) and returns the new value, or None to write
    nothing. Returns what was written (or None).
    """
    for attempt in range(attempts):
        current = await read(kv, key)
        value = await change(current)
        if value is None:
            return None
        try:
            if current is None:
                await kv_call(kv, kv.create(key, value), key)
            else:
                await kv_call(kv, kv.update(key, value, last=current.revision), key)
            return value
        except nats.js.errors.BadRequestError as e:
            if not isinstance(e, nats.js.errors.KeyWrongLastSequenceError) and e.err_code != ERR_WRONG_LAST_SEQUENCE:
                raise
            log.debug("compare-and-set conflict on %s (attempt %d), retrying", key, attempt + 1)
            await asyncio.sleep(random.uniform(0, min(0.002 * (attempt + 1), 0.05)))  # jitter: writers spread out
    raise PCGroupsError(f"could not update {key}: too many concurrent changes ({attempts} attempts)")


async def snapshot(api: JetStreamApi, bucket: str, pattern: str = ">", *, timeout: float = 5.0) -> list[KeyValue.Entry]:
    """The current entries of the keys of ``bucket`` matching ``pattern``; deletes, purges and expiry markers
    left out.

    Not ``kv.keys()`` or a watch: nats-py ends their initial read when consumer info reports nothing pending,
    and that reply can overtake the messages, so under load they return an empty or partial list. Here an
    ephemeral pull consumer (last per subject, no acks) is drained with ``no_wait`` pulls: the server says
    when nothing is left.
    """
    stream, prefix = f"KV_{bucket}", f"$KV.{bucket}."
    name = f"pcg_snap_{uuid.uuid4().hex[:16]}"
    config = ConsumerConfig(
        name=name,
        deliver_policy="last_per_subject",
        ack_policy="none",
        filter_subject=prefix + pattern,
        inactive_threshold=max(timeout, 5.0),
        num_replicas=1,
        mem_storage=True,
    )
    try:
        await api.create_consumer(stream, config)
    except JetStreamAPIError as e:
        if e.err_code == ERR_STREAM_NOT_FOUND:
            raise NotFoundError(f"KV bucket {bucket} not found") from None
        raise
    except PermissionDeniedError as e:  # named as the permission to give (docs/SECURITY.md), the same every time
        raise PermissionDeniedError(
            str(e).replace(name, "*"), operation=e.operation, subject=e.subject.replace(name, "*")
        ) from None
    inbox = api.nc.new_inbox()
    sub = await api.nc.subscribe(inbox)
    pull = f"{api.prefix}.CONSUMER.MSG.NEXT.{stream}.{name}"
    try:
        return await api.permissions.call(_drain(api, sub, pull, bucket, timeout), [pull.replace(name, "*")])
    finally:
        await sub.unsubscribe()
        try:
            await api.delete_consumer(stream, name)
        except Exception:
            pass


async def _drain(api: JetStreamApi, sub: Any, pull: str, bucket: str, timeout: float) -> list[KeyValue.Entry]:
    """The snapshot consumer's messages, pulled with ``no_wait`` until the server says nothing is left."""
    prefix = f"$KV.{bucket}."
    out: list[KeyValue.Entry] = []
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        await api.nc.publish(pull, go_json({"batch": SNAPSHOT_BATCH, "no_wait": True}), reply=sub.subject)
        got = 0
        while got < SNAPSHOT_BATCH:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise PCGroupsError(f"reading KV bucket {bucket} timed out after {timeout:g}s")
            try:
                msg = await sub.next_msg(timeout=left)
            except nats.errors.TimeoutError:
                continue
            headers = msg.headers or {}
            if "Status" in headers:  # 404 no messages / 408: nothing left
                return out
            got += 1
            op = headers.get("KV-Operation")
            if op in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers:
                continue
            meta = msg.metadata
            out.append(
                KeyValue.Entry(
                    bucket=bucket,
                    key=msg.subject[len(prefix) :],
                    value=msg.data,
                    revision=meta.sequence.stream,
                    delta=meta.num_pending,
                    created=meta.timestamp,
                    operation=None,
                )
            )


async def keys_of_stream(api: JetStreamApi, bucket: str, stream: str) -> list[str]:
    """Group names with a config for ``stream`` (the second part of ``<stream>.<group>`` keys)."""
    return [e.key.split(".", 1)[1] for e in await snapshot(api, bucket, f"{stream}.*")]


async def flavour_hint(api: JetStreamApi, kind: str, stream: str, group: str) -> str:
    """For a group of ``kind`` that was not found: " (<group> is an elastic consumer group)" when the other kind
    has it (a command of the wrong flavour), else ""."""
    other, bucket = ("elastic", ELASTIC_BUCKET) if kind == "static" else ("static", STATIC_BUCKET)
    try:
        entry = await read(await open_bucket(api, bucket, kind=other), group_key(stream, group))
    except Exception:
        return ""
    return f" ({group} is {'an' if other == 'elastic' else 'a'} {other} consumer group)" if entry else ""


async def group_entry(
    api: JetStreamApi, bucket: str, kind: str, stream: str, group: str, not_found: str | None = None
) -> tuple[KeyValue, Entry]:
    """The group's bucket and current entry; NotFoundError (with a wrong-flavour hint) when there is none."""
    try:
        kv = await open_bucket(api, bucket, kind=kind)
        entry = await read(kv, group_key(stream, group))
    except NotFoundError:
        entry = None
    if entry is None:
        message = not_found or f"{kind} consumer group {group} on stream {stream} not found"
        raise NotFoundError(message + await flavour_hint(api, kind, stream, group))
    return kv, entry


class Restarted:
    """What a :class:`Watch` gives before the current values of a watch started again after a reconnect."""

    def __repr__(self) -> str:
        return "RESTARTED"


RESTARTED = Restarted()


class _Ended:
    def __init__(self, error: BaseException | None):
        self.error = error


class Watch:
    """A watch of ``keys`` in ``kv`` that starts again after each reconnect (see the module docs)."""

    def __init__(self, kv: KeyValue, keys: str):
        self._kv, self._keys = kv, keys
        self._nc = kv._js._nc
        self._items: asyncio.Queue[Any] = asyncio.Queue()
        self._watcher: KeyValue.KeyWatcher | None = None
        self._pump: asyncio.Task[None] | None = None
        self._restart: asyncio.Task[None] | None = None
        self._unlisten: Callable[[], None] = lambda: None
        self._stopped = False

    @classmethod
    async def start(cls, kv: KeyValue, keys: str) -> Watch:
        """The watch, once its consumer exists (a refused permission raises at once)."""
        watch = cls(kv, keys)
        watch._follow(await watch._open())
        watch._unlisten = Connection.of(watch._nc).watch.listen(watch._on_connection)
        return watch

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> KeyValue.Entry | Restarted | None:
        item = await self._items.get()
        if isinstance(item, _Ended):
            self._items.put_nowait(item)  # every later call ends too
            if item.error is not None:
                raise item.error
            raise StopAsyncIteration
        entry: KeyValue.Entry | Restarted | None = item
        return entry

    async def stop(self) -> None:
        """Stop watching (idempotent); the iteration ends."""
        self._stopped = True
        self._unlisten()
        for task in (self._restart, self._pump):
            if task is not None:
                task.cancel()
        watcher, self._watcher = self._watcher, None
        await _stop_quietly(watcher)
        self._items.put_nowait(_Ended(None))

    def _open(self) -> Awaitable[KeyValue.KeyWatcher]:
        return kv_call(self._kv, self._kv.watch(self._keys, inactive_threshold=WATCH_INACTIVE), self._keys)

    def _follow(self, watcher: KeyValue.KeyWatcher) -> None:
        self._watcher = watcher
        self._pump = asyncio.create_task(self._forward(watcher), name=f"pcg-kv-watch-{self._keys}")

    async def _forward(self, watcher: KeyValue.KeyWatcher) -> None:
        try:
            async for entry in watcher:
                self._items.put_nowait(entry)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._end(e)
            return
        if watcher is self._watcher and not self._stopped:
            self._end(PCGroupsError(f"the KV watch of {self._keys} was closed"))

    def _end(self, error: BaseException) -> None:
        """The iteration ends with ``error`` (invariant 3): no more restarts."""
        self._stopped = True
        self._unlisten()
        self._items.put_nowait(_Ended(error))

    def _on_connection(self, kind: str, _url: str) -> None:
        if kind == "reconnected" and not self._stopped and (self._restart is None or self._restart.done()):
            self._restart = asyncio.create_task(self._start_again(), name=f"pcg-kv-rewatch-{self._keys}")

    async def _start_again(self) -> None:
        """Replace the nats-py watch with a new one (invariant 2)."""
        old, self._watcher = self._watcher, None
        if self._pump is not None:
            self._pump.cancel()
        await _stop_quietly(old)
        delay = WATCH_RETRY[0]
        while True:
            try:
                watcher = await self._open()
                break
            except PermissionDeniedError as e:
                self._end(e)
                return
            except Exception as e:
                if not self._nc.is_connected:
                    return  # the next reconnect starts it
                log.debug("KV watch of %s not started again yet: %s", self._keys, e)
                await asyncio.sleep(delay)
                delay = min(2 * delay, WATCH_RETRY[1])
        if self._stopped:
            await _stop_quietly(watcher)
            return
        self._items.put_nowait(RESTARTED)
        self._follow(watcher)


async def _stop_quietly(watcher: KeyValue.KeyWatcher | None) -> None:
    """Stop a nats-py KeyWatcher (its subscription and heartbeat tasks) and delete its consumer
    (:func:`stop_watch`); disconnected or closed: never mind."""
    if watcher is None:
        return
    try:
        await stop_watch(watcher)
    except Exception as e:
        log.debug("stopping a KV watch: %s", e)

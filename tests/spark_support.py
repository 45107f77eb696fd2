"""Helpers for the Spark tests: partitioned streams on the real test server, plain nats-py reads."""

from __future__ import annotations

import asyncio
import json

import nats
from nats.js.api import StreamConfig, SubjectTransform


def fnv1a32(b: bytes) -> int:
    h = 0x811C9DC5
    for x in b:
        h = ((h ^ x) * 0x01000193) & 0xFFFFFFFF
    return h


def partition_of(key: str, n: int) -> int:
    """The partition the server's ``{{partition(n,1)}}`` transform gives a one-token key."""
    return fnv1a32(key.encode()) % n


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def make_stream(url: str, name: str, prefix: str, partitions: int, *, allow_direct: bool = True,
                      tokens: int = 1, **cfg) -> None:
    """Stream ``name`` on ``<prefix>.*`` stored as ``<p>.<prefix>.<key>`` (tokens=1), or on
    ``<prefix>.*.*`` stored as ``<p>.<prefix>.<kind>.<key>``, partitioned by the key (tokens=2)."""
    nc = await nats.connect(url)
    try:
        if tokens == 1:
            subjects, src = [f"{prefix}.*"], f"{prefix}.*"
            dest = f"{{{{partition({partitions},1)}}}}.{prefix}.{{{{wildcard(1)}}}}"
        else:
            subjects, src = [f"{prefix}.*.*"], f"{prefix}.*.*"
            dest = f"{{{{partition({partitions},2)}}}}.{prefix}.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}"
        await nc.jetstream().add_stream(StreamConfig(
            name=name, subjects=subjects, allow_direct=allow_direct,
            subject_transform=SubjectTransform(src=src, dest=dest), **cfg))
    finally:
        await nc.close()


async def make_plain_stream(url: str, name: str, subjects: list[str], **cfg) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(StreamConfig(name=name, subjects=subjects, **cfg))
    finally:
        await nc.close()


async def publish(url: str, items: list[tuple[str, bytes]], headers: bool = True) -> list[int]:
    """Publish ``(subject, data)`` pairs with acks (async window); returns their stream sequences."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(publish_async_max_pending=5000)
        futs = []
        for i, (subject, data) in enumerate(items):
            futs.append(await js.publish_async(subject, data, headers={"i": str(i)} if headers else None))
        acks = await asyncio.wait_for(asyncio.gather(*futs), 60)
        return [a.seq for a in acks]
    finally:
        await nc.close()


async def stream_state(url: str, name: str) -> dict:
    nc = await nats.connect(url)
    try:
        msg = await nc.request(f"$JS.API.STREAM.INFO.{name}", b"", timeout=5)
        return json.loads(msg.data)["state"]
    finally:
        await nc.close()


async def read_stream(url: str, name: str, filter_subject: str = ">") -> list[tuple[int, str, bytes, dict]]:
    """Every stored message ``(seq, subject, data, headers)`` in stream order, with plain nats-py."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(name)
        total = info.state.messages
        out = []
        if total == 0:
            return out
        sub = await js.pull_subscribe(filter_subject, stream=name,
                                      config=nats.js.api.ConsumerConfig(ack_policy="none", mem_storage=True,
                                                                        inactive_threshold=10))
        while True:
            try:
                msgs = await sub.fetch(500, timeout=1)
            except nats.errors.TimeoutError:
                break
            for m in msgs:
                out.append((m.metadata.sequence.stream, m.subject, m.data, dict(m.headers or {})))
            if msgs and msgs[-1].metadata.num_pending == 0:
                break
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()


async def put_kv_json(url: str, bucket: str, key: str, value: dict) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        try:
            kv = await js.key_value(bucket)
        except Exception:
            kv = await js.create_key_value(bucket=bucket)
        await kv.put(key, json.dumps(value, separators=(",", ":")).encode())
    finally:
        await nc.close()


async def consumer_names(url: str, stream: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        msg = await nc.request(f"$JS.API.CONSUMER.NAMES.{stream}", b"{}", timeout=5)
        return json.loads(msg.data).get("consumers") or []
    finally:
        await nc.close()

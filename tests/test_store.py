"""store.snapshot: the one-shot read of a KV bucket that `cg ls`, status and the lease view rely on."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.api import KeyValueConfig

from pcgroups import store
from pcgroups.errors import NotFoundError
from pcgroups.jsapi import JetStreamApi


async def test_snapshot_reads_every_live_key(nc, js, uniq):
    """Over several pull batches: the latest value of every key, deletes and purges left out, the pattern
    applied; the same answer every time, also while other clients write (nats-py's kv.keys() could return
    an empty list when its consumer info overtook the messages)."""
    bucket = f"snap{uniq}"
    kv = await js.create_key_value(KeyValueConfig(bucket=bucket, history=5))
    n = store.SNAPSHOT_BATCH + 44
    for i in range(n):
        await kv.put(f"s.g{i}", b"v1")
    for i in range(0, n, 10):
        await kv.put(f"s.g{i}", b"v2")
    await kv.delete("s.g1")
    await kv.purge("s.g2")
    await kv.put("other.g", b"x")
    await kv.put("s.g.deep", b"x")
    want = {f"s.g{i}": (b"v2" if i % 10 == 0 else b"v1") for i in range(n) if i not in (1, 2)}
    api = JetStreamApi(nc)

    stop = asyncio.Event()

    async def noise():
        i = 0
        while not stop.is_set():
            await kv.put(f"noise.k{i % 50}", b"n")
            i += 1

    writer = asyncio.create_task(noise())
    try:
        for _ in range(20):
            got = await store.snapshot(api, bucket, "s.*")
            assert {e.key: e.value for e in got} == want
            assert all(e.operation is None and e.revision for e in got)
            assert sorted(await store.keys_of_stream(api, bucket, "s")) == sorted(k[2:] for k in want)
    finally:
        stop.set()
        await writer
    # the consumers are gone afterwards
    assert [c.name for c in await js.consumers_info(f"KV_{bucket}")] == []
    assert await store.snapshot(api, bucket, "nothing.*") == []


async def test_snapshot_of_a_missing_bucket(nc, uniq):
    with pytest.raises(NotFoundError, match=f"nobucket{uniq}"):
        await store.snapshot(JetStreamApi(nc), f"nobucket{uniq}")

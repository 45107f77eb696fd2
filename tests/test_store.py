"""store.snapshot: the one-shot read of a KV bucket that `cg ls`, status and the lease view rely on."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.api import KeyValueConfig

from pcgroups.errors import NotFoundError
from pcgroups.jetstream import _store as store
from pcgroups.jetstream._api import JetStreamApi


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


async def test_a_stream_out_of_consumers_is_named_with_what_to_raise(fresh_server):
    """nats-server (2.15 on) refuses a stream's consumer past its limit (1000 unless set). Every running instance
    watches its group's config: a config bucket at its limit refuses the next instance's watch, and an origin
    stream at its limit the next member's consumer. Both say which stream and what to raise, in the library and
    as cg's one error line (docs/SCALE.md, *Limits*)."""
    import json

    import nats

    from pcgroups import create_static, static_consume
    from pcgroups.errors import JetStreamAPIError
    from pcgroups.jetstream._api import ERR_MAXIMUM_CONSUMERS
    from tests.helpers.cli import acg, assert_cli_error

    nc = await nats.connect(fresh_server.url)
    api = JetStreamApi(nc)
    try:
        await nc.jetstream().add_stream(
            name="O", subjects=["o.*"], subject_transform={"src": "o.*", "dest": "{{partition(2,1)}}.o.{{wildcard(1)}}"}
        )
        await create_static(nc, "O", "g", 2, members=["m1", "m2"])

        async def limit(stream: str, n: int) -> None:
            cfg = (await api.stream_info(stream))["config"]
            await api.request(f"STREAM.UPDATE.{stream}", json.dumps(dict(cfg, max_consumers=n)).encode())

        await limit("KV_static-consumer-groups", 1)
        first = await static_consume(nc, "O", "g", "m1", lambda msg: None)  # its watch takes the one consumer
        try:
            with pytest.raises(JetStreamAPIError, match="stream KV_static-consumer-groups has as many consumers") as e:
                await static_consume(nc, "O", "g", "m2", lambda msg: None)
            assert e.value.err_code == ERR_MAXIMUM_CONSUMERS and "default_max_consumers" in str(e.value)
            assert_cli_error(
                await acg("static", "consume", "O", "g", "m2", url=fresh_server.url),
                "cg: error: stream KV_static-consumer-groups has as many consumers as it may have",
            )
            await limit("KV_static-consumer-groups", 10)
            await limit("O", 1)  # m1's consumer takes the one of O
            with pytest.raises(JetStreamAPIError, match="stream O has as many consumers as it may have"):
                await static_consume(nc, "O", "g", "m2", lambda msg: None)
        finally:
            await first.stop()
    finally:
        await nc.close()


async def test_a_stopped_instance_leaves_no_watch_consumer(nc, uniq):
    """nats-py stops a KV watch by unsubscribing only: its consumer stayed on the bucket's stream for the server's
    inactive threshold (5 minutes), and every one counts against the stream's consumer limit (a restarted fleet
    held twice its consumers). Stopping an instance deletes its watches' consumers."""
    from nats.js.api import StreamConfig, SubjectTransform

    from pcgroups import PartitioningFilter, create_elastic, create_static, elastic_consume, static_consume

    api = JetStreamApi(nc)
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(
            name=uniq,
            subjects=[f"{uniq}.*"],
            subject_transform=SubjectTransform(
                src=f"{uniq}.*", dest=f"{{{{partition(2,1)}}}}.{uniq}.{{{{wildcard(1)}}}}"
            ),
        )
    )
    await create_static(nc, uniq, "g", 2, members=["m1"])
    await js.add_stream(StreamConfig(name=f"{uniq}e", subjects=[f"{uniq}e.*"]))
    await create_elastic(nc, f"{uniq}e", "g", 2, partitioning_filters=[PartitioningFilter(f"{uniq}e.*", [1])])

    async def watches() -> int:
        """The consumers on the buckets' streams that filter this test's keys."""
        n = 0
        for stream in ("KV_static-consumer-groups", "KV_elastic-consumer-groups", "KV_pcgroups-leases"):
            try:
                infos = await api.list_consumers(stream)
            except NotFoundError:
                continue
            n += sum(1 for c in infos if uniq in str((c.get("config") or {}).get("filter_subject", "")))
        return n

    for start in (
        lambda: static_consume(nc, uniq, "g", "m1", lambda m: None),
        lambda: elastic_consume(nc, f"{uniq}e", "g", "", lambda m: None, auto=True),
    ):
        inst = await start()
        assert await watches() >= 1
        await inst.stop()
        assert await inst.done() is None
        deadline = asyncio.get_running_loop().time() + 5
        while await watches() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        assert await watches() == 0, inst

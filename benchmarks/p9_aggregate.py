"""P9: an aggregate group (two streams) vs a one-stream group on the same data.

The same messages (``N`` in all, keys ``k0..k999`` twice) are stored once in one stream ``P9ONE``
(``P9ONE.a.*``) and once split over two streams ``P9A`` (``P9A.a.*``) and ``P9B`` (``P9B.b.*``), half
each. Then an elastic group of 8 partitions and 4 members is created over each (one filter; the
aggregate one with a filter per stream and ``sources=[P9B]``), and the time from the create to the last message acked is taken: sourcing the
backlog into the work queue plus 4 in-process member instances working it off (max_ack_pending 100,
no work), two rounds alternated, the best of each. Reported: both throughputs (messages per second end
to end) and their ratio, with the sourcing part on its own. Informational: the aggregate group sources
faster (a source per stream, in parallel) and consumes slower, because each member's consumer has a
filter subject per partition *and stream* (the reference's layout), and nats-server delivers more
slowly to a consumer with more filter subjects (measured with nats-py alone: 4 filter subjects 0.67 of
the rate of 2).
"""

from __future__ import annotations

import asyncio
import time

from nats.js.api import StreamConfig

from pcgroups import ConsumerConfig, PartitioningFilter, add_members, create_elastic, elastic_consume, work_queue_name

from .common import Result, Row, Size, connect, publish_all, ratio, server_and_connection

PARTITIONS = 8
MEMBERS = ["m1", "m2", "m3", "m4"]
ROUNDS = 2


async def _drain(
    url: str, js, stream: str, group: str, n: int, filters: list[PartitioningFilter], sources: list[str]
) -> tuple[float, float]:
    """(seconds from create to every message acked, seconds until the work queue held every message)."""
    done = 0
    finished = asyncio.Event()

    async def handle(msg) -> None:
        nonlocal done
        await msg.ack()
        done += 1
        if done >= n:
            finished.set()

    conns = [await connect(url) for _ in MEMBERS]
    t0 = time.perf_counter()
    await create_elastic(
        conns[0],
        stream,
        group,
        PARTITIONS,
        partitioning_filters=filters,
        sources=sources or None,
        max_buffered_msgs=-1,
        max_buffered_bytes=-1,
    )
    await add_members(conns[0], stream, group, MEMBERS)
    insts = [
        await elastic_consume(c, stream, group, m, handle, config=ConsumerConfig(max_ack_pending=100, ack_wait=5))
        for c, m in zip(conns, MEMBERS, strict=False)
    ]
    sourced = None
    try:
        while not finished.is_set():
            if sourced is None and (await js.stream_info(work_queue_name(stream, group))).state.last_seq >= n:
                sourced = time.perf_counter() - t0
            if time.perf_counter() - t0 > 300:
                raise TimeoutError(f"{stream}: {done} of {n} messages acked after 300 s")
            await asyncio.sleep(0.01)
        total = time.perf_counter() - t0
    finally:
        for inst in insts:
            await inst.stop()
        for c in conns:
            await c.close()
    return total, sourced if sourced is not None else total


async def run(size: Size) -> Result:
    res = Result("P9", "an aggregate group (two streams) vs a one-stream group on the same data")
    n = size.p5_messages
    async with server_and_connection() as (server, nc):
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="P9ONE", subjects=["P9ONE.a.*"]))
        await js.add_stream(StreamConfig(name="P9A", subjects=["P9A.a.*"]))
        await js.add_stream(StreamConfig(name="P9B", subjects=["P9B.b.*"]))
        half = n // 2
        await publish_all(nc, [f"P9ONE.a.k{(i // 2) % 1000}" for i in range(2 * half)])
        await publish_all(nc, [f"P9A.a.k{i % 1000}" for i in range(half)])
        await publish_all(nc, [f"P9B.b.k{i % 1000}" for i in range(half)])
        one, agg = [], []
        for rnd in range(ROUNDS):  # alternated, best of each: the first group on a server pays for warming up
            one.append(
                await _drain(server.url, js, "P9ONE", f"g{rnd}", 2 * half, [PartitioningFilter("P9ONE.a.*", [1])], [])
            )
            agg.append(
                await _drain(
                    server.url,
                    js,
                    "P9A",
                    f"g{rnd}",
                    2 * half,
                    [PartitioningFilter("P9A.a.*", [1]), PartitioningFilter("P9B.b.*", [1])],
                    ["P9B"],
                )
            )
        (one_s, one_src), (agg_s, agg_src) = min(one), min(agg)
    one_rate, agg_rate = 2 * half / one_s, 2 * half / agg_s
    r = ratio(agg_rate, one_rate)
    res.rows.append(
        Row(
            f"aggregate group, 2 streams ({2 * half:,} msgs, 8 partitions, 4 members): create to all acked",
            agg_rate,
            "msg/s",
            one_rate,
            "one-stream group, same messages",
            r,
            "info",
            None,
        )
    )
    res.rows.append(
        Row(
            "  of which sourcing the backlog into the work queue",
            2 * half / agg_src,
            "msg/s",
            2 * half / one_src,
            "one-stream group",
            ratio(2 * half / agg_src, 2 * half / one_src),
        )
    )
    res.details = {
        "messages": 2 * half,
        "one_stream_s": one_s,
        "one_stream_sourced_s": one_src,
        "aggregate_s": agg_s,
        "aggregate_sourced_s": agg_src,
        "rounds": {"one": one, "aggregate": agg},
    }
    return res

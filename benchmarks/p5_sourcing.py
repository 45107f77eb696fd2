"""P5: elastic sourcing and memory.

- sourcing: messages published as fast as acked publishes go (pipelined) to an origin stream with an
  elastic group (8 partitions, one partitioning wildcard); the rate at which they arrive in the
  work-queue stream ``<stream>-<group>`` vs the origin's publish rate, and how far the work queue
  lags when publishing ends.
- memory: RSS of an elastic member instance in a process of its own (``benchmarks.worker``), idle
  (consuming, nothing to do) and under load (working off a backlog with max_ack_pending 1000), vs a
  process that only holds a nats-py connection."""

from __future__ import annotations

import asyncio
import time

from nats.js.api import StreamConfig

from pcgroups import PartitioningFilter, add_members, create_elastic, work_queue_name

from .common import Result, Row, Size, publish_all, ratio, rss_mb, server_and_connection, wait_until
from .procs import spawn, stop_all

PARTITIONS = 8


async def wq_last_seq(js, stream: str) -> int:
    return (await js.stream_info(stream)).state.last_seq


async def sourcing(nc, js, n: int) -> dict:
    stream = "P5"
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.k.*"]))
    await create_elastic(
        nc,
        stream,
        "g",
        PARTITIONS,
        partitioning_filters=[PartitioningFilter(f"{stream}.k.*", [1])],
        max_buffered_msgs=-1,
        max_buffered_bytes=-1,
    )
    wq = work_queue_name(stream, "g")
    t0 = time.perf_counter()
    pub_s = await publish_all(nc, [f"{stream}.k.k{i % 1000}" for i in range(n)])
    at_pub_end = await wq_last_seq(js, wq)
    while True:
        seq = await wq_last_seq(js, wq)
        if seq >= n:
            break
        if time.perf_counter() - t0 > 120:
            raise TimeoutError(f"sourcing stalled at {seq} of {n}")
        await asyncio.sleep(0.01)
    src_s = time.perf_counter() - t0
    # catch-up: a second group created over the now full origin sources the backlog as fast as it can
    t1 = time.perf_counter()
    await create_elastic(
        nc,
        stream,
        "g2",
        PARTITIONS,
        partitioning_filters=[PartitioningFilter(f"{stream}.k.*", [1])],
        max_buffered_msgs=-1,
        max_buffered_bytes=-1,
    )
    wq2 = work_queue_name(stream, "g2")
    while await wq_last_seq(js, wq2) < n:
        if time.perf_counter() - t1 > 120:
            raise TimeoutError("catch-up sourcing stalled")
        await asyncio.sleep(0.01)
    catch_up_s = time.perf_counter() - t1
    return {
        "catch_up_s": catch_up_s,
        "catch_up_rate": n / catch_up_s,
        "messages": n,
        "publish_s": pub_s,
        "sourced_s": src_s,
        "publish_rate": n / pub_s,
        "sourcing_rate": n / src_s,
        "in_work_queue_at_publish_end": at_pub_end,
        "lag_after_publish_s": src_s - pub_s,
    }


async def memory(url: str, nc, js, n: int) -> dict:
    stream = "P5M"
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.k.*"]))
    await create_elastic(
        nc,
        stream,
        "g",
        PARTITIONS,
        partitioning_filters=[PartitioningFilter(f"{stream}.k.*", [1])],
        max_buffered_msgs=-1,
        max_buffered_bytes=-1,
    )
    await add_members(nc, stream, "g", ["m1"])
    workers = []
    try:
        bare = await spawn(url, "bare", stream, "g", "m1", name="bare")
        inst = await spawn(
            url, "elastic", stream, "g", "m1", name="m1", ack_wait=5, max_ack_pending=1000, report="count"
        )
        workers = [bare, inst]
        await asyncio.wait_for(asyncio.gather(bare.ready.wait(), inst.ready.wait()), 30)
        await asyncio.sleep(1.5)  # a few pulls, heartbeats and KV watch traffic
        idle_bare, idle = rss_mb(bare.pid), rss_mb(inst.pid)
        peak = idle
        done = asyncio.Event()

        async def sample():
            nonlocal peak
            while not done.is_set():
                r = rss_mb(inst.pid)
                if r is not None:
                    peak = max(peak, r)
                await asyncio.sleep(0.05)

        sampler = asyncio.create_task(sample())
        t0 = time.perf_counter()
        try:
            await publish_all(nc, [f"{stream}.k.k{i % 1000}" for i in range(n)])
            await wait_until(lambda: inst.count >= n, 120, f"the instance to work off {n} messages", step=0.05)
        finally:
            done.set()
            await sampler
        consume_s = time.perf_counter() - t0
    finally:
        await stop_all(workers)
    return {
        "bare_nats_py_rss_mib": idle_bare,
        "instance_idle_rss_mib": idle,
        "instance_load_peak_rss_mib": peak,
        "load_messages": n,
        "load_end_to_end_msgs_per_s": n / consume_s,
    }


async def run(size: Size) -> Result:
    res = Result("P5", "elastic sourcing throughput vs publish rate; memory per instance")
    async with server_and_connection() as (server, nc):
        js = nc.jetstream()
        src = await sourcing(nc, js, size.p5_messages)
        mem = await memory(server.url, nc, js, size.p5_load_messages)
    r = ratio(src["sourcing_rate"], src["publish_rate"])
    res.rows.append(
        Row(
            f"sourcing into the work queue ({src['messages']:,} msgs, 8 partitions)",
            src["sourcing_rate"],
            "msg/s",
            src["publish_rate"],
            "origin publish rate (acked, pipelined)",
            r,
            "info (>= 0.9 keeps pace)",
            None,
        )
    )
    r = ratio(src["catch_up_rate"], src["publish_rate"])
    res.rows.append(
        Row(
            "catch-up: a new group sourcing the full origin (backlog)",
            src["catch_up_rate"],
            "msg/s",
            src["publish_rate"],
            "origin publish rate (acked, pipelined)",
            r,
        )
    )
    res.rows.append(
        Row(
            "work queue lag when publishing ended",
            src["lag_after_publish_s"],
            "s",
            src["publish_s"],
            "publishing time",
            ratio(src["lag_after_publish_s"], src["publish_s"]),
        )
    )
    res.rows.append(
        Row(
            "RSS of an idle elastic member instance",
            mem["instance_idle_rss_mib"],
            "MiB",
            mem["bare_nats_py_rss_mib"],
            "bare nats-py client process",
            ratio(mem["instance_idle_rss_mib"], mem["bare_nats_py_rss_mib"]),
        )
    )
    res.rows.append(
        Row(
            f"RSS of the instance under load (peak, {mem['load_messages']:,} msgs, max_ack_pending 1000)",
            mem["instance_load_peak_rss_mib"],
            "MiB",
            mem["bare_nats_py_rss_mib"],
            "bare nats-py client process",
            ratio(mem["instance_load_peak_rss_mib"], mem["bare_nats_py_rss_mib"]),
        )
    )
    res.details = {"sourcing": src, "memory": mem}
    return res

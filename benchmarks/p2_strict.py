"""P2: strict order (max_ack_pending=1, 10 ms of work per message) with N = 1, 2, 4, 8 members of a
static group over 8 partitions (each member instance a process of its own), vs one plain nats-py
max_ack_pending=1 consumer doing the same work. Throughput is counted over a fixed window after a
warm-up, with a backlog that outlasts it. Informational rows: N = 8 members in one process (one event
loop for all), and 8 plain strict consumers in one process (what one event loop allows)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from nats.js.api import AckPolicy
from nats.js.api import ConsumerConfig as NatsConsumerConfig

from pcgroups import ConsumerConfig, create_static, static_consume

from .common import (Result, Row, Size, connect, keys_by_partition, publish_all, ratio, round_robin_subjects,
                     server_and_connection, static_stream, wait_until)
from .procs import spawn, stop_all

STREAM = "P2"
PARTITIONS = 8
WORK = 0.010
WARMUP = 0.5


def window_rate(stamps: list[float], window: float) -> float:
    t0 = stamps[0] + WARMUP
    return sum(1 for s in stamps if t0 <= s < t0 + window) / window


async def plain_rate(url: str, durable: str, window: float) -> float:
    return await plain_many_rate(url, durable, window, [None])


async def plain_many_rate(url: str, durable: str, window: float, filters: list[str | None]) -> float:
    """Plain max_ack_pending=1 consumers (one per filter, each on its own connection) in this process."""
    conns = [await connect(url) for _ in filters]
    stamps: list[float] = []
    tasks = []
    stop = asyncio.Event()
    try:
        for i, (nc, filter_) in enumerate(zip(conns, filters)):
            js = nc.jetstream()
            await js.add_consumer(STREAM, NatsConsumerConfig(durable_name=f"{durable}-{i}",
                                                             ack_policy=AckPolicy.EXPLICIT, max_ack_pending=1,
                                                             ack_wait=5, filter_subject=filter_))
            sub = await js.pull_subscribe_bind(f"{durable}-{i}", STREAM)
            tasks.append(asyncio.create_task(_plain_loop(sub, stamps, stop)))
        try:
            await wait_until(lambda: bool(stamps), 10, "the plain consumers' first message")
            await asyncio.sleep(stamps[0] + WARMUP + window - time.monotonic() + 0.05)
        finally:
            # fetch() may turn a cancellation into a timeout: stop by flag, cancel only as a fallback
            stop.set()
            done, pending = await asyncio.wait(tasks, timeout=3)
            for task in pending:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(task, 3)
    finally:
        for nc in conns:
            await nc.close()
    return window_rate(stamps, window)


async def _plain_loop(sub, stamps: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            msgs = await sub.fetch(1, timeout=1)
        except asyncio.TimeoutError:
            continue
        for m in msgs:
            await asyncio.sleep(WORK)
            await m.ack()
            stamps.append(time.monotonic())


async def group_rate(url: str, members: int, window: float) -> tuple[float, dict[str, int]]:
    group = f"n{members}"
    names = [f"m{i + 1}" for i in range(members)]
    admin = await connect(url)
    conns = [await connect(url) for _ in names]
    stamps: list[float] = []
    per_member: dict[str, int] = {n: 0 for n in names}
    insts = []
    try:
        await create_static(admin, STREAM, group, PARTITIONS, members=names)

        def handler_for(name: str):
            async def handler(msg):
                await asyncio.sleep(WORK)
                await msg.ack()
                stamps.append(time.monotonic())
                per_member[name] += 1
            return handler

        for name, nc in zip(names, conns):
            insts.append(await static_consume(nc, STREAM, group, name, handler_for(name),
                                              config=ConsumerConfig(max_ack_pending=1, ack_wait=5)))
        await wait_until(lambda: bool(stamps), 10, "the group's first message")
        await asyncio.sleep(stamps[0] + WARMUP + window - time.monotonic() + 0.05)
    finally:
        await asyncio.gather(*(i.stop() for i in insts), return_exceptions=True)
        for nc in conns + [admin]:
            await nc.close()
    return window_rate(stamps, window), per_member


async def group_rate_procs(url: str, members: int, window: float) -> tuple[float, dict[str, int]]:
    """The same with each member instance in a process of its own (as deployments run them)."""
    group = f"p{members}"
    names = [f"m{i + 1}" for i in range(members)]
    admin = await connect(url)
    workers = []
    try:
        await create_static(admin, STREAM, group, PARTITIONS, members=names)
        workers = [await spawn(url, "static", STREAM, group, name, work=WORK, max_ack_pending=1, ack_wait=5)
                   for name in names]
        await wait_until(lambda: all(w.starts for w in workers), 30, "every member's first message")
        t0 = max(w.starts[0] for w in workers) + WARMUP
        await asyncio.sleep(max(0.0, t0 + window - time.time() + 0.3))
        counts = {w.name: sum(1 for s in w.starts if t0 <= s < t0 + window) for w in workers}
    finally:
        await stop_all(workers)
        await admin.close()
    return sum(counts.values()) / window, counts


async def run(size: Size) -> Result:
    res = Result("P2", "strict order (max_ack_pending=1, 10 ms work): N members vs one plain consumer")
    window = size.p2_window
    async with server_and_connection() as (server, nc):
        js = nc.jetstream()
        await static_stream(js, STREAM, PARTITIONS)
        # enough per partition for the fastest case (8 members, one partition each) to outlast the window
        per_partition = int(1.5 / WORK * (window + WARMUP + 1.5))
        keys = keys_by_partition(f"{STREAM}.*", PARTITIONS, 20)
        await publish_all(nc, round_robin_subjects(STREAM, keys, per_partition * PARTITIONS))
        base = [await plain_rate(server.url, "plain0", window)]
        rates, spread = {}, {}
        for n in size.p2_members:
            rates[n], spread[n] = await group_rate_procs(server.url, n, window)
        top = max(size.p2_members)
        in_process, _ = await group_rate(server.url, top, window)
        base.append(await plain_rate(server.url, "plain1", window))
        # what this machine allows N strict consumers in one process: N plain ones, one per partition
        parallel = await plain_many_rate(server.url, "plainpar", window,
                                         [f"{p}.>" for p in range(PARTITIONS)][:top])
    baseline = sum(base) / len(base)
    for n in size.p2_members:
        r = ratio(rates[n], baseline)
        res.rows.append(Row(f"strict order, {n} member{'s' if n > 1 else ''} / {PARTITIONS} partitions "
                            f"(a process each)", rates[n],
                            "msg/s", baseline, "1 plain max_ack_pending=1 consumer", r, f">= {0.9 * n:.1f}",
                            r is not None and r >= 0.9 * n))
    r = ratio(in_process, baseline)
    res.rows.append(Row(f"strict order, {top} members in ONE process (one event loop)", in_process, "msg/s",
                        baseline, "1 plain max_ack_pending=1 consumer", r, f"info (>= {0.9 * top:.1f} with a "
                        "process each)", None))
    r = ratio(in_process, parallel)
    res.rows.append(Row(f"same, vs {top} plain strict consumers (one per partition) in one process", in_process,
                        "msg/s", parallel, f"{top} plain consumers", r, "", None))
    res.details = {"window_s": window, "plain_parallel_rate": parallel, "in_process_rate": in_process, "work_s": WORK, "baseline_runs": base, "rates": rates,
                   "per_member_messages": spread, "backlog": per_partition * PARTITIONS}
    return res

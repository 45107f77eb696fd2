"""P2: strict order (max_ack_pending=1, 10 ms of work per message) with N = 1, 2, 4, 8 members of a
static group over 8 partitions (each member instance a process of its own), vs one plain nats-py
max_ack_pending=1 consumer doing the same work.

Throughput is counted over WINDOWS consecutive windows after a warm-up (the backlog outlasts them) and
the best window is kept, for the baseline as for the groups: the machine is shared, and a transient
load elsewhere should not decide a ratio. Informational rows: N plain strict consumers with a process
each (what this machine allows N strict consumers), N members in ONE process (one event loop for all),
and N plain strict consumers in one process."""

from __future__ import annotations

import asyncio
import contextlib
import time

from nats.js.api import AckPolicy
from nats.js.api import ConsumerConfig as NatsConsumerConfig

from pcgroups import ConsumerConfig, create_static, static_consume

from .common import (
    Result,
    Row,
    Size,
    connect,
    keys_by_partition,
    publish_all,
    ratio,
    round_robin_subjects,
    server_and_connection,
    static_stream,
    wait_until,
)
from .procs import spawn, stop_all

STREAM = "P2"
PARTITIONS = 8
WORK = 0.010
WARMUP = 0.5
WINDOWS = 2


def window_rates(stamps: list[float], t0: float, window: float) -> list[float]:
    """Messages per second in each of WINDOWS consecutive windows from ``t0``."""
    return [sum(1 for s in stamps if t0 + i * window <= s < t0 + (i + 1) * window) / window for i in range(WINDOWS)]


async def plain_many_rate(url: str, durable: str, window: float, filters: list[str | None]) -> list[float]:
    """Plain max_ack_pending=1 consumers (one per filter, each on its own connection) in this process."""
    conns = [await connect(url) for _ in filters]
    stamps: list[float] = []
    tasks = []
    stop = asyncio.Event()
    try:
        for i, (nc, filter_) in enumerate(zip(conns, filters, strict=False)):
            js = nc.jetstream()
            await js.add_consumer(
                STREAM,
                NatsConsumerConfig(
                    durable_name=f"{durable}-{i}",
                    ack_policy=AckPolicy.EXPLICIT,
                    max_ack_pending=1,
                    ack_wait=5,
                    filter_subject=filter_,
                ),
            )
            sub = await js.pull_subscribe_bind(f"{durable}-{i}", STREAM)
            tasks.append(asyncio.create_task(_plain_loop(sub, stamps, stop)))
        try:
            await wait_until(lambda: bool(stamps), 10, "the plain consumers' first message")
            t0 = stamps[0] + WARMUP
            await asyncio.sleep(t0 + WINDOWS * window - time.monotonic() + 0.05)
        finally:
            # fetch() may turn a cancellation into a timeout: stop by flag, cancel only as a fallback
            stop.set()
            _done, pending = await asyncio.wait(tasks, timeout=3)
            for task in pending:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(task, 3)
    finally:
        for nc in conns:
            await nc.close()
    return window_rates(stamps, t0, window)


async def _plain_loop(sub, stamps: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            msgs = await sub.fetch(1, timeout=1)
        except TimeoutError:
            continue
        for m in msgs:
            await asyncio.sleep(WORK)
            await m.ack()
            stamps.append(time.monotonic())


async def group_rate(url: str, members: int, window: float) -> list[float]:
    """N members of a static group, all in this process (each its own connection)."""
    group = f"n{members}"
    names = [f"m{i + 1}" for i in range(members)]
    admin = await connect(url)
    conns = [await connect(url) for _ in names]
    stamps: list[float] = []
    insts = []
    try:
        await create_static(admin, STREAM, group, PARTITIONS, members=names)

        async def handler(msg):
            await asyncio.sleep(WORK)
            await msg.ack()
            stamps.append(time.monotonic())

        for name, nc in zip(names, conns, strict=False):
            insts.append(
                await static_consume(
                    nc, STREAM, group, name, handler, config=ConsumerConfig(max_ack_pending=1, ack_wait=5)
                )
            )
        await wait_until(lambda: bool(stamps), 10, "the group's first message")
        t0 = stamps[0] + WARMUP
        await asyncio.sleep(t0 + WINDOWS * window - time.monotonic() + 0.05)
    finally:
        await asyncio.gather(*(i.stop() for i in insts), return_exceptions=True)
        for nc in [*conns, admin]:
            await nc.close()
    return window_rates(stamps, t0, window)


async def procs_rate(url: str, members: int, window: float, *, plain: bool = False) -> tuple[list[float], dict]:
    """N member instances (or N plain consumers, one partition each), each a process of its own."""
    group = f"{'q' if plain else 'p'}{members}"
    names = [f"m{i + 1}" for i in range(members)]
    admin = await connect(url)
    workers = []
    try:
        if plain:
            workers = [
                await spawn(
                    url,
                    "plain",
                    STREAM,
                    f"{group}-{i}",
                    f"{i}.>",
                    name=f"plain{i}",
                    work=WORK,
                    max_ack_pending=1,
                    ack_wait=5,
                )
                for i in range(members)
            ]
        else:
            await create_static(admin, STREAM, group, PARTITIONS, members=names)
            workers = [
                await spawn(url, "static", STREAM, group, name, work=WORK, max_ack_pending=1, ack_wait=5)
                for name in names
            ]
        await wait_until(lambda: all(w.starts for w in workers), 30, "every process's first message")
        t0 = max(w.starts[0] for w in workers) + WARMUP
        await asyncio.sleep(max(0.0, t0 + WINDOWS * window - time.time() + 0.3))
        stamps = [s for w in workers for s in w.starts]
        per_worker = {w.name: sum(1 for s in w.starts if t0 <= s < t0 + WINDOWS * window) for w in workers}
    finally:
        await stop_all(workers)
        await admin.close()
    return window_rates(stamps, t0, window), per_worker


async def run(size: Size) -> Result:
    res = Result("P2", "strict order (max_ack_pending=1, 10 ms work): N members vs one plain consumer")
    window = size.p2_window
    top = max(size.p2_members)
    async with server_and_connection() as (server, nc):
        js = nc.jetstream()
        await static_stream(js, STREAM, PARTITIONS)
        # enough per partition for the fastest case (one partition per member) to outlast the windows
        per_partition = int(1.5 / WORK * (WINDOWS * window + WARMUP + 1.5))
        keys = keys_by_partition(f"{STREAM}.*", PARTITIONS, 20)
        await publish_all(nc, round_robin_subjects(STREAM, keys, per_partition * PARTITIONS))
        base = await plain_many_rate(server.url, "plain0", window, [None])
        rates, spread = {}, {}
        for n in size.p2_members:
            rates[n], spread[n] = await procs_rate(server.url, n, window)
        plain_procs, _ = await procs_rate(server.url, top, window, plain=True)
        in_process = await group_rate(server.url, top, window)
        parallel = await plain_many_rate(server.url, "plainpar", window, [f"{p}.>" for p in range(PARTITIONS)][:top])
        base += await plain_many_rate(server.url, "plain1", window, [None])
    baseline = max(base)
    best = {n: max(v) for n, v in rates.items()}
    for n in size.p2_members:
        r = ratio(best[n], baseline)
        res.rows.append(
            Row(
                f"strict order, {n} member{'s' if n > 1 else ''} / {PARTITIONS} partitions (a process each)",
                best[n],
                "msg/s",
                baseline,
                "1 plain max_ack_pending=1 consumer",
                r,
                f">= {0.9 * n:.1f}",
                r is not None and r >= 0.9 * n,
            )
        )
    r = ratio(best[top], max(plain_procs))
    res.rows.append(
        Row(
            f"same {top} members vs {top} plain strict consumers (one partition each), a process each",
            best[top],
            "msg/s",
            max(plain_procs),
            f"{top} plain consumers",
            r,
            "",
            None,
        )
    )
    r = ratio(max(in_process), baseline)
    res.rows.append(
        Row(
            f"strict order, {top} members in ONE process (one event loop)",
            max(in_process),
            "msg/s",
            baseline,
            "1 plain max_ack_pending=1 consumer",
            r,
            f"info (>= {0.9 * top:.1f} with a process each)",
            None,
        )
    )
    r = ratio(max(in_process), max(parallel))
    res.rows.append(
        Row(
            f"same, vs {top} plain strict consumers (one partition each) in one process",
            max(in_process),
            "msg/s",
            max(parallel),
            f"{top} plain consumers",
            r,
            "",
            None,
        )
    )
    res.details = {
        "window_s": window,
        "windows": WINDOWS,
        "work_s": WORK,
        "baseline_windows": base,
        "group_windows": rates,
        "plain_processes_windows": plain_procs,
        "in_process_windows": in_process,
        "plain_in_process_windows": parallel,
        "per_member_messages": spread,
        "backlog": per_partition * PARTITIONS,
    }
    return res

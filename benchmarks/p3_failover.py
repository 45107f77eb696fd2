"""P3: failover and step-down of a static member with two instances, each a process of its own
(``benchmarks.worker``), AckWait 2 s (so PinnedTTL 2 s) as ``cg`` uses, max_ack_pending 1, 10 ms of
work, a publisher at 100 msg/s.

- step-down: UNPIN -> the first message started at the other instance;
- failover: SIGKILL of the pinned instance -> the first message started at the standby; a fresh
  standby is started after each kill, so every kill finds one waiting.
Times are wall-clock on one machine (worker lines carry ``time.time()``)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

from pcgroups import create_static, static_member_step_down

from .common import Result, Row, Size, pct, ratio, server_and_connection, static_stream, wait_until
from .procs import Worker, spawn, stop_all

STREAM = "P3"
ACK_WAIT = 2.0  # PinnedTTL = max(AckWait, 1 s) = 2 s
WORK = 0.010
RATE = 100.0


async def publisher(js, stop: asyncio.Event, sent: list[float]) -> None:
    i = 0
    next_at = time.monotonic()
    while not stop.is_set():
        await js.publish(f"{STREAM}.k{i}", b"x")
        sent.append(time.time())
        i += 1
        next_at += 1 / RATE
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


def pinned(workers: list[Worker]) -> Worker:
    alive = [w for w in workers if w.alive]
    return max(alive, key=lambda w: w.last_start)


async def first_elsewhere(workers: list[Worker], not_this: Worker, t: float, timeout: float) -> float | None:
    def found() -> float | None:
        times = [w.first_start_after(t) for w in workers if w is not not_this and w.alive]
        times = [x for x in times if x is not None]
        return min(times) if times else None

    try:
        await wait_until(lambda: found() is not None, timeout, "a message at another instance")
    except TimeoutError:
        return None
    return found() - t


async def start_worker(url: str, workers: list[Worker]) -> Worker:
    w = await spawn(
        url, "static", STREAM, "g", "m", name=f"i{len(workers)}", ack_wait=ACK_WAIT, work=WORK, max_ack_pending=1
    )
    workers.append(w)
    await asyncio.wait_for(w.ready.wait(), 30)
    return w


async def run(size: Size) -> Result:
    res = Result("P3", "failover after SIGKILL and step-down, PinnedTTL 2 s")
    ttl = max(ACK_WAIT, 1.0)
    workers: list[Worker] = []
    stepdowns: list[float | None] = []
    failovers: list[float | None] = []
    async with server_and_connection() as (server, nc):
        js = nc.jetstream()
        await static_stream(js, STREAM, 1)
        await create_static(nc, STREAM, "g", 1, members=["m"])
        stop = asyncio.Event()
        sent: list[float] = []
        pub = None
        try:
            for _ in range(2):
                await start_worker(server.url, workers)
            pub = asyncio.create_task(publisher(js, stop, sent))
            await wait_until(lambda: any(w.starts for w in workers), 15, "the first message")

            # steady-state gaps between consecutive messages, the yardstick for the step-down
            await asyncio.sleep(1.5)
            t_end = time.time()
            starts = sorted(s for w in workers for s in w.starts if s > t_end - 1.0)
            gaps = [b - a for a, b in itertools.pairwise(starts)]

            for _ in range(size.p3_stepdowns):
                await asyncio.sleep(0.5)
                old = pinned(workers)
                t = time.time()
                await static_member_step_down(nc, STREAM, "g", "m")
                stepdowns.append(await first_elsewhere(workers, old, t, 5.0))

            for _ in range(size.p3_kills):
                await asyncio.sleep(0.7)
                victim = pinned(workers)
                await wait_until(lambda victim=victim: time.time() - victim.last_start < 0.1, 5, "messages flowing")
                t_kill = victim.kill()
                failovers.append(await first_elsewhere(workers, victim, t_kill, 4 * ttl + 5))
                await victim.proc.wait()
                await start_worker(server.url, workers)
                await asyncio.sleep(0.3)
        finally:
            stop.set()
            if pub is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pub, 5)
            await stop_all(workers)

    ok_steps = [x for x in stepdowns if x is not None]
    ok_fail = [x for x in failovers if x is not None]
    missing_f = len(failovers) - len(ok_fail)
    missing_s = len(stepdowns) - len(ok_steps)
    f50, f99 = pct(ok_fail, 50), pct(ok_fail, 99)
    s50, s99 = pct(ok_steps, 50), pct(ok_steps, 99)
    gap99 = pct(gaps, 99)
    res.rows.append(
        Row(f"failover after SIGKILL, p50 of {len(failovers)}", f50, "s", ttl, "PinnedTTL", ratio(f50, ttl))
    )
    res.rows.append(
        Row(
            f"failover after SIGKILL, p99 of {len(failovers)}",
            f99,
            "s",
            ttl,
            "PinnedTTL",
            ratio(f99, ttl),
            f"<= PinnedTTL + 0.5 s = {ttl + 0.5:.1f} s",
            f99 is not None and f99 <= ttl + 0.5 and missing_f == 0,
        )
    )
    res.rows.append(
        Row(
            f"step-down (unpin -> first message elsewhere), p50 of {len(stepdowns)}",
            s50,
            "s",
            gap99,
            "p99 gap between messages",
            ratio(s50, gap99),
        )
    )
    res.rows.append(
        Row(
            f"step-down, p99 of {len(stepdowns)}",
            s99,
            "s",
            gap99,
            "p99 gap between messages",
            ratio(s99, gap99),
            "<= 0.5 s",
            s99 is not None and s99 <= 0.5 and missing_s == 0,
        )
    )
    res.details = {
        "pinned_ttl_s": ttl,
        "ack_wait_s": ACK_WAIT,
        "work_s": WORK,
        "publish_rate": RATE,
        "failovers_s": failovers,
        "stepdowns_s": stepdowns,
        "failover_max_s": max(ok_fail, default=None),
        "stepdown_max_s": max(ok_steps, default=None),
        "missing_failovers": missing_f,
        "missing_stepdowns": missing_s,
        "steady_gap_p50_s": pct(gaps, 50),
        "steady_gap_p99_s": gap99,
        "instances_started": len(workers),
        "published": len(sent),
    }
    return res

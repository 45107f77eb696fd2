"""P6: key-level concurrency. One partition, a burst of 1,000 messages on key A, then one
message on each of 50 other keys, 10 ms of work per message: latency (publish -> acked) of the
other keys' messages with K = 8 vs K = 1 (partition order); and throughput with many keys, K = 8 vs
K = 1.

Two arrival patterns for the other keys: *during the burst* (one every work time, i.e. traffic that
keeps arriving while A's backlog is worked off: the seed's situation, and the target's), and *all at
once* right after the burst (then even a perfect scheduler needs ceil(50 / (K - 1)) turns for the
last one, so the row is informational and shows that bound)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time

from pcgroups import ConsumerConfig, create_static, static_consume

from .common import Result, Row, Size, pct, publish_all, ratio, server_and_connection, static_stream, wait_until

WORK = 0.010
K = 8
MAX_ACK_PENDING = 2000   # >= burst + others, so K = 8 sees past the burst
_n = 0


def _name(prefix: str) -> str:
    global _n
    _n += 1
    return f"{prefix}{_n}"


async def latency_round(nc, js, k: int, burst: int, others: int, paced: bool) -> dict:
    """Returns the other keys' latencies (publish -> handler start, publish -> acked) in seconds, and how
    many consumer RESETs the scheduler made."""
    stream = _name("P6L")
    await static_stream(js, stream, 1)
    await create_static(nc, stream, "g", 1, members=["m"])
    published: dict[str, float] = {}
    started: dict[str, float] = {}
    acked: dict[str, float] = {}

    async def handler(msg):
        key = msg.subject
        if key != "A":
            started[key] = time.monotonic()
        await asyncio.sleep(WORK)
        await msg.ack()
        if key != "A":
            acked[key] = time.monotonic()

    with counting_resets() as counter:
        inst = await static_consume(nc, stream, "g", "m", handler, concurrency=k,
                                    config=ConsumerConfig(max_ack_pending=MAX_ACK_PENDING, ack_wait=5))
        try:
            await _latency_traffic(nc, js, inst, stream, burst, others, paced, published, acked)
        finally:
            await inst.stop()
    done = sorted(acked[n] - published[n] for n in acked)
    wait = sorted(started[n] - published[n] for n in started)
    return {"acked": done, "started": wait, "resets": counter.resets}


async def _latency_traffic(nc, js, inst, stream: str, burst: int, others: int, paced: bool,
                           published: dict[str, float], acked: dict[str, float]) -> None:
    await inst.wait_for_consuming(10)
    await publish_all(nc, [f"{stream}.A"] * burst)
    names = [f"o{i}" for i in range(others)]
    if paced:
        next_at = time.monotonic()
        for name in names:
            published[name] = time.monotonic()
            await js.publish(f"{stream}.{name}", b"x")
            next_at += WORK
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    else:
        t = time.monotonic()
        for name in names:
            published[name] = t
        await publish_all(nc, [f"{stream}.{name}" for name in names])
    await wait_until(lambda: len(acked) == others, burst * WORK * 3 + 30, "the other keys' messages")


async def throughput_round(nc, js, k: int, window: float, group_suffix: str = "", keys: int = 1000,
                           ack_wait: float = 5.0) -> float:
    """msg/s over ``window`` (after 0.5 s of warm-up) with a backlog spread over ``keys`` keys."""
    stream = _name("P6T" + group_suffix)
    await static_stream(js, stream, 1)
    await create_static(nc, stream, "g", 1, members=["m"])
    backlog = int((window + 1.5) * k / WORK * 1.2)
    await publish_all(nc, [f"{stream}.k{i % keys}" for i in range(backlog)])
    stamps: list[float] = []

    async def handler(msg):
        await asyncio.sleep(WORK)
        await msg.ack()
        stamps.append(time.monotonic())

    inst = await static_consume(nc, stream, "g", "m", handler, concurrency=k,
                                config=ConsumerConfig(max_ack_pending=MAX_ACK_PENDING, ack_wait=ack_wait))
    try:
        await wait_until(lambda: len(stamps) > 0, 10, "the first message")
        t0 = stamps[0] + 0.5
        await asyncio.sleep(max(0.0, t0 + window - time.monotonic()))
        t1 = t0 + window
        counted = sum(1 for s in stamps if t0 <= s < t1)
        if len(stamps) >= backlog:
            raise RuntimeError("the backlog ran out inside the window")
    finally:
        await inst.stop()
    return counted / window


class ResetCounter(logging.Handler):
    """Counts the consumer RESETs the key-level scheduler logs when it takes a pin ("order restore");
    WARNING and above still reach the root handlers."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.resets = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "reset to the ack floor" in record.getMessage():
            self.resets += 1
        if record.levelno >= logging.WARNING:
            logging.getLogger().handle(record)


@contextlib.contextmanager
def counting_resets():
    logger = logging.getLogger("pcgroups")
    counter = ResetCounter()
    saved = logger.level, logger.propagate
    logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))
    logger.propagate = False
    logger.addHandler(counter)
    try:
        yield counter
    finally:
        logger.removeHandler(counter)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


async def run(size: Size) -> Result:
    res = Result("P6", "key-level concurrency: one partition, burst on key A, K=8 vs K=1")
    burst, others = size.p6_burst, size.p6_others
    async with server_and_connection() as (server, nc):
        js = nc.jetstream()
        lat = {}
        for paced in (True, False):
            for k in (K, 1):
                lat[(paced, k)] = await latency_round(nc, js, k, burst, others, paced)
        tput = {k: await throughput_round(nc, js, k, size.p6_window) for k in (1, K)}

    target = 3 * WORK
    for paced in (True, False):
        k8, k1 = lat[(paced, K)]["acked"], lat[(paced, 1)]["acked"]
        label = "during the burst" if paced else "all at once after the burst"
        p50, p99 = pct(k8, 50), pct(k8, 99)
        b50, b99 = pct(k1, 50), pct(k1, 99)
        if paced:
            res.rows.append(Row(f"other keys ({label}) p50 latency, K=8", p50, "s", b50, "K=1", ratio(p50, b50)))
            res.rows.append(Row(f"other keys ({label}) p99 latency, K=8", p99, "s", b99, "K=1", ratio(p99, b99),
                                f"p99 <= 3 x work = {target * 1000:.0f} ms", p99 is not None and p99 <= target))
        else:
            ideal = math.ceil(others / (K - 1)) * WORK
            res.rows.append(Row(f"other keys ({label}) p50 latency, K=8", p50, "s", b50, "K=1", ratio(p50, b50)))
            res.rows.append(Row(f"other keys ({label}) p99 latency, K=8", p99, "s", b99, "K=1", ratio(p99, b99),
                                f"info: a perfect K=8 schedule needs {ideal * 1000:.0f} ms + work", None))
    r = ratio(tput[K], tput[1])
    res.rows.append(Row(f"throughput, 1,000 keys, 10 ms work, K={K}", tput[K], "msg/s", tput[1], "K=1", r,
                        f">= 0.9 x K = {0.9 * K:.1f}", r is not None and r >= 0.9 * K))
    res.details = {
        "burst": burst, "others": others, "work_s": WORK, "max_ack_pending": MAX_ACK_PENDING,
        "latency_s": {f"{'paced' if p else 'at_once'}_k{k}": {
            "acked_p50": pct(v["acked"], 50), "acked_p99": pct(v["acked"], 99), "acked_max": max(v["acked"]),
            "started_p50": pct(v["started"], 50), "started_p99": pct(v["started"], 99),
            "started_max": max(v["started"]), "consumer_resets": v["resets"]}
            for (p, k), v in lat.items()},
        "throughput_msgs_per_s": {f"k{k}": v for k, v in tput.items()},
    }
    return res

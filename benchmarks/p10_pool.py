"""P10: the worker pool. One static member (one partition) whose instance dispatches (``--dispatch``) to worker
processes (``serve_worker``); every instance and worker is a process of its own (``benchmarks.worker``), on
uvloop when it is installed, as ``cg`` runs them. Acks are counted on the wire (``+ACK`` on the stream's ack
subjects), so every side is measured the same way.

- **scaling**: 1,000 keys, 200 ms of simulated I/O per message (``asyncio.sleep``), 1, 2, 4, 8 and 16
  workers of capacity 1 added one step after the other to the same dispatcher: throughput against linear
  (the one-worker rate times the workers) and against the ideal (a message per 200 ms per worker); the same
  load in one instance with ``--concurrency 16`` for comparison;
- **the dispatcher's ceiling**: handlers that do no work, more worker slots than can ever be busy: messages per
  second through one dispatcher and the dispatcher process's CPU time per message, on uvloop and on asyncio's
  loop; the baseline is one instance running the same handlers itself (key-level concurrency, the same slots);
- **8 workers of capacity 1 without work**: messages per second through one dispatcher to 8 worker processes of
  capacity 1 whose handlers only ack, against one instance with concurrency 1 on the same backlog (both
  processes of their own); beside it the floor, the same hand-off without pcgroups: a raw pinned pull loop that
  hands each message to one of 8 nats-py responder processes (one request in flight at each) and acks it on
  the answer (``benchmarks.worker rawpool``), and what every process together spent per message;
- **fairness under the pool**: the P6 burst (10,000 on key A with ``--full``, 2,000 with ``--quick``, then one
  message on each of 40 other keys) with 8 workers of capacity 1 and 10 ms of work: the other keys' p50/p99;
- **the body through the dispatcher, or fetched by the worker**: the library forwards the body in the offer; the
  alternative (the dispatcher's consumer is headers-only, and the worker reads the body by stream sequence
  with a direct get, ``$JS.API.DIRECT.GET.<stream>``) is prototyped here (``benchmarks.worker pool --fetch``),
  not in the library. For 100 B and 16 KB bodies: the latency of a message published at a steady rate, the
  dispatcher's and the workers' CPU per message, and the rate a backlog drains at; at the steady rate, the
  dispatcher against one instance running the same handlers itself."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from dataclasses import dataclass, field

from nats.js.api import StreamConfig, SubjectTransform

from pcgroups import create_static
from pcgroups.consume._msg import ack_numbers

from .burst import burst_then_others, publish_burst
from .common import Result, Row, Size, cpu_seconds, pct, publish_all, ratio, server_and_connection, wait_until
from .procs import Worker, ready, spawn, stop_all

KEYS = 1000
IO = 0.200  # the scaling rows' simulated I/O per message
STEPS = (1, 2, 4, 8, 16)
LINEAR = 0.8
FAIR_WORK = 0.010
FAIR_WORKERS = 8
OTHERS = 40
CEILING_SLOTS = 256  # the ceiling rows' worker slots (2 workers of 128): never all busy
NARROW_WORKERS = 8  # the pool against one instance with concurrency 1: workers of capacity 1, no work
BODIES = (100, 16 * 1024)
BACKLOG_BYTES = 128 << 20  # the most a drain's backlog of bodies holds
TIME_LIMIT_FACTOR = 3  # of Size.time_limit: many processes start and stop
LOOP = "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
_n = 0


def _name(prefix: str) -> str:
    global _n
    _n += 1
    return f"{prefix}{_n}"


class AckCounter:
    """Every ``+ACK`` on ``$JS.ACK.<stream>.>``: when it came, by stream sequence (the first one)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.by_seq: dict[int, float] = {}

    async def watch(self, nc, stream: str):
        async def cb(msg) -> None:
            if msg.data.startswith(b"+ACK"):
                now = time.monotonic()
                self.stamps.append(now)
                self.by_seq.setdefault(ack_numbers(msg.subject)[1], now)

        return await nc.subscribe(f"$JS.ACK.{stream}.>", cb=cb)

    def rate(self, t0: float, t1: float) -> float:
        """Acks per second between ``t0`` and ``t1``: from the first to the last ack inside (at a few per second a
        count over the window would be off by up to one ack)."""
        inside = [s for s in self.stamps if t0 <= s < t1]
        if len(inside) > 2:
            return (len(inside) - 1) / (inside[-1] - inside[0])
        return len(inside) / (t1 - t0) if t1 > t0 else 0.0

    def count(self, t0: float, t1: float) -> int:
        return sum(1 for s in self.stamps if t0 <= s < t1)


@dataclass
class Pool:
    """A dispatching member instance and its workers, processes of their own."""

    url: str
    stream: str
    loop: str = LOOP
    dispatcher: Worker | None = None
    workers: list[Worker] = field(default_factory=list)

    async def start_dispatcher(self, **options) -> Worker:
        self.dispatcher = await ready(
            await spawn(
                self.url,
                "static",
                self.stream,
                "g",
                "m",
                name="dispatcher",
                dispatch=True,
                ack_wait=5,
                max_ack_pending=0,
                report="count",
                loop=self.loop,
                **options,
            ),
            30,
        )
        return self.dispatcher

    async def add_workers(
        self, n: int, *, capacity: int = 1, work: float = 0.0, enrolled: bool = True, **options
    ) -> None:
        """``n`` more workers; returns once each is enrolled with the dispatcher (``enrolled`` False: once each
        runs, waiting for a dispatcher)."""
        new = []
        for _ in range(n):  # each joins self.workers at once, so that stop() ends it whatever happens next
            new.append(
                await spawn(
                    self.url,
                    "pool",
                    self.stream,
                    "g",
                    f"w{len(self.workers)}",
                    capacity=capacity,
                    work=work,
                    ack_wait=5,
                    loop=self.loop,
                    **({"report": "count"} | options),
                )
            )
            self.workers.append(new[-1])
        if enrolled:
            await asyncio.wait_for(asyncio.gather(*(w.ready.wait() for w in new)), 30 + 2 * n)
        else:
            await wait_until(
                lambda: all(any(e.get("ev") == "started" for e in w.events) for w in new),
                30 + 2 * n,
                "the workers running",
            )

    async def stop(self) -> None:
        await stop_all(self.workers)
        if self.dispatcher is not None:
            await self.dispatcher.stop()


async def stream_with_keys(nc, messages: int, *, body: bytes = b"x", direct: bool = False) -> str:
    """A fresh one-partition stream and static group ``g`` (member ``m``) holding ``messages`` over KEYS keys."""
    stream = _name("P10")
    await nc.jetstream().add_stream(
        StreamConfig(
            name=stream,
            subjects=[f"{stream}.*"],
            allow_direct=direct,
            subject_transform=SubjectTransform(src=f"{stream}.*", dest="0.{{wildcard(1)}}"),
        )
    )
    await create_static(nc, stream, "g", 1, members=["m"])
    if messages:
        await publish_all(nc, [f"{stream}.k{i % KEYS}" for i in range(messages)], payload=body)
    return stream


async def measure(acks: AckCounter, settle: float, window: float, backlog: int) -> tuple[float, float, float]:
    """(the ack rate over ``window`` after ``settle``, its start, its end): the window ends early when every
    message of the ``backlog`` was acked (the rate is taken from the acks inside, at full speed)."""
    t0 = time.monotonic() + settle
    t1 = t0 + window
    await asyncio.sleep(settle)
    while time.monotonic() < t1 and len(acks.stamps) < backlog:
        await asyncio.sleep(0.05)
    t1 = min(t1, time.monotonic())
    return acks.rate(t0, t1), t0, t1


# --- scaling -------------------------------------------------------------------------------------------------
async def scaling(url: str, nc, window: float) -> dict:
    """msg/s with 1, 2, 4, 8, 16 workers (capacity 1, 200 ms each), added to one dispatcher step by step."""
    per_step = window + 1.5
    backlog = int(sum(STEPS) / IO * per_step * 1.3) + 200
    stream = await stream_with_keys(nc, backlog)
    acks = AckCounter()
    sub = await acks.watch(nc, stream)
    pool = Pool(url, stream)
    rates: dict[int, float] = {}
    try:
        await pool.start_dispatcher()
        for n in STEPS:
            await pool.add_workers(n - len(pool.workers), work=IO)
            rates[n], _, _ = await measure(acks, 2 * IO + 0.5, window, backlog)
    finally:
        await pool.stop()
        await sub.unsubscribe()
    return rates


async def in_process(
    url: str, nc, work: float, concurrency: int, window: float, backlog: int, body: bytes = b"x", loop: str = LOOP
) -> tuple[float, float | None]:
    """One member instance running the handlers itself (key-level concurrency): (msg/s, its CPU µs per message)."""
    stream = await stream_with_keys(nc, backlog, body=body)
    acks = AckCounter()
    sub = await acks.watch(nc, stream)
    inst = await ready(
        await spawn(
            url,
            "static",
            stream,
            "g",
            "m",
            name="keyed",
            concurrency=concurrency,
            work=work,
            ack_wait=5,
            max_ack_pending=0,
            report="count",
            loop=loop,
        ),
        30,
    )
    try:
        await wait_until(lambda: bool(acks.stamps), 30, "the first ack")
        cpu0 = cpu_seconds(inst.pid) or 0.0
        rate, t0, t1 = await measure(acks, 0.0, window, backlog)
        cpu = ((cpu_seconds(inst.pid) or 0.0) - cpu0) * 1e6 / max(acks.count(t0, t1), 1)
    finally:
        await inst.stop()
        await sub.unsubscribe()
    return rate, cpu


# --- the ceiling -----------------------------------------------------------------------------------------------
async def ceiling(
    url: str,
    nc,
    window: float,
    backlog: int,
    *,
    loop: str = LOOP,
    body: bytes = b"x",
    fetch: bool = False,
    workers: int = 2,
    capacity: int = CEILING_SLOTS // 2,
) -> dict:
    """Messages per second through one dispatcher whose ``workers`` (of ``capacity``) do no work (by default never
    all busy), and the CPU per message of the dispatcher and of the workers. ``fetch``: the headers-only
    dispatcher, workers that read the body by sequence. The backlog holds at most BACKLOG_BYTES of bodies."""
    backlog = max(min(backlog, BACKLOG_BYTES // len(body)), 500)
    stream = await stream_with_keys(nc, backlog, body=body, direct=fetch)
    acks = AckCounter()
    sub = await acks.watch(nc, stream)
    pool = Pool(url, stream, loop=loop)
    try:
        dispatcher = await pool.start_dispatcher(headers_only=fetch)
        await pool.add_workers(workers, capacity=capacity, fetch=fetch)
        await wait_until(lambda: len(acks.stamps) > min(200, backlog // 10), 30, "the backlog flowing")
        cpu0 = _cpu(dispatcher), sum(_cpu(w) for w in pool.workers)
        rate, t0, t1 = await measure(acks, 0.0, window, backlog)
        n = max(acks.count(t0, t1), 1)
        cpu = (_cpu(dispatcher) - cpu0[0]) * 1e6 / n, (sum(_cpu(w) for w in pool.workers) - cpu0[1]) * 1e6 / n
    finally:
        await pool.stop()
        await sub.unsubscribe()
        await nc.jetstream().delete_stream(stream)  # large bodies: give the disk back at once
    return {"rate": rate, "dispatcher_cpu_us": cpu[0], "workers_cpu_us": cpu[1]}


def _cpu(w: Worker) -> float:
    return cpu_seconds(w.pid) or 0.0


async def raw_pool(url: str, nc, window: float, backlog: int, responders: int = NARROW_WORKERS) -> dict:
    """The floor of :func:`ceiling` with ``responders`` workers of capacity 1: the same hand-off without pcgroups
    (``benchmarks.worker rawpool`` and its responders), its rate and the CPU per message of all its processes."""
    stream = await stream_with_keys(nc, backlog)
    acks = AckCounter()
    sub = await acks.watch(nc, stream)
    procs: list[Worker] = []
    try:
        for i in range(responders):
            procs.append(await ready(await spawn(url, "responder", stream, "raw", f"w{i}", loop=LOOP), 30))
        procs.append(
            await ready(await spawn(url, "rawpool", stream, "raw", "d", concurrency=responders, loop=LOOP), 30)
        )
        await wait_until(lambda: len(acks.stamps) > min(200, backlog // 10), 30, "the backlog flowing")
        cpu0 = sum(_cpu(w) for w in procs)
        rate, t0, t1 = await measure(acks, 0.0, window, backlog)
        cpu = (sum(_cpu(w) for w in procs) - cpu0) * 1e6 / max(acks.count(t0, t1), 1)
    finally:
        await stop_all(procs)
        await sub.unsubscribe()
    return {"rate": rate, "cpu_us": cpu}


# --- the body: forwarded or fetched ------------------------------------------------------------------------
async def steady(url: str, nc, body: bytes, *, mode: str, rate: float, seconds: float) -> dict:
    """Publish at ``rate`` for ``seconds`` (keys in turn), ``mode`` ``forward`` (a dispatcher and 2 workers of
    capacity 8, no work), ``fetch`` (the same, the body fetched by the worker) or ``local`` (one instance running
    the same handlers itself, --concurrency 16): each message's latency (publish -> ``+ACK``), and the CPU per
    message of the dispatcher (or the instance) and of the workers."""
    fetch = mode == "fetch"
    stream = await stream_with_keys(nc, 0, direct=fetch)
    acks = AckCounter()
    sub = await acks.watch(nc, stream)
    pool = Pool(url, stream)
    js = nc.jetstream()
    published: dict[int, float] = {}
    try:
        if mode == "local":
            pool.dispatcher = await ready(
                await spawn(
                    url,
                    "static",
                    stream,
                    "g",
                    "m",
                    name="keyed",
                    concurrency=16,
                    ack_wait=5,
                    max_ack_pending=0,
                    report="count",
                    loop=LOOP,
                ),
                30,
            )
        else:
            await pool.start_dispatcher(headers_only=fetch)
            await pool.add_workers(2, capacity=8, fetch=fetch)
        assert pool.dispatcher is not None
        cpu0 = _cpu(pool.dispatcher), sum(_cpu(w) for w in pool.workers)
        next_at = time.monotonic()
        for i in range(int(rate * seconds)):
            t = time.monotonic()
            ack = await js.publish(f"{stream}.k{i % KEYS}", body)
            published[ack.seq] = t
            next_at += 1 / rate
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await wait_until(lambda: all(s in acks.by_seq for s in published), 30, "every message acked")
        n = len(published)
        cpu = (_cpu(pool.dispatcher) - cpu0[0]) * 1e6 / n, (sum(_cpu(w) for w in pool.workers) - cpu0[1]) * 1e6 / n
    finally:
        await pool.stop()
        await sub.unsubscribe()
    lat = [acks.by_seq[s] - t for s, t in published.items()]
    return {
        "p50": pct(lat, 50),
        "p99": pct(lat, 99),
        "dispatcher_cpu_us": cpu[0],
        "workers_cpu_us": cpu[1],
        "messages": len(lat),
    }


# --- fairness ----------------------------------------------------------------------------------------------------
async def fairness(url: str, nc, burst: int, *, stored: bool) -> list[float]:
    """The P6 burst through a dispatcher and 8 workers of capacity 1, 10 ms of work: other keys' latencies.
    ``stored``: the burst is in the stream and the workers wait when the dispatcher starts; the other keys come
    as soon as it runs (so the time it takes to enrol the workers counts too)."""
    stream = await stream_with_keys(nc, 0)
    pool = Pool(url, stream)
    try:
        if stored:
            await publish_burst(nc, stream, burst)
            await pool.add_workers(FAIR_WORKERS, work=FAIR_WORK, enrolled=False)
            await pool.start_dispatcher()
        else:
            await pool.start_dispatcher()
            await pool.add_workers(FAIR_WORKERS, work=FAIR_WORK)
        timeout = min(burst * FAIR_WORK * 1.5, 60.0) + 20
        keys = await burst_then_others(nc, stream, burst, OTHERS, timeout, stored=stored)
    finally:
        await pool.stop()
    return keys.latencies()


async def run(size: Size) -> Result:
    res = Result("P10", "the worker pool: a dispatching member and worker processes")
    window = size.p10_window
    async with server_and_connection() as (server, nc):
        url = server.url
        rates = await scaling(url, nc, window)
        keyed16, _ = await in_process(url, nc, IO, 16, window, int(16 / IO * (window + 2) * 1.3) + 100)
        ceil = {
            lp: await ceiling(url, nc, window, size.p10_ceiling_backlog, loop=lp)
            for lp in ([LOOP, "asyncio"] if LOOP != "asyncio" else ["asyncio"])
        }
        local = await in_process(url, nc, 0.0, CEILING_SLOTS, window, 3 * size.p10_ceiling_backlog)
        narrow = await ceiling(url, nc, window, size.p10_ceiling_backlog, workers=NARROW_WORKERS, capacity=1)
        serial = await in_process(url, nc, 0.0, 1, window, 3 * size.p10_ceiling_backlog)
        floor = await raw_pool(url, nc, window, size.p10_ceiling_backlog)
        fair = {stored: await fairness(url, nc, size.p6_big_burst, stored=stored) for stored in (False, True)}
        bodies = {}
        for b in BODIES:
            for fetch in (False, True):
                bodies[(b, fetch)] = {
                    "steady": await steady(
                        url, nc, b"x" * b, mode="fetch" if fetch else "forward", rate=size.p10_rate, seconds=window
                    ),
                    "drain": await ceiling(url, nc, window, size.p10_ceiling_backlog, body=b"x" * b, fetch=fetch),
                }
        local_steady = await steady(url, nc, b"x" * BODIES[0], mode="local", rate=size.p10_rate, seconds=window)

    _scaling_rows(res, rates, keyed16)
    _ceiling_rows(res, ceil, local)
    _narrow_rows(res, narrow, serial, floor)
    for stored, lat in fair.items():
        p50, p99 = pct(lat, 50), pct(lat, 99)
        how = "stored, the dispatcher starting, workers waiting" if stored else "arriving while it runs"
        head = f"burst {size.p6_big_burst:,} on A ({how}), then {OTHERS} other keys, {FAIR_WORKERS} workers x 1, 10 ms"
        res.rows.append(Row(f"{head}: other keys' p50", p50, "s"))
        res.rows.append(
            Row(
                f"{head}: other keys' p99",
                p99,
                "s",
                target="p99 < 1 s",
                met=p99 is not None and len(lat) == OTHERS and p99 < 1.0,
            )
        )
    fwd = bodies[(BODIES[0], False)]["steady"]
    res.rows.append(
        Row(
            f"dispatcher CPU per message at {size.p10_rate} msg/s (100 B, workers without work)",
            fwd["dispatcher_cpu_us"],
            "us",
            local_steady["dispatcher_cpu_us"],
            "one instance running the handlers, --concurrency 16",
            ratio(fwd["dispatcher_cpu_us"], local_steady["dispatcher_cpu_us"]),
        )
    )
    res.rows.append(
        Row(
            f"latency p50 at {size.p10_rate} msg/s through the pool",
            fwd["p50"],
            "s",
            local_steady["p50"],
            "one instance running the handlers",
            ratio(fwd["p50"], local_steady["p50"]),
        )
    )
    _body_rows(res, bodies)
    res.details = {
        "loop": LOOP,
        "keys": KEYS,
        "io_s": IO,
        "scaling_msgs_per_s": rates,
        "keyed_concurrency_16_msgs_per_s": keyed16,
        "ceiling": ceil,
        "ceiling_in_process": {"rate": local[0], "cpu_us": local[1], "concurrency": CEILING_SLOTS},
        "narrow": narrow | {"workers": NARROW_WORKERS, "capacity": 1},
        "concurrency_1": {"rate": serial[0], "cpu_us": serial[1]},
        "raw_pool_floor": floor,
        "fairness_s": {
            ("stored" if s else "live"): {
                "p50": pct(v, 50),
                "p99": pct(v, 99),
                "max": max(v, default=None),
                "acked": len(v),
            }
            for s, v in fair.items()
        },
        "bodies": {f"{b}B_{'fetch' if f else 'forward'}": v for (b, f), v in bodies.items()},
        "steady_in_process": local_steady,
        "steady_rate": size.p10_rate,
    }
    return res


def _scaling_rows(res: Result, rates: dict[int, float], keyed16: float) -> None:
    one = rates[1]
    for n, rate in rates.items():
        linear = one * n
        r = ratio(rate, linear)
        res.rows.append(
            Row(
                f"{n} worker(s) x capacity 1, 1,000 keys, 200 ms of I/O each",
                rate,
                "msg/s",
                linear,
                "linear (1 worker's rate x n)",
                r,
                f">= {LINEAR} of linear" if n > 1 else "",
                (r is not None and r >= LINEAR) if n > 1 else None,
            )
        )
    ideal = STEPS[-1] / IO
    res.rows.append(
        Row(
            f"{STEPS[-1]} workers against the ideal (a message per 200 ms each)",
            rates[STEPS[-1]],
            "msg/s",
            ideal,
            "ideal",
            ratio(rates[STEPS[-1]], ideal),
        )
    )
    res.rows.append(
        Row(
            "same load, one instance with --concurrency 16 (in process)",
            keyed16,
            "msg/s",
            rates[16],
            "16 workers",
            ratio(keyed16, rates[16]),
        )
    )


def _ceiling_rows(res: Result, ceil: dict[str, dict], local: tuple[float, float | None]) -> None:
    for lp, c in ceil.items():
        res.rows.append(
            Row(
                f"dispatcher ceiling, handlers without work ({lp})",
                c["rate"],
                "msg/s",
                local[0],
                f"one instance, --concurrency {CEILING_SLOTS} ({LOOP})",
                ratio(c["rate"], local[0]),
            )
        )
        res.rows.append(
            Row(
                f"dispatcher CPU per message ({lp})",
                c["dispatcher_cpu_us"],
                "us",
                local[1],
                "that instance's CPU per message",
                ratio(c["dispatcher_cpu_us"], local[1]),
            )
        )


def _narrow_rows(res: Result, narrow: dict, serial: tuple[float, float | None], floor: dict) -> None:
    head = f"{NARROW_WORKERS} workers x capacity 1, no work"
    r = ratio(narrow["rate"], serial[0])
    res.rows.append(
        Row(
            f"{head}: through one dispatcher",
            narrow["rate"],
            "msg/s",
            serial[0],
            f"one instance, concurrency 1 ({LOOP})",
            r,
            ">= 0.5",
            r is not None and r >= 0.5,
        )
    )
    res.rows.append(
        Row(
            f"{head}: the floor, a raw pinned loop handing each message to {NARROW_WORKERS} nats-py responders",
            floor["rate"],
            "msg/s",
            serial[0],
            "one instance, concurrency 1",
            ratio(floor["rate"], serial[0]),
        )
    )
    total = narrow["dispatcher_cpu_us"] + narrow["workers_cpu_us"]
    res.rows.append(
        Row(
            f"{head}: CPU per message, dispatcher and workers together (the floor's: all its processes)",
            total,
            "us",
            floor["cpu_us"],
            "raw loop and responders",
            ratio(total, floor["cpu_us"]),
        )
    )


def _body_rows(res: Result, bodies: dict) -> None:
    for b in BODIES:
        fwd, get = bodies[(b, False)], bodies[(b, True)]
        size = f"{b:,} B" if b < 1024 else f"{b // 1024} KB"
        for what, key, unit in (
            ("latency p50", "p50", "s"),
            ("latency p99", "p99", "s"),
            ("dispatcher CPU per message", "dispatcher_cpu_us", "us"),
            ("workers' CPU per message", "workers_cpu_us", "us"),
        ):
            v, base = get["steady"][key], fwd["steady"][key]
            res.rows.append(
                Row(
                    f"{size} bodies, fetched by the worker (direct get): {what}",
                    v,
                    unit,
                    base,
                    "forwarded by the dispatcher",
                    ratio(v, base),
                )
            )
        for what, key, unit in (
            ("backlog drain rate", "rate", "msg/s"),
            ("dispatcher CPU per message, draining", "dispatcher_cpu_us", "us"),
            ("workers' CPU per message, draining", "workers_cpu_us", "us"),
        ):
            v, base = get["drain"][key], fwd["drain"][key]
            res.rows.append(
                Row(
                    f"{size} bodies, fetched by the worker: {what}",
                    v,
                    unit,
                    base,
                    "forwarded by the dispatcher",
                    ratio(v, base),
                )
            )


async def compare_bodies(sizes: list[int], rounds: int, rate: int, seconds: float, backlog: int) -> dict:
    """The body rows only, ``rounds`` times, forwarding and fetching alternated: {(size, mode): [results]}."""
    out: dict[tuple[int, str], list[dict]] = {}
    async with server_and_connection() as (server, nc):
        for _ in range(rounds):
            for b in sizes:
                for fetch in (False, True):
                    mode = "fetch" if fetch else "forward"
                    got = await steady(server.url, nc, b"x" * b, mode=mode, rate=rate, seconds=seconds)
                    got["drain"] = await ceiling(server.url, nc, seconds, backlog, body=b"x" * b, fetch=fetch)
                    out.setdefault((b, mode), []).append(got)
    return out


def main() -> None:
    """``python -m benchmarks.p10_pool [--rounds N] [SIZE ...]``: the body through the dispatcher or fetched by the
    worker, alternated, for each body size (bytes; default 100 and 16384); prints the median of each figure."""
    import argparse
    import statistics

    p = argparse.ArgumentParser(prog="python -m benchmarks.p10_pool")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rate", type=int, default=200)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--backlog", type=int, default=30_000)
    p.add_argument("sizes", type=int, nargs="*", default=list(BODIES))
    a = p.parse_args()
    got = asyncio.run(compare_bodies(a.sizes, a.rounds, a.rate, a.seconds, a.backlog))
    print("body     mode     p50 ms  p99 ms  disp us  work us | drain msg/s  disp us  work us   (medians)")
    for (b, mode), runs in sorted(got.items()):

        def med(f, runs=runs):
            return statistics.median(f(r) for r in runs)

        print(
            f"{b:>7}  {mode:7} {med(lambda r: r['p50']) * 1e3:7.2f} {med(lambda r: r['p99']) * 1e3:7.2f} "
            f"{med(lambda r: r['dispatcher_cpu_us']):8.0f} {med(lambda r: r['workers_cpu_us']):8.0f} | "
            f"{med(lambda r: r['drain']['rate']):11,.0f} {med(lambda r: r['drain']['dispatcher_cpu_us']):8.0f} "
            f"{med(lambda r: r['drain']['workers_cpu_us']):8.0f}"
        )


if __name__ == "__main__":
    main()

"""P6: key-level concurrency, fair by default. One partition, K = 8 handler slots, 10 ms of work per message,
and no window setting (the consumer's max_ack_pending is the library's default):

- **fairness**: a burst on key A (400 messages; then a larger one, 2,000 with ``--quick`` and 10,000 with
  ``--full``), then one message on each of 40 other keys, all at once: the other keys' latency (publish ->
  ``+ACK`` on the wire). The member instance runs in a process of its own (``benchmarks.worker``), on asyncio's
  loop (the library's default) and on uvloop (what ``cg consume`` runs on when it is installed). The baseline
  is the same instance with the window fixed at 32 (max_ack_pending 32 = 4 x K, the default before the window
  grew), where A's burst holds every other key back (partition order);
- **during the burst** (informational since the fairness rows): the other keys arrive one per work time while A's
  backlog is worked off, K = 8 vs K = 1;
- **a SIGKILL of the pinned instance during a large burst** (work 1 ms, so that the whole backlog is worked
  off in the round): how many messages are redelivered to the standby, against what the killed instance held
  (the consumer's num_ack_pending right after the kill, at most its window, at most max_ack_pending), and that
  after the take-over every key runs one message at a time, in stream order, and nothing is lost;
- **throughput** with 1,000 keys, K = 8 vs K = 1 (in the benchmark's process, on a stored backlog)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import time

from pcgroups import ConsumerConfig, create_static, static_consume
from pcgroups.consume._window import FAIR_WINDOW
from pcgroups.jetstream._api import JetStreamApi

from .burst import BURST_KEY, burst_then_others, publish_burst
from .common import Result, Row, Size, pct, publish_all, ratio, server_and_connection, static_stream, wait_until
from .procs import Worker, ready, spawn, stop_all

WORK = 0.010
K = 8
OTHERS = 40
FAIR_BURST = 400
OLD_WINDOW = 4 * K  # max_ack_pending 32: the window before it grew (the "default")
KILL_WORK = 0.001
TARGETS = {FAIR_BURST: 0.5, 10_000: 1.0}  # p99 of the other keys' latency, by burst (the larger: < 1 s)
_n = 0


def _name(prefix: str) -> str:
    global _n
    _n += 1
    return f"{prefix}{_n}"


async def member(url: str, stream: str, name: str = "m", **options) -> Worker:
    """A member instance of group ``g`` in a process of its own, consuming (pinned or standby)."""
    return await ready(await spawn(url, "static", stream, "g", "m", name=name, ack_wait=5, **options), 30)


async def fair_round(
    url: str,
    nc,
    burst: int,
    others: int,
    *,
    loop: str = "asyncio",
    k: int = K,
    max_ack_pending: int = 0,
    paced: float = 0.0,
    stored: bool = False,
) -> dict:
    """The other keys' latencies (s) after a burst of ``burst`` on A, with a member process of ``k`` slots;
    ``stored``: the burst is in the stream before the member starts (a backlog), else it arrives while it runs."""
    stream = _name("P6F")
    await static_stream(nc.jetstream(), stream, 1)
    await create_static(nc, stream, "g", 1, members=["m"])
    if stored:
        await publish_burst(nc, stream, burst)
    inst = await member(
        url, stream, concurrency=k, work=WORK, max_ack_pending=max_ack_pending, report="count", loop=loop
    )
    try:
        timeout = min(burst * WORK * 1.5, 60.0) + others * WORK + 20
        keys = await burst_then_others(nc, stream, burst, others, timeout, paced=paced, stored=stored)
    finally:
        await inst.stop()
    return {"latencies": keys.latencies(), "acked_a": inst.count}


async def kill_round(url: str, nc, burst: int, others: int) -> dict:
    """SIGKILL of the pinned instance of a member (two instances, K = 8, default window) while it holds a
    burst of ``burst`` on A; other keys' messages keep arriving (``others`` keys, 200 msg/s) until after the
    take-over. Returns what each instance started and ended, the redeliveries and the bound."""
    stream = _name("P6K")
    js = nc.jetstream()
    api = JetStreamApi(nc)
    await static_stream(js, stream, 1)
    await create_static(nc, stream, "g", 1, members=["m"])
    opts = dict(concurrency=K, work=KILL_WORK, max_ack_pending=0, report="spans")
    first = await member(url, stream, name="i0", **opts)
    workers = [first]
    stop = asyncio.Event()
    sent: list[int] = []
    pub = asyncio.create_task(_other_traffic(js, stream, others, stop, sent))
    try:
        second = await member(url, stream, name="i1", **opts)
        workers.append(second)
        await publish_all(nc, [f"{stream}.{BURST_KEY}"] * burst)
        await wait_until(lambda: any(len(w.starts) > 100 for w in workers), 30, "the burst being worked off")
        victim = max(workers, key=lambda w: len(w.starts))
        survivor = second if victim is first else first
        await asyncio.sleep(0.5)
        before = await api.consumer_info(stream, "g-m")
        t_kill = victim.kill()
        await victim.proc.wait()
        held = await api.consumer_info(stream, "g-m")
        await asyncio.sleep(2.0)  # traffic goes on through the take-over
        stop.set()
        await pub
        total = burst + len(sent)
        await wait_until(lambda: len(_ended(workers)) >= total, burst * KILL_WORK * 10 + 60, "every message handled")
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(pub, 5)
        await stop_all(workers)
    return _kill_report(victim, survivor, t_kill, total, before, held)


async def _other_traffic(js, stream: str, others: int, stop: asyncio.Event, sent: list[int]) -> None:
    next_at = time.monotonic()
    while not stop.is_set():
        ack = await js.publish(f"{stream}.o{len(sent) % others}", b"x")
        sent.append(ack.seq)
        next_at += 1 / 200
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


def _ended(workers: list[Worker]) -> set[int]:
    return {ev["seq"] for w in workers for ev in w.events if ev.get("ev") == "end"}


def _kill_report(victim: Worker, survivor: Worker, t_kill: float, total: int, before: dict, held: dict) -> dict:
    """Redeliveries and the checks after the take-over: each key one message at a time and in stream order at
    the survivor, nothing lost (every message ended somewhere)."""
    v_started = {ev["seq"] for ev in victim.start_events}
    v_ended = {ev["seq"] for ev in victim.events if ev.get("ev") == "end"}
    s_starts = [ev for ev in survivor.start_events if ev["t"] > t_kill]
    s_ends = {ev["seq"]: ev["t"] for ev in survivor.events if ev.get("ev") == "end"}
    by_key: dict[str, list[dict]] = {}
    for ev in s_starts:
        by_key.setdefault(ev["subject"], []).append(ev)
    out_of_order = overlaps = 0
    for evs in by_key.values():
        seqs = [ev["seq"] for ev in evs]
        out_of_order += sum(1 for a, b in itertools.pairwise(seqs) if b <= a)
        overlaps += sum(1 for a, b in itertools.pairwise(evs) if b["t"] < s_ends.get(a["seq"], float("inf")))
    ended = v_ended | set(s_ends)
    return {
        "messages": total,
        "lost": total - len(ended),
        "redelivered": sum(1 for ev in s_starts if ev["n"] > 1),
        "handled_twice": len(v_started & {ev["seq"] for ev in s_starts}),
        "killed_instance_started": len(v_started),
        "killed_instance_acked": len(v_ended),
        "ack_pending_before_kill": int(before.get("num_ack_pending", 0)),
        "ack_pending_after_kill": int(held.get("num_ack_pending", 0)),
        "max_ack_pending": int(held.get("config", {}).get("max_ack_pending", 0)),
        "gap_s": (s_starts[0]["t"] - t_kill) if s_starts else None,
        "out_of_order": out_of_order,
        "overlapping": overlaps,
        "keys_checked": len(by_key),
    }


async def throughput_round(
    nc, js, k: int, window: float, group_suffix: str = "", keys: int = 1000, ack_wait: float = 5.0
) -> float:
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

    inst = await static_consume(nc, stream, "g", "m", handler, concurrency=k, config=ConsumerConfig(ack_wait=ack_wait))
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


async def run(size: Size) -> Result:
    res = Result("P6", "key-level concurrency, fair by default: one partition, a burst on key A, K=8")
    loops = ["asyncio", "uvloop"] if importlib.util.find_spec("uvloop") is not None else ["asyncio"]
    cases = [(FAIR_BURST, False), (size.p6_big_burst, False), (size.p6_big_burst, True)]  # (burst, stored)
    async with server_and_connection() as (server, nc):
        url, js = server.url, nc.jetstream()
        fair = {
            (b, st, lp): await fair_round(url, nc, b, OTHERS, loop=lp, stored=st) for b, st in cases for lp in loops
        }
        old = await fair_round(url, nc, FAIR_BURST, OTHERS, max_ack_pending=OLD_WINDOW)
        paced = {k: await fair_round(url, nc, size.p6_burst, size.p6_others, k=k, paced=WORK) for k in (K, 1)}
        killed = await kill_round(url, nc, size.p6_big_burst, OTHERS)
        tput = {k: await throughput_round(nc, js, k, size.p6_window) for k in (1, K)}

    for (b, stored, lp), r in fair.items():
        lat, target = r["latencies"], TARGETS.get(b, 1.0)
        base = old["latencies"] if b == FAIR_BURST else None
        p99 = pct(lat, 99)
        how = "stored before the member starts" if stored else "arriving while it runs"
        b99 = pct(base, 99) if base else None
        res.rows.append(
            Row(
                f"burst {b:,} on A ({how}), then {OTHERS} other keys at once, K={K}, default window, "
                f"{lp}: other keys' p99 (p50 {_ms(pct(lat, 50))})",
                p99,
                "s",
                b99,
                f"window fixed at {OLD_WINDOW}" if base else "",
                ratio(p99, b99),
                f"p99 < {target:g} s",
                p99 is not None and len(lat) == OTHERS and p99 < target,
            )
        )
    k8, k1 = paced[K]["latencies"], paced[1]["latencies"]
    res.rows.append(
        Row(
            f"burst {size.p6_burst:,} on A, {size.p6_others} other keys one per work time: p99, K={K}",
            pct(k8, 99),
            "s",
            pct(k1, 99),
            "K=1",
            ratio(pct(k8, 99), pct(k1, 99)),
            f"p99 <= 3 x work = {3 * WORK * 1000:.0f} ms",
            (pct(k8, 99) or 1.0) <= 3 * WORK,
        )
    )
    res.rows.append(
        Row(
            f"SIGKILL of the pinned instance in a burst of {size.p6_big_burst:,}: messages redelivered",
            killed["redelivered"],
            "",
            killed["ack_pending_after_kill"],
            "held by the killed instance (num_ack_pending)",
            ratio(killed["redelivered"], killed["ack_pending_after_kill"]),
            "<= held <= max_ack_pending; order kept, nothing lost",
            _kill_met(killed),
        )
    )
    r = ratio(tput[K], tput[1])
    res.rows.append(
        Row(
            f"throughput, 1,000 keys, 10 ms work, K={K}",
            tput[K],
            "msg/s",
            tput[1],
            "K=1",
            r,
            f">= 0.9 x K = {0.9 * K:.1f}",
            r is not None and r >= 0.9 * K,
        )
    )
    res.details = {
        "work_s": WORK,
        "others": OTHERS,
        "default_max_ack_pending": FAIR_WINDOW,
        "old_window": OLD_WINDOW,
        "fairness_s": {f"burst{b}_{'stored' if st else 'live'}_{lp}": _summary(r) for (b, st, lp), r in fair.items()},
        "fairness_window_fixed_s": _summary(old),
        "paced_s": {
            f"k{k}": _summary(v) | {"burst": size.p6_burst, "others": size.p6_others} for k, v in paced.items()
        },
        "sigkill": killed | {"burst": size.p6_big_burst, "work_s": KILL_WORK},
        "throughput_msgs_per_s": {f"k{k}": v for k, v in tput.items()},
    }
    return res


def _kill_met(k: dict) -> bool:
    return (
        k["lost"] == 0
        and k["out_of_order"] == 0
        and k["overlapping"] == 0
        and k["redelivered"] <= k["ack_pending_after_kill"] <= k["max_ack_pending"]
    )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _summary(r: dict) -> dict:
    lat = r["latencies"]
    return {
        "p50": pct(lat, 50),
        "p99": pct(lat, 99),
        "max": max(lat, default=None),
        "acked": len(lat),
        "burst_messages_acked": r["acked_a"],
    }

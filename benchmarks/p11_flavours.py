"""P11: the strict path without work, static vs elastic, side by side (the setting of the comparison with the Go
reference cg): 8 partitions, 4 members, each ``cg <flavour> consume --sleep 0ms`` a process of its own (stdout a
pipe, drained; cg's consumer template: max_ack_pending 1, AckWait 2 s), 1,600 stored messages, rounds
alternating between the flavours (3 each).

The members start on an empty group; once all four consumers exist they are paused (the server's consumer
pause), the messages are published (for an elastic group, sourced into its work queue) and all four consumers
are resumed at once, so the members start working together and every message is stored before the first is
delivered. The time is read from the wire: from the first ``+ACK`` of any member to the last (``seconds``), and
the throughput is the messages over it; the members' CPU time per message (``/proc``) is steadier on a shared
machine."""

from __future__ import annotations

import asyncio
import json
import statistics
import time

from nats.js.api import StreamConfig

from pcgroups import PartitioningFilter, add_members, create_elastic, create_static, work_queue_name

from .common import (
    Result,
    Row,
    Size,
    cpu_seconds,
    keys_by_partition,
    publish_all,
    ratio,
    round_robin_subjects,
    server_and_connection,
    static_stream,
    wait_until,
)
from .p7_consume import MEMBERS, PARTITIONS, Acks, Side, cg_processes
from .procs import stop_all

MESSAGES = 1600
FLAVOURS = ("static", "elastic")


async def _pause(nc, stream: str, consumer: str, until: str | None) -> None:
    """Pause ``consumer`` until ``until`` (RFC 3339), or resume it (None)."""
    body = {"pause_until": until} if until else {}
    reply = await nc.request(f"$JS.API.CONSUMER.PAUSE.{stream}.{consumer}", json.dumps(body).encode(), timeout=5)
    answer = json.loads(reply.data)
    if "error" in answer:
        raise RuntimeError(f"pausing {stream} > {consumer}: {answer['error']}")


async def _group(nc, flavour: str, stream: str) -> str:
    """A fresh group ``g`` of ``flavour`` over ``stream`` (8 partitions, 4 members); the stream its consumers read."""
    js = nc.jetstream()
    if flavour == "static":
        await static_stream(js, stream, PARTITIONS)
        await create_static(nc, stream, "g", PARTITIONS, members=MEMBERS)
        return stream
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.*"]))
    await create_elastic(
        nc,
        stream,
        "g",
        PARTITIONS,
        partitioning_filters=[PartitioningFilter(f"{stream}.*", [1])],
        max_buffered_msgs=-1,
        max_buffered_bytes=-1,
    )
    await add_members(nc, stream, "g", MEMBERS)
    return work_queue_name(stream, "g")


async def one_round(url: str, nc, flavour: str, stream: str, messages: int) -> tuple[float, float]:
    """Seconds from the first ack to the last of ``messages`` stored messages, 4 members working together, and the
    members' CPU time per message meanwhile (µs; from their resume to the last ack)."""
    js = nc.jetstream()
    consumed = await _group(nc, flavour, stream)
    acks = Acks()
    sub = await acks.watch(nc, consumed)
    workers = await cg_processes(url, stream, "g", 0.0, Side("cg"), flavour=flavour)
    try:
        names: list[str] = []

        async def all_there() -> bool:
            names[:] = [c.name for c in await js.consumers_info(consumed)]
            return len(names) >= len(MEMBERS)

        deadline = time.monotonic() + 60
        while not await all_there():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{flavour}: {len(names)} member consumers after 60 s")
            await asyncio.sleep(0.05)
        for name in names:
            await _pause(nc, consumed, name, "2099-01-01T00:00:00Z")
        await publish_all(nc, round_robin_subjects(stream, keys_by_partition(f"{stream}.*", PARTITIONS, 20), messages))
        deadline = time.monotonic() + 30
        while (await js.stream_info(consumed)).state.messages < messages:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{flavour}: the messages never all reached {consumed}")
            await asyncio.sleep(0.02)
        cpu0 = sum(cpu_seconds(w.pid) or 0.0 for w in workers)
        for name in names:
            await _pause(nc, consumed, name, None)
        await wait_until(lambda: sum(map(len, acks.stamps.values())) >= messages, 60, f"{flavour}: every ack")
        cpu = (sum(cpu_seconds(w.pid) or 0.0 for w in workers) - cpu0) * 1e6 / messages
    finally:
        await stop_all(workers)
        await sub.unsubscribe()
    stamps = [t for v in acks.stamps.values() for t in v]
    return max(stamps) - min(stamps), cpu


async def measure(runs: int, messages: int = MESSAGES) -> dict[str, list[tuple[float, float]]]:
    """Per flavour, (seconds, CPU µs per message) of each run; the flavours alternate."""
    got: dict[str, list[tuple[float, float]]] = {f: [] for f in FLAVOURS}
    async with server_and_connection() as (server, nc):
        for r in range(runs):
            for flavour in FLAVOURS:
                got[flavour].append(await one_round(server.url, nc, flavour, f"P11{flavour.upper()}{r}", messages))
    return got


async def run(size: Size) -> Result:
    res = Result("P11", "the strict path without work: cg static consume vs cg elastic consume, 4 members")
    got = await measure(size.p11_runs)
    seconds = {f: [s for s, _ in v] for f, v in got.items()}
    cpu = {f: statistics.median(c for _, c in v) for f, v in got.items()}
    rate = {f: [MESSAGES / s for s in v] for f, v in seconds.items()}
    med = {f: statistics.median(v) for f, v in rate.items()}
    runs = size.p11_runs
    res.rows.append(
        Row(
            f"static: {MESSAGES:,} stored messages, 8 partitions, 4 members, no work (median of {runs})",
            med["static"],
            "msg/s",
            med["elastic"],
            "elastic, same run",
            ratio(med["static"], med["elastic"]),
            ">= 1 (the elastic figure)",
            med["static"] >= med["elastic"],
        )
    )
    res.rows.append(
        Row(
            f"static: members' CPU per message (median of {runs}; lower is better)",
            cpu["static"],
            "us",
            cpu["elastic"],
            "elastic, same run",
            ratio(cpu["static"], cpu["elastic"]),
        )
    )
    for f in FLAVOURS:
        res.rows.append(
            Row(
                f"{f}: seconds, first ack to last (range of {runs})",
                min(seconds[f]),
                "s",
                max(seconds[f]),
                "slowest run",
                ratio(max(seconds[f]), min(seconds[f])),
            )
        )
    res.details = {
        "seconds": seconds,
        "msgs_per_s": rate,
        "cpu_us_per_msg": {f: [c for _, c in v] for f, v in got.items()},
        "messages": MESSAGES,
        "members": len(MEMBERS),
        "partitions": PARTITIONS,
    }
    return res


if __name__ == "__main__":
    import sys

    for flavour, runs in asyncio.run(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 3)).items():
        print(f"{flavour:8} " + "  ".join(f"{s:.3f} s ({MESSAGES / s:,.0f} msg/s, {c:.0f} us CPU)" for s, c in runs))

"""P4: elastic membership changes under load. 4 partitions, members m1 m2 m3 (m1 owns 0 and 3), a
publisher at 200 msg/s spread evenly, max_ack_pending 1, AckWait 2 s, 1 ms of work; then ``add m4``
(partition 3 moves m1 -> m4) and ``drop m4`` (it moves back), each after a steady window.

- unchanged members (m2: partition 1, m3: partition 2): the delay of their messages (publish -> handler
  start) in the window after each change vs the steady window before it; target: no extra delay
  (reported as the difference of the maxima, met within 50 ms of scheduling noise);
- moved partition: the time from the membership change to its first message at the new owner
  (target <= 1 s), and the longest pause of that partition."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass

from nats.js.api import StreamConfig

from pcgroups import ConsumerConfig, PartitioningFilter, add_members, create_elastic, delete_members, elastic_consume

from .common import Result, Row, Size, connect, keys_by_partition, pct, ratio, server_and_connection, wait_until

STREAM = "P4"
PARTITIONS = 4
RATE = 200.0
WORK = 0.001
NOISE = 0.050
UNCHANGED = (1, 2)
MOVED = 3


@dataclass
class Start:
    t: float
    published: float
    partition: int
    member: str


async def publisher(js, keys: dict[int, list[str]], stop: asyncio.Event) -> None:
    i = 0
    next_at = time.monotonic()
    while not stop.is_set():
        p = i % PARTITIONS
        ks = keys[p]
        await js.publish(f"{STREAM}.k.{ks[(i // PARTITIONS) % len(ks)]}", repr(time.monotonic()).encode())
        i += 1
        next_at += 1 / RATE
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


def window(starts: list[Start], partitions, since: float, until: float) -> list[Start]:
    return [s for s in starts if s.partition in partitions and since <= s.t < until]


def max_delay(starts: list[Start]) -> float | None:
    return max((s.t - s.published for s in starts), default=None)


def longest_pause(starts: list[Start], partition: int, since: float, until: float) -> float | None:
    ts = sorted(s.t for s in starts if s.partition == partition and since <= s.t < until)
    gaps = [b - a for a, b in itertools.pairwise(ts)]
    return max(gaps, default=None)


async def run(size: Size) -> Result:
    res = Result("P4", "elastic add/drop under load: unchanged members' delay, moved partition hand-off")
    W = size.p4_window
    starts: list[Start] = []
    changes: list[dict] = []
    async with server_and_connection() as (server, nc):
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=STREAM, subjects=[f"{STREAM}.k.*"]))
        await create_elastic(
            nc, STREAM, "g", PARTITIONS, partitioning_filters=[PartitioningFilter(f"{STREAM}.k.*", [1])]
        )
        keys = keys_by_partition(f"{STREAM}.k.*", PARTITIONS, 10)
        conns = [await connect(server.url) for _ in range(4)]
        insts = []
        stop = asyncio.Event()
        pub = None

        def handler_for(member: str):
            async def handler(msg):
                starts.append(Start(time.monotonic(), float(msg.data), msg.partition, member))
                await asyncio.sleep(WORK)
                await msg.ack()

            return handler

        try:
            for i, c in enumerate(conns):
                m = f"m{i + 1}"
                insts.append(
                    await elastic_consume(
                        c, STREAM, "g", m, handler_for(m), config=ConsumerConfig(max_ack_pending=1, ack_wait=2)
                    )
                )
            await add_members(nc, STREAM, "g", ["m1", "m2", "m3"])
            for inst in insts[:3]:
                await inst.wait_for_consuming(10)
            pub = asyncio.create_task(publisher(js, keys, stop))
            await wait_until(
                lambda: {s.partition for s in starts} == set(range(PARTITIONS)), 15, "traffic on every partition"
            )
            for _ in range(size.p4_cycles):
                for op, new_owner in (("add", "m4"), ("drop", "m1")):
                    await asyncio.sleep(W)  # the steady window before the change
                    t = time.monotonic()
                    if op == "add":
                        await add_members(nc, STREAM, "g", ["m4"])
                    else:
                        await delete_members(nc, STREAM, "g", ["m4"])

                    def arrived(t=t, new_owner=new_owner):
                        return next(
                            (s.t for s in starts if s.t >= t and s.partition == MOVED and s.member == new_owner), None
                        )

                    await wait_until(lambda: arrived() is not None, 15, f"partition {MOVED} at {new_owner}")
                    handoff = arrived() - t
                    await asyncio.sleep(max(0.0, t + W - time.monotonic()))
                    changes.append({"op": op, "t": t, "handoff": handoff})
        finally:
            stop.set()
            if pub is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pub, 5)
            await asyncio.gather(*(asyncio.wait_for(i.stop(), 10) for i in insts), return_exceptions=True)
            for c in conns:
                await c.close()

    per_change = []
    for ch in changes:
        t = ch["t"]
        before = window(starts, UNCHANGED, t - W, t)
        after = window(starts, UNCHANGED, t, t + W)
        per_change.append(
            {
                "op": ch["op"],
                "handoff_s": ch["handoff"],
                "unchanged_max_delay_before_s": max_delay(before),
                "unchanged_max_delay_after_s": max_delay(after),
                "unchanged_p99_delay_before_s": pct([s.t - s.published for s in before], 99),
                "unchanged_p99_delay_after_s": pct([s.t - s.published for s in after], 99),
                "unchanged_longest_pause_before_s": max(longest_pause(starts, p, t - W, t) or 0 for p in UNCHANGED),
                "unchanged_longest_pause_after_s": max(longest_pause(starts, p, t, t + W) or 0 for p in UNCHANGED),
                "moved_longest_pause_s": longest_pause(starts, MOVED, t - 1, t + W),
                "kept_by_changed_member_longest_pause_s": longest_pause(starts, 0, t - 1, t + W),
                "messages_unchanged_after": len(after),
            }
        )
    res.details = {
        "rate": RATE,
        "work_s": WORK,
        "window_s": W,
        "changes": per_change,
        "handoff_p50_s": pct([c["handoff_s"] for c in per_change], 50),
        "messages": len(starts),
    }
    res.rows = rows(res.details)
    return res


def rows(details: dict) -> list[Row]:
    """The table rows from the recorded per-change figures: each change is compared with the steady
    window just before it, and the worst change is reported."""
    per_change = details["changes"]
    extras = [c["unchanged_max_delay_after_s"] - c["unchanged_max_delay_before_s"] for c in per_change]
    worst = max(range(len(per_change)), key=lambda i: extras[i])
    w = per_change[worst]
    extra = extras[worst]
    out = [
        Row(
            f"unchanged members' max message delay, worst of {len(per_change)} changes ({w['op']})",
            w["unchanged_max_delay_after_s"],
            "s",
            w["unchanged_max_delay_before_s"],
            "steady window before that change",
            ratio(w["unchanged_max_delay_after_s"], w["unchanged_max_delay_before_s"]),
            f"no extra delay ({extra * 1000:+.0f} ms; met within {NOISE * 1000:.0f} ms)",
            extra <= NOISE,
        )
    ]
    pauses = [c["unchanged_longest_pause_after_s"] - c["unchanged_longest_pause_before_s"] for c in per_change]
    p = per_change[max(range(len(per_change)), key=lambda i: pauses[i])]
    out.append(
        Row(
            "unchanged members' longest pause, worst change",
            p["unchanged_longest_pause_after_s"],
            "s",
            p["unchanged_longest_pause_before_s"],
            "steady window before that change",
            ratio(p["unchanged_longest_pause_after_s"], p["unchanged_longest_pause_before_s"]),
        )
    )
    handoffs = [c["handoff_s"] for c in per_change]
    expected_gap = PARTITIONS / details["rate"]
    out.append(
        Row(
            f"moved partition flowing again (change -> first message at new owner), max of {len(handoffs)}",
            max(handoffs),
            "s",
            expected_gap,
            "gap between its messages",
            ratio(max(handoffs), expected_gap),
            "<= 1 s",
            max(handoffs) <= 1.0,
        )
    )
    return out

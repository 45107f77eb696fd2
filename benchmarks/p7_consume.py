"""P7: per-message cost of ``cg static consume`` on the strict path (max_ack_pending 1, AckWait 2 s, the
two output lines into a pipe, a double ack) vs the leanest raw pinned pull loop nats-py allows
(``benchmarks.worker raw``: the same work and double ack), with 5 ms of work per message and with none.
As the comparison with the Go reference cg: 8 partitions, 4 members, a process each, on a stored backlog.

The raw loop prints nothing; a second baseline (``lines``) is the same loop printing cg's two lines per
message, as the Go cg does: on this machine writing them into a pipe (two writes, and the reader they
wake) costs about as much CPU as all of pcgroups' own per-message code.

The cost is read from the wire: this process subscribes to the stream's ack subjects and stamps every
ack (both sides are seen the same way, and neither prints anything for the benchmark). Per-message cost
= the window in which all four members were acking, times four, over the acks in it (each member's
start-up is left out: P8 measures start-up). Rounds alternate between the two sides; the best round of
each side is compared (the machine is shared)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from pcgroups import StaticConfig, create_static, static_member_filters
from pcgroups.instance import member_template, with_priority_group
from pcgroups.jsapi import ConsumerConfig, JetStreamApi

from .common import (Result, Row, Size, cpu_seconds, keys_by_partition, publish_all, ratio, round_robin_subjects,
                     server_and_connection, static_stream, wait_until)
from .procs import ROOT, Worker, stop_all

PARTITIONS = 8
MEMBERS = [f"m{i + 1}" for i in range(4)]
ASYNCIO = {"CG_EVENT_LOOP": "asyncio"}   # cg consume without uvloop (the extra), whether it is installed or not
ACK_WAIT = 2.0      # cg consume's consumer template (and the reference's): AckWait 2 s, max_ack_pending 1
WORK = 0.005
TARGET = 1.1


class Acks:
    """Every ack on ``$JS.ACK.<stream>.>``, stamped on arrival, per consumer."""

    def __init__(self) -> None:
        self.stamps: dict[str, list[float]] = defaultdict(list)

    async def watch(self, nc, stream: str):
        async def cb(msg) -> None:
            self.stamps[msg.subject.split(".", 4)[3]].append(time.monotonic())
        return await nc.subscribe(f"$JS.ACK.{stream}.>", cb=cb)

    def cost(self, consumers: list[str]) -> float | None:
        """Milliseconds per message per member while all of ``consumers`` were acking."""
        runs = [self.stamps.get(c) or [] for c in consumers]
        if not all(len(r) > 1 for r in runs):
            return None
        start, end = max(r[0] for r in runs), min(r[-1] for r in runs)
        inside = sum(1 for r in runs for t in r if start <= t <= end)
        return (end - start) * 1000 * len(runs) / inside if end > start and inside else None


class Drained(Worker):
    """A ``cg consume`` process whose stdout (a pipe, as in ``cg consume | ...``) is read in large chunks
    and thrown away: the reader costs the machine as little as it can."""

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while await self.proc.stdout.read(1 << 16):
            pass


@dataclass(frozen=True)
class Side:
    """What one round runs: ``raw`` (the raw loop), ``lines`` (the raw loop printing cg's lines) or ``cg``
    (``cg static consume`` with the code of ``root`` and the environment ``env`` adds)."""

    kind: str
    root: Path = ROOT
    env: dict[str, str] = field(default_factory=dict)


def default_sides() -> dict[str, Side]:
    """raw, lines, cg on asyncio's loop and, when uvloop is installed, cg on uvloop."""
    sides = {"raw": Side("raw"), "lines": Side("lines"), "cg": Side("cg", env=ASYNCIO)}
    if importlib.util.find_spec("uvloop") is not None:
        sides["uvloop"] = Side("cg")
    return sides


async def cg_processes(url: str, stream: str, group: str, work: float, side: Side,
                       members: list[str] = MEMBERS, flavour: str = "static") -> list[Worker]:
    """``cg <flavour> consume`` per member, stdout a pipe, the code and environment of ``side``."""
    root = side.root
    env = dict(os.environ, PYTHONPATH=str(root), NO_COLOR="1", **side.env)
    workers: list[Worker] = []
    for member in members:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cg.main", "-s", url, flavour, "consume", stream, group, member,
            "--sleep", f"{work * 1000:g}ms", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            cwd=str(root), env=env, start_new_session=True)
        workers.append(Drained(proc, member))
    return workers


async def raw_processes(url: str, api: JetStreamApi, stream: str, group: str, work: float, *,
                        lines: bool, members: list[str] = MEMBERS) -> list[Worker]:
    """A member consumer each (the filters and priority group cg's would have), then a raw loop on it;
    ``lines``: the loop also prints cg consume's two parts per message (stdout drained as cg's is)."""
    template = member_template(ConsumerConfig(max_ack_pending=1, ack_wait=ACK_WAIT, ack_policy="explicit"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    workers: list[Worker] = []
    for member in members:
        filters = static_member_filters(StaticConfig(max_members=PARTITIONS, members=list(members)), member)
        cfg = with_priority_group(template, filters)
        cfg.durable_name = f"{group}-{member}"
        await api.create_consumer(stream, cfg)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.worker", url, "raw", stream, cfg.durable_name, member, "--work",
            str(work), "--ack-wait", str(ACK_WAIT), *(["--lines"] if lines else []), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, cwd=str(ROOT), env=env, start_new_session=True)
        workers.append(Drained(proc, member))
    return workers


def cpu_per_message(workers: list[Worker], acks: Acks, consumers: list[str], since: tuple[float, int]) -> float:
    """Microseconds of the member processes' CPU per message acked since ``since`` (cpu, acks)."""
    cpu = sum(cpu_seconds(w.pid) or 0.0 for w in workers) - since[0]
    return cpu * 1e6 / max(sum(len(acks.stamps[c]) for c in consumers) - since[1], 1)


async def one_round(server_url: str, nc, api: JetStreamApi, side: Side, stream: str, group: str, work: float,
                    per_member: int, members: list[str] = MEMBERS) -> tuple[float | None, float]:
    """(ms per message per member while all members were acking, member CPU in µs per message meanwhile)."""
    acks = Acks()
    sub = await acks.watch(nc, stream)
    consumers = [f"{group}-{m}" for m in members]
    workers: list[Worker] = []
    try:
        if side.kind == "cg":
            await create_static(nc, stream, group, PARTITIONS, members=members)
            workers = await cg_processes(server_url, stream, group, work, side, members)
        else:
            workers = await raw_processes(server_url, api, stream, group, work, lines=side.kind == "lines",
                                          members=members)
        limit = 60 + per_member * (work + 0.005) * 3
        # the CPU is counted from when all four are at work until the first is nearly done
        await wait_until(lambda: all(len(acks.stamps[c]) >= per_member // 10 for c in consumers), limit,
                         f"{group}: every member at work")
        since = (sum(cpu_seconds(w.pid) or 0.0 for w in workers), sum(len(acks.stamps[c]) for c in consumers))
        await wait_until(lambda: any(len(acks.stamps[c]) >= per_member * 9 // 10 for c in consumers), limit,
                         f"{group}: a member nearly done")
        cpu = cpu_per_message(workers, acks, consumers, since)
        await wait_until(lambda: all(len(acks.stamps[c]) >= per_member for c in consumers), limit,
                         f"{group}: every member's share acked")
    finally:
        await stop_all(workers)
        await sub.unsubscribe()
    for c in consumers:
        await api.delete_consumer(stream, c)
    return acks.cost(consumers), cpu


async def sleep_accuracy(asked: float, n: int = 200) -> float:
    """Median seconds ``cg consume --sleep`` sleeps when ``asked``."""
    from cg.consume import precise_sleep
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        await precise_sleep(asked)
        took.append(time.perf_counter() - t0)
    return sorted(took)[n // 2]


Samples = dict[str, dict[str, list[tuple[float | None, float]]]]


async def measure(size: Size, sides: dict[str, Side] | None = None) -> Samples:
    """Rounds alternating over the sides (default: :func:`default_sides`), for both works: per work and
    side, (ms per message, CPU µs per message) per round."""
    sides = sides or default_sides()
    samples: Samples = {}
    async with server_and_connection() as (server, nc):
        js = nc.jetstream()
        api = JetStreamApi(nc)
        streams = {}
        for label, work, count in (("work", WORK, size.p7_work_messages), ("none", 0.0, size.p7_idle_messages)):
            stream = f"P7{label.upper()}"
            await static_stream(js, stream, PARTITIONS)
            keys = keys_by_partition(f"{stream}.*", PARTITIONS, 20)
            await publish_all(nc, round_robin_subjects(stream, keys, count))
            streams[label] = (stream, work, count // len(MEMBERS))
        for r in range(size.p7_rounds):
            for label, (stream, work, per_member) in streams.items():
                for name, side in sides.items():
                    got = await one_round(server.url, nc, api, side, stream, f"{name}{r}", work, per_member)
                    samples.setdefault(label, {}).setdefault(name, []).append(got)
    return samples


def best(rounds: list[tuple[float | None, float]], which: int = 0) -> float | None:
    known = [r[which] for r in rounds if r[which] is not None]
    return min(known) if known else None


def median(rounds: list[tuple[float | None, float]], which: int = 0) -> float | None:
    known = [r[which] for r in rounds if r[which] is not None]
    return statistics.median(known) if known else None


async def run(size: Size) -> Result:
    res = Result("P7", "per-message cost: cg static consume vs the raw pinned pull loop (4 members, a process each)")
    samples = await measure(size)
    works = (("work", "5 ms of work"), ("none", "no work (a stored backlog)"))
    for label, what in works:
        cg, raw = best(samples[label]["cg"]), best(samples[label]["raw"])
        r = ratio(cg, raw)
        res.rows.append(Row(f"time per message, {what}", cg, "ms", raw, "raw pinned loop, same work and double ack", r,
                            f"<= {TARGET}", r is not None and r <= TARGET))
        lines = best(samples[label]["lines"])
        res.rows.append(Row("same, vs the raw loop printing the same two lines", cg, "ms", lines,
                            "raw loop + cg's lines", ratio(cg, lines), "", None))
    none = samples["none"]
    cpu = {side: median(none[side], 1) for side in none}
    for side, what in (("raw", "raw pinned loop"), ("lines", "raw loop + cg's lines")):
        res.rows.append(Row(f"member CPU per message, no work (median; lower is better), vs {what}", cpu["cg"], "us",
                            cpu[side], what, ratio(cpu["cg"], cpu[side]), "", None))
    if "uvloop" in none:
        for label, what in works:
            uv, raw = best(samples[label]["uvloop"]), best(samples[label]["raw"])
            res.rows.append(Row(f"with the uvloop extra: time per message, {what}", uv, "ms", raw,
                                "raw pinned loop", ratio(uv, raw), "", None))
        res.rows.append(Row("with the uvloop extra: member CPU per message, no work (median)", cpu["uvloop"], "us",
                            cpu["raw"], "raw pinned loop", ratio(cpu["uvloop"], cpu["raw"]), "", None))
    slept = await sleep_accuracy(WORK) * 1000
    res.rows.append(Row("`--sleep 5ms` sleeps (median)", slept, "ms", WORK * 1000, "asked", ratio(slept, WORK * 1000),
                        "", None))
    res.details = {"rounds_ms_and_cpu_us": samples, "cpu_us_median_no_work": cpu, "work_s": WORK,
                   "members": len(MEMBERS), "partitions": PARTITIONS,
                   "messages": {"work": size.p7_work_messages, "none": size.p7_idle_messages},
                   "sleep_5ms_median_ms": slept}
    return res


def main() -> None:
    """``python -m benchmarks.p7_consume [--rounds N] [LABEL=PATH ...]``: P7's rounds, with ``cg`` also taken
    from each checkout given (e.g. the code before a change: ``before=/tmp/old``, on asyncio's loop)."""
    import argparse

    from .common import QUICK

    p = argparse.ArgumentParser(prog="python -m benchmarks.p7_consume")
    p.add_argument("--rounds", type=int, default=QUICK.p7_rounds)
    p.add_argument("checkouts", nargs="*", metavar="LABEL=PATH")
    a = p.parse_args()
    sides = default_sides()
    for label, path in (c.split("=", 1) for c in a.checkouts):
        sides[label] = Side("cg", Path(path).resolve(), ASYNCIO)
    samples = asyncio.run(measure(replace(QUICK, p7_rounds=a.rounds), sides))
    for label, by_side in samples.items():
        for name, rounds in by_side.items():
            ms = [v for v, _ in rounds if v is not None]
            print(f"{label:5} {name:8} best {min(ms):.3f} ms  median {statistics.median(ms):.3f} ms  "
                  f"CPU/msg median {median(rounds, 1):.0f} us  rounds {' '.join(f'{v:.3f}' for v in ms)}")


if __name__ == "__main__":
    main()

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
each side is compared (the machine is shared).

Without work, the rounds also run ``cg elastic consume`` (``elastic``): an elastic group of the same shape
(8 partitions, 4 members, a process each) over a plain stream holding the same keys, timed the same way on
its work queue's acks, on the event loop ``cg consume`` picks (uvloop when installed). It is compared with
``cg static consume`` on the same loop, round by round (the two run one after the other, the order turned
round every round; the Go reference's static path is faster than its elastic one), and the nats-server's
CPU per message is counted beside the members' for both flavours.

``python -m benchmarks.p7_consume --otel`` adds a side ``otel``: ``cg static consume --otel`` exporting its
spans over OTLP/HTTP to a sink in a process of its own (it answers every export and keeps nothing), on
a backlog whose messages all carry a producer's ``traceparent`` (every side reads the same backlog),
and prints what the span wrapper costs per call in-process (:func:`wrapper_cost`)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nats.js.api import StreamConfig

from pcgroups import (
    PartitioningFilter,
    StaticConfig,
    add_members,
    create_elastic,
    create_static,
    delete_elastic,
    static_member_filters,
)
from pcgroups.consume._instance import member_template, with_priority_group
from pcgroups.jetstream._api import ConsumerConfig, JetStreamApi

from .common import (
    Result,
    Row,
    Size,
    cpu_seconds,
    keys_by_partition,
    process_cpu_seconds,
    publish_all,
    ratio,
    round_robin_subjects,
    server_and_connection,
    static_stream,
    wait_until,
)
from .procs import ROOT, Worker, stop_all

PARTITIONS = 8
MEMBERS = [f"m{i + 1}" for i in range(4)]
ASYNCIO = {"CG_EVENT_LOOP": "asyncio"}  # cg consume without uvloop (the extra), whether it is installed or not
ACK_WAIT = 2.0  # cg consume's consumer template (and the reference's): AckWait 2 s, max_ack_pending 1
WORK = 0.005
TARGET = 1.1
ELASTIC_TARGET = 1.0  # static no slower than elastic, per message (Go's static path is the faster one)


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

    def span(self, consumers: list[str]) -> float | None:
        """Seconds from the first ack of any of ``consumers`` to the last (their start-up spread included)."""
        runs = [r for c in consumers if (r := self.stamps.get(c))]
        return max(r[-1] for r in runs) - min(r[0] for r in runs) if runs else None


class Drained(Worker):
    """A ``cg consume`` process whose stdout (a pipe, as in ``cg consume | ...``) is read in large chunks
    and thrown away: the reader costs the machine as little as it can."""

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while await self.proc.stdout.read(1 << 16):
            pass


@dataclass(frozen=True)
class Side:
    """What one round runs: ``raw`` (the raw loop), ``lines`` (the raw loop printing cg's lines), ``cg``
    (``cg static consume`` with the code of ``root`` and the environment ``env`` adds) or ``elastic`` (``cg
    elastic consume`` likewise, on an elastic group)."""

    kind: str
    root: Path = ROOT
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()  # more options of cg static consume
    python: str = ""  # the interpreter cg runs on ("": this one)

    @property
    def flavour(self) -> str:
        """The flavour of group the round consumes (the raw loops: a static group's consumers)."""
        return "elastic" if self.kind == "elastic" else "static"


def default_sides() -> dict[str, Side]:
    """raw, lines, cg on asyncio's loop and, when uvloop is installed, cg on uvloop; then elastic on the loop cg
    consume picks (uvloop when installed), right after the static side on that loop (:func:`static_twin`)."""
    sides = {"raw": Side("raw"), "lines": Side("lines"), "cg": Side("cg", env=ASYNCIO)}
    if importlib.util.find_spec("uvloop") is not None:
        sides["uvloop"] = Side("cg")
    sides["elastic"] = Side("elastic")
    return sides


def static_twin(sides: Mapping[str, object]) -> str:
    """The static side on the elastic side's event loop: ``uvloop`` when it ran, else ``cg``."""
    return "uvloop" if "uvloop" in sides else "cg"


def elastic_origin(stream: str) -> str:
    """The plain stream an elastic round's group consumes, beside the static round's ``stream``."""
    return f"{stream}_E"


async def backlog(nc, stream: str, flavour: str, count: int, headers: dict[str, str] | None = None) -> None:
    """``stream`` with ``count`` messages (with ``headers``) over 20 keys a partition, cycling over the partitions:
    for a static group (stored as ``<p>.<key>``) or for an elastic one (a plain stream; its work queue adds the
    partition)."""
    js = nc.jetstream()
    if flavour == "static":
        await static_stream(js, stream, PARTITIONS)
    else:
        await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.*"]))
    await publish_all(
        nc, round_robin_subjects(stream, keys_by_partition(f"{stream}.*", PARTITIONS, 20), count), headers=headers
    )


async def sourced(api: JetStreamApi, work_queue: str, count: int, timeout: float = 60.0) -> None:
    """Wait until ``work_queue`` holds ``count`` messages: the members start on the whole backlog, as static
    members do, not while the server still copies it."""
    deadline = time.monotonic() + timeout
    while (await api.stream_info(work_queue))["state"]["messages"] < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{work_queue}: {count} messages not sourced after {timeout:.0f}s")
        await asyncio.sleep(0.05)


async def cg_processes(
    url: str, stream: str, group: str, work: float, side: Side, members: list[str] = MEMBERS, flavour: str | None = None
) -> list[Worker]:
    """``cg <flavour> consume`` per member (default: the side's), stdout a pipe, the code and environment of
    ``side``."""
    root = side.root
    env = dict(os.environ, PYTHONPATH=str(root), NO_COLOR="1", **side.env)
    workers: list[Worker] = []
    for member in members:
        proc = await asyncio.create_subprocess_exec(
            side.python or sys.executable,
            "-m",
            "cg.main",
            "-s",
            url,
            flavour or side.flavour,
            "consume",
            stream,
            group,
            member,
            "--sleep",
            f"{work * 1000:g}ms",
            *side.args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            cwd=str(root),
            env=env,
            start_new_session=True,
        )
        workers.append(Drained(proc, member))
    return workers


async def raw_processes(
    url: str, api: JetStreamApi, stream: str, group: str, work: float, *, lines: bool, members: list[str] = MEMBERS
) -> list[Worker]:
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
            sys.executable,
            "-m",
            "benchmarks.worker",
            url,
            "raw",
            stream,
            cfg.durable_name,
            member,
            "--work",
            str(work),
            "--ack-wait",
            str(ACK_WAIT),
            *(["--lines"] if lines else []),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            cwd=str(ROOT),
            env=env,
            start_new_session=True,
        )
        workers.append(Drained(proc, member))
    return workers


# ms per message, member CPU µs and server CPU µs per message, seconds from the first ack to the last
Round = tuple[float | None, float, float | None, float | None]


class CpuMeter:
    """CPU seconds of the member processes and of the nats-server (when its pid is known), against acks."""

    def __init__(self, workers: list[Worker], server_pid: int | None, acks: Acks, consumers: list[str]):
        self.workers, self.server_pid, self.acks, self.consumers = workers, server_pid, acks, consumers
        self.since = self.read()

    def read(self) -> tuple[float, float, int]:
        server = process_cpu_seconds(self.server_pid) if self.server_pid is not None else None
        return (
            sum(cpu_seconds(w.pid) or 0.0 for w in self.workers),
            server or 0.0,
            sum(len(self.acks.stamps[c]) for c in self.consumers),
        )

    def per_message(self) -> tuple[float, float | None]:
        """Microseconds of the members' CPU, and of the server's, per message acked since the meter started."""
        members, server, acked = self.read()
        n = max(acked - self.since[2], 1)
        return (
            (members - self.since[0]) * 1e6 / n,
            (server - self.since[1]) * 1e6 / n if self.server_pid is not None else None,
        )


async def one_round(
    server_url: str,
    nc,
    api: JetStreamApi,
    side: Side,
    stream: str,
    group: str,
    work: float,
    per_member: int,
    members: list[str] = MEMBERS,
    server_pid: int | None = None,
) -> Round:
    """(ms per message per member while all members were acking, member CPU in µs per message meanwhile, the
    server's CPU in µs per message meanwhile when ``server_pid`` is given, seconds from the first ack to the
    last). ``stream``: the static group's stream, or an elastic side's plain stream."""
    acks = Acks()
    elastic = side.kind == "elastic"
    sub = await acks.watch(nc, f"{stream}-{group}" if elastic else stream)  # elastic: its work queue's acks
    consumers = list(members) if elastic else [f"{group}-{m}" for m in members]
    workers: list[Worker] = []
    try:
        if elastic:
            await create_elastic(
                nc, stream, group, PARTITIONS, partitioning_filters=[PartitioningFilter(f"{stream}.*", [1])]
            )
            await add_members(nc, stream, group, members)
            await sourced(api, f"{stream}-{group}", per_member * len(members))
            workers = await cg_processes(server_url, stream, group, work, side, members)
        elif side.kind == "cg":
            await create_static(nc, stream, group, PARTITIONS, members=members)
            workers = await cg_processes(server_url, stream, group, work, side, members)
        else:
            workers = await raw_processes(
                server_url, api, stream, group, work, lines=side.kind == "lines", members=members
            )
        limit = 60 + per_member * (work + 0.005) * 3
        # the CPU is counted from when all four are at work until the first is nearly done
        await wait_until(
            lambda: all(len(acks.stamps[c]) >= per_member // 10 for c in consumers),
            limit,
            f"{group}: every member at work",
        )
        meter = CpuMeter(workers, server_pid, acks, consumers)
        await wait_until(
            lambda: any(len(acks.stamps[c]) >= per_member * 9 // 10 for c in consumers),
            limit,
            f"{group}: a member nearly done",
        )
        cpu, server_cpu = meter.per_message()
        await wait_until(
            lambda: all(len(acks.stamps[c]) >= per_member for c in consumers),
            limit,
            f"{group}: every member's share acked",
        )
    finally:
        await stop_all(workers)
        await sub.unsubscribe()
    if elastic:
        await delete_elastic(nc, stream, group)
    else:
        for c in consumers:
            await api.delete_consumer(stream, c)
    return acks.cost(consumers), cpu, server_cpu, acks.span(consumers)


async def sleep_accuracy(asked: float, n: int = 200) -> float:
    """Median seconds ``cg consume --sleep`` sleeps when ``asked``."""
    from cg.consume import precise_sleep

    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        await precise_sleep(asked)
        took.append(time.perf_counter() - t0)
    return sorted(took)[n // 2]


Samples = dict[str, dict[str, list[Round]]]


def backlogs(size: Size, elastic: bool) -> list[tuple[str, float, int]]:
    """(label, work, messages) of each backlog: ``work`` (5 ms a message), ``none`` (no work, long enough for the
    four members to overlap) and, with an elastic side, ``short``: the Go comparison's 1,600 messages without
    work, for the static and elastic sides only."""
    out = [("work", WORK, size.p7_work_messages), ("none", 0.0, size.p7_idle_messages)]
    return [*out, ("short", 0.0, size.p7_work_messages)] if elastic else out


def runs_on(label: str, name: str, side: Side, sides: Mapping[str, Side]) -> bool:
    """Whether side ``name`` runs on backlog ``label``: elastic without work only, ``short`` static vs elastic."""
    if label == "short":
        return side.kind == "elastic" or name == static_twin(sides)
    return side.kind != "elastic" or label == "none"


async def measure(size: Size, sides: dict[str, Side] | None = None, headers: dict[str, str] | None = None) -> Samples:
    """Rounds alternating over the sides (default: :func:`default_sides`) and the backlogs (:func:`backlogs`), of
    messages with ``headers``: per backlog and side, a :data:`Round` per round."""
    sides = default_sides() if sides is None else sides
    samples: Samples = {}
    elastic = any(side.kind == "elastic" for side in sides.values())
    async with server_and_connection() as (server, nc):
        api = JetStreamApi(nc)
        streams = {}
        for label, work, count in backlogs(size, elastic):
            stream = f"P7{label.upper()}"
            await backlog(nc, stream, "static", count, headers)
            if elastic and work == 0:
                await backlog(nc, elastic_origin(stream), "elastic", count, headers)
            streams[label] = (stream, work, count // len(MEMBERS))
        for r in range(size.p7_rounds):
            order = list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]  # a load drift hits both ends
            for label, (stream, work, per_member) in streams.items():
                for name, side in order:
                    if not runs_on(label, name, side, sides):
                        continue
                    where = elastic_origin(stream) if side.kind == "elastic" else stream
                    got = await one_round(
                        server.url,
                        nc,
                        api,
                        side,
                        where,
                        f"{name}{r}",
                        work,
                        per_member,
                        server_pid=server.proc.pid if server.proc else None,
                    )
                    samples.setdefault(label, {}).setdefault(name, []).append(got)
    return samples


def best(rounds: list[Round], which: int = 0) -> float | None:
    known = [v for r in rounds if (v := r[which]) is not None]
    return min(known) if known else None


def median(rounds: list[Round], which: int = 0) -> float | None:
    known = [v for r in rounds if (v := r[which]) is not None]
    return statistics.median(known) if known else None


async def run(size: Size) -> Result:
    res = Result("P7", "per-message cost: cg static consume vs the raw pinned pull loop (4 members, a process each)")
    samples = await measure(size)
    works = (("work", "5 ms of work"), ("none", "no work (a stored backlog)"))
    for label, what in works:
        cg, raw = best(samples[label]["cg"]), best(samples[label]["raw"])
        r = ratio(cg, raw)
        res.rows.append(
            Row(
                f"time per message, {what}",
                cg,
                "ms",
                raw,
                "raw pinned loop, same work and double ack",
                r,
                f"<= {TARGET}",
                r is not None and r <= TARGET,
            )
        )
        lines = best(samples[label]["lines"])
        res.rows.append(
            Row(
                "same, vs the raw loop printing the same two lines",
                cg,
                "ms",
                lines,
                "raw loop + cg's lines",
                ratio(cg, lines),
                "",
                None,
            )
        )
    none = samples["none"]
    cpu = {side: median(none[side], 1) for side in none}
    for side, what in (("raw", "raw pinned loop"), ("lines", "raw loop + cg's lines")):
        res.rows.append(
            Row(
                f"member CPU per message, no work (median; lower is better), vs {what}",
                cpu["cg"],
                "us",
                cpu[side],
                what,
                ratio(cpu["cg"], cpu[side]),
                "",
                None,
            )
        )
    if "uvloop" in none:
        for label, what in works:
            uv, raw = best(samples[label]["uvloop"]), best(samples[label]["raw"])
            res.rows.append(
                Row(
                    f"with the uvloop extra: time per message, {what}",
                    uv,
                    "ms",
                    raw,
                    "raw pinned loop",
                    ratio(uv, raw),
                    "",
                    None,
                )
            )
        res.rows.append(
            Row(
                "with the uvloop extra: member CPU per message, no work (median)",
                cpu["uvloop"],
                "us",
                cpu["raw"],
                "raw pinned loop",
                ratio(cpu["uvloop"], cpu["raw"]),
                "",
                None,
            )
        )
    res.rows.extend(static_vs_elastic(none, samples.get("short", {})))
    res.rows.append(
        Row(
            "against the Go reference cg (strict order, 8 partitions, 4 members, 1,600 messages, static and "
            "elastic): not measured here (no Go reference cg on this machine; the raw loop above is the floor)",
            None,
            "",
            target=">= 1.0 with 5 ms of work, >= 0.9 without",
        )
    )
    slept = await sleep_accuracy(WORK) * 1000
    res.rows.append(
        Row("`--sleep 5ms` sleeps (median)", slept, "ms", WORK * 1000, "asked", ratio(slept, WORK * 1000), "", None)
    )
    res.details = {
        "rounds_ms_cpu_us_server_cpu_us_span_s": samples,
        "cpu_us_median_no_work": cpu,
        "work_s": WORK,
        "members": len(MEMBERS),
        "partitions": PARTITIONS,
        "messages": {"work": size.p7_work_messages, "none": size.p7_idle_messages, "short": size.p7_work_messages},
        "sleep_5ms_median_ms": slept,
    }
    return res


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"  # every message's producer


def otlp_sink() -> tuple[str, Any]:
    """An OTLP/HTTP endpoint in a process of its own (``--sink``: its CPU is nobody's being measured);
    the endpoint and the process."""
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.p7_consume", "--sink"], stdout=subprocess.PIPE, text=True, cwd=str(ROOT)
    )
    assert proc.stdout is not None
    return proc.stdout.readline().strip(), proc


def serve_sink() -> None:
    """``--sink``: answer every OTLP/HTTP export with success, keep nothing; print the endpoint."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Sink(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    server.daemon_threads = True
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


def wrapper_cost(endpoint: str, n: int = 20_000) -> dict[str, float]:
    """Microseconds of this process's CPU per call of an empty sync handler: as it is, wrapped by
    pcgroups.tracing with spans dropped (no exporter), with spans batched to an exporter that drops them,
    and batched to OTLP/HTTP at ``endpoint`` (the batch thread's CPU included, as the process pays it)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from pcgroups.tracing import Tracing

    class Drop(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            return SpanExportResult.SUCCESS

    @dataclass(eq=False)
    class Message:
        subject: str = "orders.eu.42"
        partition: int = 3
        key: str | None = "orders.eu.42"
        naks: int = 0
        headers: dict[str, str] = field(default_factory=lambda: {"traceparent": TRACEPARENT, "Nats-Pin-Id": "x"})
        data: bytes = b"0123456789abcdef"
        deliveries: int = 1
        stream_sequence: int = 1

    def handler(msg: object) -> None:
        return None

    providers = {
        "spans, no exporter": TracerProvider(shutdown_on_exit=False),
        "spans, batched, dropped": TracerProvider(shutdown_on_exit=False),
        "spans, batched, OTLP/HTTP": TracerProvider(shutdown_on_exit=False),
    }
    providers["spans, batched, dropped"].add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=2 * n))
    providers["spans, batched, OTLP/HTTP"].add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces"), max_queue_size=2 * n)
    )
    handlers = {
        "plain": handler,
        **{name: Tracing(p).instance("static", "P7", "g", "m1").wrap(handler) for name, p in providers.items()},
    }
    cost = {}
    for name, h in handlers.items():
        msgs = [Message(stream_sequence=i) for i in range(n)]
        t0 = time.process_time()
        for m in msgs:
            h(m)
        if name in providers:
            providers[name].force_flush()
        cost[name] = (time.process_time() - t0) * 1e6 / n
    for p in providers.values():
        p.shutdown()
    return cost


def paired(a: list[Round], b: list[Round], which: int = 0) -> list[float]:
    """Round by round, ``a``'s figure over ``b``'s (rounds where both have one)."""
    return [u / v for x, y in zip(a, b, strict=False) if (u := x[which]) is not None and (v := y[which])]


def static_vs_elastic(none: dict[str, list[Round]], short: dict[str, list[Round]]) -> list[Row]:
    """The rows comparing ``cg static consume`` with ``cg elastic consume`` without work, on the same event loop:
    time per message (the median of the rounds' ratios is the target: the two sides of a round share its load),
    the members' and the server's CPU per message (median), and the Go comparison's figure: 1,600 stored
    messages, seconds from the first ack to the last."""
    if "elastic" not in none or static_twin(none) not in none:
        return []
    static, elastic = none[static_twin(none)], none["elastic"]
    ratios = paired(static, elastic)
    r = statistics.median(ratios) if ratios else None
    loop = "uvloop" if static_twin(none) == "uvloop" else "asyncio"
    rows = [
        Row(
            f"no work: cg static vs cg elastic consume ({loop}), time per message, median of the rounds' ratios",
            median(static),
            "ms",
            median(elastic),
            "elastic, same shape, round by round",
            r,
            f"<= {ELASTIC_TARGET}",
            r is not None and r <= ELASTIC_TARGET,
        )
    ]
    for which, whose in ((1, "member"), (2, "nats-server")):
        a, b = median(static, which), median(elastic, which)
        rows.append(
            Row(
                f"no work: {whose} CPU per message (median), static vs elastic",
                a,
                "us",
                b,
                "elastic",
                ratio(a, b),
                "",
                None,
            )
        )
    a, b = median(short[static_twin(short)], 3), median(short["elastic"], 3)
    rows.append(
        Row(
            "1,600 stored messages, no work: first ack to last, 4 members (median; start-up spread "
            "included), static vs elastic",
            a,
            "s",
            b,
            "elastic",
            ratio(a, b),
            "",
            None,
        )
    )
    return rows


def main() -> None:
    """``python -m benchmarks.p7_consume [--rounds N] [--sides NAME,...] [--otel] [LABEL=PATH ...]``: P7's rounds,
    with ``cg`` also taken from each checkout given (e.g. the code before a change: ``before=/tmp/old``, on
    asyncio's loop; ``old:elastic=/tmp/old``: its ``cg elastic consume``, as side ``old``); ``--sides`` keeps only
    the sides named (e.g. ``uvloop,elastic``: static vs elastic on uvloop, without the raw loops); ``--otel``: and
    ``cg --otel`` (see the module doc)."""
    import argparse

    from .common import QUICK

    p = argparse.ArgumentParser(prog="python -m benchmarks.p7_consume")
    p.add_argument("--rounds", type=int, default=QUICK.p7_rounds)
    p.add_argument("--otel", action="store_true", help="also cg static consume --otel (spans over OTLP/HTTP)")
    p.add_argument("--sink", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sides", help="the sides to run, comma-separated (default: all)")
    p.add_argument("checkouts", nargs="*", metavar="LABEL=PATH")
    a = p.parse_args()
    if a.sink:
        serve_sink()
        return
    sides = default_sides()
    if a.sides:
        unknown = set(a.sides.split(",")) - set(sides)
        if unknown:
            p.error(f"unknown side(s) {', '.join(sorted(unknown))}: the sides are {', '.join(sides)}")
        sides = {name: side for name, side in sides.items() if name in a.sides.split(",")}
    for checkout in a.checkouts:
        label, eq, path = checkout.partition("=")
        name, _, flavour = label.partition(":")
        if not (eq and re.fullmatch(r"[\w-]+", name) and flavour in ("", "elastic") and Path(path).is_dir()):
            p.error(
                f"{checkout!r}: give LABEL=PATH or LABEL:elastic=PATH (LABEL: letters, digits, '-' and '_'; "
                "PATH: a checkout's folder)"
            )
        sides[name] = Side("elastic" if flavour else "cg", Path(path).resolve(), ASYNCIO)
    if not sides:
        p.error("no side to run")
    headers, sink = None, None
    if a.otel:
        endpoint, sink = otlp_sink()
        for name, us in wrapper_cost(endpoint).items():
            print(f"span wrapper, in-process: {name:26} {us:6.1f} us per call")
        otel = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
        sides["otel"] = Side("cg", env={**ASYNCIO, **otel}, args=("--otel",))
        headers = {"traceparent": TRACEPARENT}
    try:
        samples = asyncio.run(measure(replace(QUICK, p7_rounds=a.rounds), sides, headers))
    finally:
        if sink is not None:
            sink.kill()
            sink.wait()
    for label, by_side in samples.items():
        for name, rounds in by_side.items():
            ms = [r[0] for r in rounds if r[0] is not None]
            spans = " ".join(f"{r[3]:.3f}" for r in rounds if r[3] is not None)
            timed = (
                f"best {min(ms):.3f} ms  median {statistics.median(ms):.3f} ms  "
                if ms
                else "no overlap of the members to time  "
            )
            print(
                f"{label:5} {name:8} {timed}CPU/msg median {median(rounds, 1) or 0:.0f} us, server's "
                f"{median(rounds, 2) or 0:.0f} us  rounds {' '.join(f'{v:.3f}' for v in ms)}  first to last ack "
                f"{spans} s"
            )


if __name__ == "__main__":
    main()

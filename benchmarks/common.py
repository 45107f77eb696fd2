"""Shared pieces of the benchmarks: sizes, the result rows, an embedded server per scenario, fast
publishing, percentiles and small waiting helpers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import nats
from nats.js.api import StreamConfig, SubjectTransform

from pcgroups import partition_of_subject
from pcgroups.testing._server import EmbeddedServer


@dataclass
class Size:
    """Everything that differs between ``--quick`` and ``--full``."""

    name: str
    p1_messages: int
    p1_rounds: int
    p2_window: float
    p2_members: tuple[int, ...]
    p3_kills: int
    p3_stepdowns: int
    p4_cycles: int
    p4_window: float
    p5_messages: int
    p5_load_messages: int
    p6_burst: int
    p6_others: int
    p6_window: float
    p6_big_burst: int  # the larger burst of the fairness rows and the SIGKILL round
    p7_work_messages: int  # the backlog with 5 ms of work per message (the Go comparison's 1,600)
    p7_idle_messages: int  # the backlog without work (long enough for all four members to overlap)
    p7_rounds: int
    p10_window: float  # seconds each P10 rate is counted over
    p10_ceiling_backlog: int
    p10_rate: int  # msg/s of P10's steady publishing (the body rows)
    p11_runs: int
    p12_messages: int  # the backlog each concurrency case and interpreter reads (1,000 keys, no work)
    p12_rounds: int
    time_limit: float  # per scenario


QUICK = Size(
    "quick",
    p1_messages=20_000,
    p1_rounds=2,
    p2_window=2.0,
    p2_members=(1, 2, 4, 8),
    p3_kills=3,
    p3_stepdowns=3,
    p4_cycles=1,
    p4_window=2.0,
    p5_messages=20_000,
    p5_load_messages=10_000,
    p6_burst=200,
    p6_others=20,
    p6_window=2.0,
    p6_big_burst=2000,
    p7_work_messages=1600,
    p7_idle_messages=16_000,
    p7_rounds=2,
    p10_window=3.0,
    p10_ceiling_backlog=20_000,
    p10_rate=200,
    p11_runs=3,
    p12_messages=20_000,
    p12_rounds=2,
    time_limit=240.0,
)
FULL = Size(
    "full",
    p1_messages=100_000,
    p1_rounds=3,
    p2_window=5.0,
    p2_members=(1, 2, 4, 8),
    p3_kills=10,
    p3_stepdowns=10,
    p4_cycles=3,
    p4_window=3.0,
    p5_messages=100_000,
    p5_load_messages=50_000,
    p6_burst=1000,
    p6_others=50,
    p6_window=5.0,
    p6_big_burst=10_000,
    p7_work_messages=1600,
    p7_idle_messages=16_000,
    p7_rounds=5,
    p10_window=5.0,
    p10_ceiling_backlog=40_000,
    p10_rate=200,
    p11_runs=3,
    p12_messages=60_000,
    p12_rounds=3,
    time_limit=600.0,
)


@dataclass
class Row:
    """One line of the table: a pcgroups figure, its same-run baseline, their ratio and the target."""

    metric: str
    value: float | None
    unit: str
    baseline: float | None = None
    baseline_label: str = ""
    ratio: float | None = None
    target: str = ""  # human form, e.g. ">= 0.9" (about the ratio unless stated)
    met: bool | None = None  # None: informational, no target

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Result:
    id: str
    title: str
    rows: list[Row] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "rows": [r.as_dict() for r in self.rows],
            "details": self.details,
            "error": self.error,
            "seconds": round(self.seconds, 2),
        }


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def pct(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear interpolation; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


@contextlib.asynccontextmanager
async def server_and_connection(**connect_kw) -> AsyncIterator[tuple[EmbeddedServer, nats.NATS]]:
    """A fresh embedded nats-server (127.0.0.1, temp store) and one connection to it."""
    server = EmbeddedServer().start()
    nc = None
    try:
        nc = await connect(server.url, **connect_kw)
        yield server, nc
    finally:
        if nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 5)
        server.close()


async def connect(url: str, **kw) -> nats.NATS:
    kw.setdefault("connect_timeout", 5)
    kw.setdefault("max_reconnect_attempts", 5)
    return await nats.connect(url, **kw)


async def static_stream(js, stream: str, partitions: int) -> None:
    """A stream for a static group: subjects ``<stream>.<key>`` stored as ``<p>.<key>``, with the
    partition computed by the server from the key."""
    dest = "0.{{wildcard(1)}}" if partitions == 1 else f"{{{{partition({partitions},1)}}}}.{{{{wildcard(1)}}}}"
    await js.add_stream(
        StreamConfig(
            name=stream, subjects=[f"{stream}.*"], subject_transform=SubjectTransform(src=f"{stream}.*", dest=dest)
        )
    )


def keys_by_partition(filter_: str, partitions: int, per_partition: int) -> dict[int, list[str]]:
    """At least ``per_partition`` key tokens for each partition of ``<prefix>.*`` hashed on its wildcard."""
    out: dict[int, list[str]] = {p: [] for p in range(partitions)}
    i = 0
    while min(len(v) for v in out.values()) < per_partition:
        key = f"k{i}"
        out[partition_of_subject(filter_.replace("*", key), partitions, [1], filter_)].append(key)
        i += 1
    return out


def round_robin_subjects(prefix: str, keys: dict[int, list[str]], count: int) -> list[str]:
    """``count`` subjects cycling over the partitions (and over each partition's keys)."""
    parts = sorted(keys)
    out = []
    for i in range(count):
        ks = keys[parts[i % len(parts)]]
        out.append(f"{prefix}.{ks[(i // len(parts)) % len(ks)]}")
    return out


async def publish_all(
    nc,
    subjects: list[str] | Callable[[int], str],
    count: int | None = None,
    payload: Callable[[int], bytes] | bytes = b"0123456789abcdef",
    timeout: float = 120.0,
    headers: dict[str, str] | None = None,
) -> float:
    """Publish with acks, pipelined (``publish_async``), each message with ``headers``; returns the seconds
    it took until every ack."""
    js = nc.jetstream(publish_async_max_pending=8000)
    n = len(subjects) if count is None else count
    subject_of = subjects.__getitem__ if isinstance(subjects, list) else subjects
    data_of = payload if callable(payload) else (lambda i: payload)
    t0 = time.perf_counter()
    failed: list[BaseException] = []

    def check(fut: asyncio.Future) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            failed.append(fut.exception())

    for i in range(n):
        fut = await js.publish_async(subject_of(i), data_of(i), headers=headers)
        fut.add_done_callback(check)
    if n:
        await asyncio.wait_for(js.publish_async_completed(), timeout)
    if failed:
        raise RuntimeError(f"{len(failed)} publishes failed, first: {failed[0]!r}")
    return time.perf_counter() - t0


async def wait_until(cond: Callable[[], bool], timeout: float, what: str, step: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(step)


def cpu_seconds(pid: int) -> float | None:
    """CPU time a process has used so far, in seconds: its time on a CPU from ``/proc/PID/schedstat``
    (nanoseconds), else user + system time from ``/proc/PID/stat`` (clock ticks, 10 ms here)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    return process_cpu_seconds(pid)


def process_cpu_seconds(pid: int) -> float | None:
    """User + system time of every thread of a process (nats-server runs many) from ``/proc/PID/stat``, in
    seconds (clock ticks, 10 ms here: measure over seconds)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float | None:
    """Resident set size of a process in MiB (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_count() -> int:
    return os.cpu_count() or 1

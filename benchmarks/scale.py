"""Scale, measured (docs/SCALE.md): automatic membership under a crowd, and many groups on one server.

usage: python -m benchmarks.scale [--crowd 10,30,100] [--groups 100,300,1000] [--cluster] [--limit]
                                  [--json PATH] [--plot PNG] [-v]
       (scripts/scale runs it niced in the project's .venv; --plot needs the plot extra: matplotlib)

**Crowd** (``--crowd``): for each N, a fresh server and one elastic group of 1,024 partitions; N automatic
instances (``elastic_consume(..., auto=True)``, each with a connection and a member of its own, five per
process: benchmarks/scale_worker.py) all started at once. Measured until *every partition has exactly one
owner* (the group's config maps each partition to one live member, and the work queue's consumers are exactly
those members, each filtering exactly its mapped partitions): the seconds from the start, the compare-and-set
conflicts the instances met and the membership writes they made, the JetStream API requests per second the
server counted (its monitoring port's ``/jsz`` ``api.total``, less this harness's own), and the server's CPU.
Then 10 s of steady state (API requests, messages in and out, CPU), then half of the processes are stopped at
once (SIGTERM: each instance leaves as at Ctrl-C) and the same is measured until the rest own everything.

**Many groups** (``--groups``): one server, half the groups static (on one stream), half elastic (on another,
each with its work queue), two members each. At each size: the Prometheus exporter's refresh (seconds and
requests), ``cg ... ls`` and ``cg ... status`` as a user runs them (the CLI started each time), then one
instance of member m1 of every group (50 groups per process, one connection each): how long they take to
start, the consumers they hold on the config buckets' streams (their KV watches), the server's load with them
running, and how long a config change takes to reach its instance.

``--limit``: after the largest size, instances of static member m2 are started, 50 at a time, until the
server refuses one: where the first limit bites (the config bucket's consumers) and what ``cg`` says then.

``--cluster``: the same on a 3-node cluster (R3 streams and buckets) instead of one server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

import nats
from nats.js.api import StreamConfig, SubjectTransform

from pcgroups import (
    JetStreamApi,
    PartitioningFilter,
    add_members,
    create_elastic,
    create_static,
    delete_members,
    get_elastic_config,
    work_queue_name,
)
from pcgroups.errors import NotFoundError
from pcgroups.ops._exporter import GroupsExporter
from pcgroups.testing._cluster import EmbeddedCluster
from pcgroups.testing._server import EmbeddedServer, free_port

from .common import median
from .procs import ROOT, Worker, start_module

PARTITIONS = 1024
PER_PROCESS = 5  # automatic instances per worker process
GROUPS_PER_PROCESS = 50  # group instances per worker process
STEADY = 10.0  # seconds of steady state measured
POLL = 0.5  # seconds between two looks at the owners
LEASE_TTL = 5.0  # the automatic instances' lease TTL (the default): renewed every TTL/3


# ============================================================== the server(s) and what they count
class Site:
    """One server, or a 3-node cluster: its URL(s), its counters, the harness's connection and API."""

    def __init__(self, cluster: bool):
        self.cluster = cluster
        self.server: EmbeddedServer | None = None
        self.nodes: EmbeddedCluster | None = None
        self.monitor_ports: list[int] = []
        self.nc: Any = None
        self.api: Any = None
        self.mine = 0  # API requests this harness sent (left out of the server's counts)
        self.stale_reads = 0  # groups not found right after their create

    @property
    def replicas(self) -> int:
        return 3 if self.cluster else 1

    @property
    def url(self) -> str:
        return self.nodes.url if self.nodes is not None else self.server.url  # type: ignore[union-attr]

    async def __aenter__(self) -> Site:
        if self.cluster:
            self.nodes = await asyncio.to_thread(EmbeddedCluster(size=3).start)
            self.monitor_ports = [n.http_port for n in self.nodes.nodes]
        else:
            port = free_port()
            self.server = await asyncio.to_thread(EmbeddedServer(extra_args=["-m", str(port)]).start)
            self.monitor_ports = [port]
        self.nc = await nats.connect(servers=self.url.split(","), max_reconnect_attempts=-1, connect_timeout=5)
        site = self

        class Counted(JetStreamApi):
            async def request(self, subject, body=None, *, timeout=None):
                site.mine += 1
                return await super().request(subject, body, timeout=timeout)

        self.api = Counted(self.nc, timeout=10)
        return self

    async def __aexit__(self, *exc) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.nc.close(), 5)
        if self.nodes is not None:
            await asyncio.to_thread(self.nodes.close)
        if self.server is not None:
            await asyncio.to_thread(self.server.close)

    def _get(self, port: int, path: str) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return json.loads(r.read())

    def pids(self) -> list[int]:
        servers = [n.server for n in self.nodes.nodes] if self.nodes is not None else [self.server]
        return [s.proc.pid for s in servers if s is not None and s.proc is not None]

    async def counters(self) -> dict[str, float]:
        """The servers' API requests (less this harness's), messages in and out, CPU seconds, now."""

        def read() -> dict[str, float]:
            out = {"api": 0.0, "in_msgs": 0.0, "out_msgs": 0.0}
            for port in self.monitor_ports:
                out["api"] += self._get(port, "/jsz")["api"]["total"]
                varz = self._get(port, "/varz")
                out["in_msgs"] += varz["in_msgs"]
                out["out_msgs"] += varz["out_msgs"]
            out["cpu"] = sum(process_cpu_seconds(pid) for pid in self.pids())
            return out

        c = await asyncio.to_thread(read)
        c["api"] -= self.mine
        c["t"] = time.monotonic()
        return c

    async def consumers_of(self, streams: list[str]) -> dict[str, int]:
        """How many consumers each stream has (listed: on a cluster a stream's info counts fewer)."""
        out = {}
        for s in streams:
            try:
                out[s] = len(await self.api.list_consumers(s))
            except Exception:
                out[s] = 0
        return out


def process_cpu_seconds(pid: int) -> float:
    """CPU time of a whole process, every thread of it (``/proc/PID/stat``: user + system, 10 ms ticks). Not
    ``common.cpu_seconds``: its ``/proc/PID/schedstat`` is the main thread's only, and nats-server works in others."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rates(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per second between two counter readings: API requests, messages in and out, server CPU (%)."""
    dt = max(after["t"] - before["t"], 1e-6)
    return {
        "seconds": round(dt, 2),
        "api_per_s": round((after["api"] - before["api"]) / dt, 1),
        "api_requests": int(after["api"] - before["api"]),
        "in_msgs_per_s": round((after["in_msgs"] - before["in_msgs"]) / dt, 1),
        "out_msgs_per_s": round((after["out_msgs"] - before["out_msgs"]) / dt, 1),
        "server_cpu_pct": round(100 * (after["cpu"] - before["cpu"]) / dt, 1),
    }


# ============================================================== worker processes
class Proc(Worker):
    """A benchmarks.scale_worker process and what it printed."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.ready_at = 0.0
        self.members: list[str] = []
        self.errors: list[str] = []
        self.stats: dict[str, Any] = {"conflicts": 0, "rebalances": 0}
        self.done: dict[str, Any] | None = None
        super().__init__(proc, "scale")

    def _on(self, ev: dict) -> None:
        kind = ev.get("ev")
        if kind == "ready":
            self.members, self.errors = ev["members"], ev.get("errors", [])
            self.ready_at = ev["t"]
            self.ready.set()
        elif kind == "stats":
            self.stats = ev
        elif kind == "event":
            self.events.append(ev)
        elif kind == "done":
            self.done, self.stats = ev, ev

    def _ended(self) -> None:
        self.ready.set()  # nobody waits for a ready that will not come


async def spawn(url: str, *args: str) -> Proc:
    return Proc(await start_module("benchmarks.scale_worker", url, *args))


async def all_ready(procs: list[Proc], timeout: float) -> None:
    await asyncio.wait_for(asyncio.gather(*(p.ready.wait() for p in procs)), timeout)
    dead = [p for p in procs if not p.members and p.proc.returncode is not None]
    if dead:
        raise RuntimeError(f"{len(dead)} worker process(es) ended before they were ready")


def totals(procs: list[Proc]) -> dict[str, Any]:
    """Conflicts, membership writes, and warnings by template, of ``procs``; ``examples``: one message of each."""
    warnings: dict[str, int] = {}
    examples: dict[str, str] = {}
    for p in procs:
        for template, n in (p.stats.get("warnings") or {}).items():
            warnings[template] = warnings.get(template, 0) + int(n)
            examples.setdefault(template, (p.stats.get("warning_examples") or {}).get(template, template))
    return {
        "conflicts": sum(int(p.stats.get("conflicts", 0)) for p in procs),
        "rebalances": sum(int(p.stats.get("rebalances", 0)) for p in procs),
        "warnings": warnings,
        "examples": examples,
    }


def said(t: dict[str, Any]) -> str:
    """The warnings of a phase, for the log: ``N x <one message>``."""
    return "; ".join(f"{n} x {t['examples'].get(k, k)}" for k, n in t["warnings"].items())


# ============================================================== the crowd
async def owners(site: Site, stream: str, group: str) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """(the config's member -> partitions, the work queue's consumer -> the partitions its filters name)."""
    cfg = await get_elastic_config(site.nc, stream, group, api=site.api)
    mapped = {m.member: sorted(m.partitions) for m in cfg.member_mappings}
    held = {}
    for c in await site.api.list_consumers(work_queue_name(stream, group)):
        conf = c.get("config") or {}
        subjects = conf.get("filter_subjects") or ([conf["filter_subject"]] if conf.get("filter_subject") else [])
        held[c["name"]] = sorted(int(s.split(".", 1)[0]) for s in subjects)
    return mapped, held


async def one_owner_each(site: Site, stream: str, group: str, live: set[str], timeout: float) -> float:
    """Wait until every partition has exactly one owner among ``live`` (config and consumers agree); when."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            mapped, held = await owners(site, stream, group)
            if set(mapped) == live and held == mapped:
                return time.monotonic()
            last = f"{len(mapped)} mapped, {len(held)} consumers, {len(live)} live"
        except Exception as e:
            last = repr(e)
        await asyncio.sleep(POLL)
    raise TimeoutError(f"the partitions did not settle on {len(live)} members within {timeout:.0f}s ({last})")


async def crowd(n: int, *, cluster: bool = False, log=print) -> dict[str, Any]:
    """N automatic instances on one group of 1,024 partitions: join, steady state, half of them stopped."""
    stream, group = "CROWD", "g"
    async with Site(cluster) as site:
        await site.nc.jetstream().add_stream(
            StreamConfig(name=stream, subjects=["crowd.*"], num_replicas=site.replicas)
        )
        await create_elastic(
            site.nc, stream, group, PARTITIONS, partitioning_filters=[PartitioningFilter("crowd.*", [1])]
        )
        before = await site.counters()
        t0 = time.monotonic()
        procs = await asyncio.gather(
            *(
                spawn(site.url, "auto", stream, group, "--count", str(PER_PROCESS), "--lease-ttl", str(LEASE_TTL))
                for _ in range(n // PER_PROCESS)
            )
        )
        try:
            await all_ready(procs, 120 + 2 * n)
            joined = time.monotonic() - (time.time() - max(p.ready_at for p in procs))
            live = {m for p in procs for m in p.members}
            settled = await one_owner_each(site, stream, group, live, 120 + 3 * n)
            after = await site.counters()
            await asyncio.sleep(1.5)  # the workers' last stats lines
            errors = [e for p in procs for e in p.errors]
            join = {
                "seconds": round(settled - t0, 2),
                "after_last_join_s": round(settled - joined, 2),
                "started": len(live),
                "start_errors": len(errors),
                "start_error": errors[0] if errors else "",
                **totals(procs),
                **rates(before, after),
            }
            log(
                f"  crowd {n}: one owner per partition {join['seconds']:.1f}s after the start "
                f"({join['after_last_join_s']:.1f}s after the last join), {join['conflicts']} conflicts, "
                f"{join['rebalances']} writes, {join['api_per_s']:.0f} API req/s"
                + (f"; warnings: {said(join)}" if join["warnings"] else "")
                + (f"; {len(errors)} did not start: {errors[0]}" if errors else "")
            )
            s0 = await site.counters()
            await asyncio.sleep(STEADY)
            steady = rates(s0, await site.counters())
            steady["kv_consumers"] = await site.consumers_of(["KV_elastic-consumer-groups", "KV_pcgroups-leases"])
            log(
                f"  crowd {n}: steady {steady['api_per_s']:.0f} API req/s, {steady['out_msgs_per_s']:.0f} msgs "
                f"out/s, server CPU {steady['server_cpu_pct']:.0f} %, KV consumers {steady['kv_consumers']}"
            )
            # half of the processes stopped at once
            gone, rest = procs[: len(procs) // 2], procs[len(procs) // 2 :]
            base = totals(procs)
            before = await site.counters()
            t1 = time.monotonic()
            for p in gone:
                p.proc.send_signal(signal.SIGTERM)
            settled = await one_owner_each(site, stream, group, {m for p in rest for m in p.members}, 120 + 3 * n)
            after = await site.counters()
            await asyncio.gather(*(p.stop(60) for p in gone))
            await asyncio.sleep(1.5)
            now = totals(procs)
            half = {
                "seconds": round(settled - t1, 2),
                "conflicts": now["conflicts"] - base["conflicts"],
                "rebalances": now["rebalances"] - base["rebalances"],
                "warnings": {
                    k: v - base["warnings"].get(k, 0)
                    for k, v in now["warnings"].items()
                    if v > base["warnings"].get(k, 0)
                },
                "examples": now["examples"],
                "stop_s_max": max(float((p.done or {}).get("stop_seconds", 0)) for p in gone),
                **rates(before, after),
            }
            log(
                f"  crowd {n}: half stopped, one owner per partition again after {half['seconds']:.1f}s, "
                f"{half['conflicts']} conflicts, {half['rebalances']} writes, {half['api_per_s']:.0f} API req/s"
                + (f"; warnings: {said(half)}" if half["warnings"] else "")
            )
        finally:
            await asyncio.gather(*(p.stop(60) for p in procs), return_exceptions=True)
        return {
            "instances": n,
            "processes": len(procs),
            "cluster": cluster,
            "join": join,
            "steady": steady,
            "stop_half": half,
        }


# ============================================================== many groups
async def timed_cg(url: str, *args: str, runs: int = 3) -> dict[str, Any]:
    """``cg ARGS`` as a user runs it (a new process each time): the median wall time and the first error line."""
    times, error = [], ""
    for _ in range(runs):
        t = time.perf_counter()
        p = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cg",
            "--server",
            url,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=str(ROOT),
        )
        _out, err = await p.communicate()
        times.append(time.perf_counter() - t)
        if p.returncode:
            error = err.decode(errors="replace").strip().splitlines()[0] if err else f"exit {p.returncode}"
    return {"seconds": round(median(times) or 0.0, 3), "error": error}


async def library_calls(site: Site, runs: int = 3) -> dict[str, float]:
    """What ``ls`` and ``status`` do, timed in this process (no interpreter start-up): median seconds."""
    from pcgroups import list_elastic_groups, list_static_groups
    from pcgroups.ops._status import elastic_status, static_status

    calls = {
        "static ls": lambda: list_static_groups(site.nc, "MANY"),
        "elastic ls": lambda: list_elastic_groups(site.nc, "EMANY"),
        "static status": lambda: static_status(site.nc, "MANY", "s0"),
        "elastic status": lambda: elastic_status(site.nc, "EMANY", "e0"),
    }
    out = {}
    for name, call in calls.items():
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            await call()
            times.append(time.perf_counter() - t)
        out[name] = round(median(times) or 0.0, 4)
    return out


async def make_groups(site: Site, start: int, end: int) -> float:
    """Groups start..end-1 of each flavour (static s<i> on MANY, elastic e<i> on EMANY); seconds per group."""
    t = time.perf_counter()
    for i in range(start, end):
        await create_static(site.nc, "MANY", f"s{i}", 4, members=["m1", "m2", "m3"])
        await create_elastic(site.nc, "EMANY", f"e{i}", 4, partitioning_filters=[PartitioningFilter("emany.*", [1])])
        for attempt in range(5):
            try:
                await add_members(site.nc, "EMANY", f"e{i}", ["m1", "m2"])
                break
            except NotFoundError:
                # On a loaded cluster a get right after the create can miss it: direct gets are answered by any
                # replica, and a follower may not have the write yet (docs/SCALE.md, *Found*)
                site.stale_reads += 1
                await asyncio.sleep(0.1 * (attempt + 1))
    return (time.perf_counter() - t) / max(1, 2 * (end - start))


async def exporter_refresh(site: Site, runs: int = 3) -> dict[str, Any]:
    nc = await nats.connect(servers=site.url.split(","))
    try:
        exp = GroupsExporter(nc)
        times, requests = [], []
        for _ in range(runs):
            await exp.refresh()
            times.append(exp.last_seconds)
            requests.append(exp.last_requests)
        return {
            "seconds": round(median(times) or 0.0, 3),
            "requests": int(median(requests) or 0),
            "groups": len(exp.statuses),
            "error": exp.last_error or "",
        }
    finally:
        await nc.close()


async def start_instances(site: Site, mode: str, stream: str, groups: list[str]) -> list[Proc]:
    chunks = [groups[i : i + GROUPS_PER_PROCESS] for i in range(0, len(groups), GROUPS_PER_PROCESS)]
    return list(await asyncio.gather(*(spawn(site.url, mode, stream, ",".join(c)) for c in chunks)))


async def change_latency(site: Site, procs: list[Proc], groups: list[str]) -> float | None:
    """Median seconds from a membership change (m3 added to an elastic group) until that group's m1 instance
    says its partitions changed, over ``groups``; the changes are undone."""
    by_group = {g: p for p in procs for g in p.members}
    out = []
    for g in groups:
        p = by_group[g]
        seen = len(p.events)
        t = time.time()
        await add_members(site.nc, "EMANY", g, ["m3"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            hit = [e for e in p.events[seen:] if e["group"] == g and e["kind"] == "partitions"]
            if hit:
                out.append(hit[0]["t"] - t)
                break
            await asyncio.sleep(0.01)
        await delete_members(site.nc, "EMANY", g, ["m3"])
    return median(out)


async def many_groups(levels: list[int], *, cluster: bool = False, limit: bool = False, log=print) -> dict[str, Any]:
    rows, limit_row = [], None
    async with Site(cluster) as site:
        js = site.nc.jetstream()
        await js.add_stream(
            StreamConfig(
                name="MANY",
                subjects=["many.*"],
                num_replicas=site.replicas,
                subject_transform=SubjectTransform(src="many.*", dest="{{partition(4,1)}}.many.{{wildcard(1)}}"),
            )
        )
        await js.add_stream(StreamConfig(name="EMANY", subjects=["emany.*"], num_replicas=site.replicas))
        made = 0
        procs: list[Proc] = []
        for level in levels:
            half = level // 2
            per_group = await make_groups(site, made, half)
            made = half
            row: dict[str, Any] = {"groups": 2 * half, "create_s_per_group": round(per_group, 3)}
            row["exporter"] = await exporter_refresh(site)
            row["library"] = await library_calls(site)
            row["cg"] = {
                "static ls": await timed_cg(site.url, "static", "ls", "MANY"),
                "elastic ls": await timed_cg(site.url, "elastic", "ls", "EMANY"),
                "static status": await timed_cg(site.url, "static", "status", "MANY", "s0"),
                "elastic status": await timed_cg(site.url, "elastic", "status", "EMANY", "e0"),
            }
            log(
                f"  {2 * half} groups: exporter {row['exporter']['seconds']:.2f}s / {row['exporter']['requests']} "
                f"requests; "
                + ", ".join(
                    f"cg {k} {v['seconds']:.2f}s ({row['library'][k] * 1000:.0f} ms in the library)"
                    for k, v in row["cg"].items()
                )
            )
            before = await site.counters()
            t = time.monotonic()
            procs = await start_instances(
                site, "static", "MANY", [f"s{i}" for i in range(half)]
            ) + await start_instances(site, "elastic", "EMANY", [f"e{i}" for i in range(half)])
            try:
                await all_ready(procs, 120 + level)
                row["instances"] = sum(len(p.members) for p in procs)
                row["start_s"] = round(time.monotonic() - t, 2)
                row["start"] = rates(before, await site.counters())
                row["start_errors"] = [e for p in procs for e in p.errors][:3]
                row["kv_consumers"] = await site.consumers_of(
                    ["KV_static-consumer-groups", "KV_elastic-consumer-groups"]
                )
                s0 = await site.counters()
                await asyncio.sleep(STEADY)
                row["steady"] = rates(s0, await site.counters())
                row["change_s"] = await change_latency(
                    site, procs, [f"e{i}" for i in range(0, half, max(1, half // 5))]
                )
                row["exporter_running"] = await exporter_refresh(site)
                log(
                    f"  {2 * half} groups: {row['instances']} instances started in {row['start_s']:.1f}s, KV consumers "
                    f"{row['kv_consumers']}, steady {row['steady']['api_per_s']:.0f} API req/s "
                    f"{row['steady']['out_msgs_per_s']:.0f} msgs out/s CPU {row['steady']['server_cpu_pct']:.0f} %, "
                    f"config change seen after {row['change_s'] or 0:.2f}s, exporter "
                    f"{row['exporter_running']['seconds']:.2f}s"
                )
                if limit and level == levels[-1]:
                    limit_row = await find_limit(site, half, log)
            finally:
                await asyncio.gather(*(p.stop(60) for p in procs), return_exceptions=True)
            row["watches_gone_s"] = await watches_gone(site)
            rows.append(row)
        stale = site.stale_reads
    return {"cluster": cluster, "levels": rows, "limit": limit_row, "not_found_after_create": stale}


async def watches_gone(site: Site, timeout: float = 60.0) -> float | None:
    """Seconds until the config buckets' streams have no consumer left (the stopped instances' watches)."""
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        if not any((await site.consumers_of(["KV_static-consumer-groups", "KV_elastic-consumer-groups"])).values()):
            return round(time.monotonic() - t, 2)
        await asyncio.sleep(0.2)
    return None


async def find_limit(site: Site, half: int, log) -> dict[str, Any]:
    """Instances of static members m2, then m3, 50 at a time, until one is refused: the consumers the config
    bucket's stream had then, what the instance and ``cg static ls`` said."""
    extra: list[Proc] = []
    try:
        for member in ("m2", "m3"):
            for start in range(0, half, GROUPS_PER_PROCESS):
                groups = ",".join(f"s{i}" for i in range(start, min(half, start + GROUPS_PER_PROCESS)))
                p = await spawn(site.url, "static", "MANY", groups, "--member", member)
                extra.append(p)
                await all_ready([p], 120)
                if p.errors:
                    break
            if p.errors:
                kv = await site.consumers_of(["KV_static-consumer-groups"])
                ls = await timed_cg(site.url, "static", "ls", "MANY", runs=1)
                row = {
                    "instances_started": sum(len(x.members) for x in extra),
                    "kv_static_consumers": kv["KV_static-consumer-groups"],
                    "instance_error": p.errors[0],
                    "cg_static_ls": ls["error"],
                }
                log(
                    f"  limit: refused at {row['kv_static_consumers']} consumers on KV_static-consumer-groups: "
                    f"{row['instance_error']}"
                )
                return row
        return {"instances_started": sum(len(x.members) for x in extra), "refused": False}
    finally:
        await asyncio.gather(*(p.stop(60) for p in extra), return_exceptions=True)


# ============================================================== printing and plotting
def tables(res: dict[str, Any]) -> str:
    out = []
    if res.get("crowd"):
        out += [
            "| instances | one owner each after the start | after the last join | conflicts | writes | API req/s "
            "| steady API req/s | steady msgs out/s | steady server CPU | half stopped: one owner each after "
            "| conflicts | writes | API req/s |",
            "|" + "---|" * 13,
        ]
        for c in res["crowd"]:
            j, s, h = c["join"], c["steady"], c["stop_half"]
            out.append(
                f"| {c['instances']}{' (3 nodes)' if c['cluster'] else ''} | {j['seconds']:.1f} s "
                f"| {j['after_last_join_s']:.1f} s | {j['conflicts']} | {j['rebalances']} | {j['api_per_s']:.0f} "
                f"| {s['api_per_s']:.0f} | {s['out_msgs_per_s']:.0f} | {s['server_cpu_pct']:.0f} % "
                f"| {h['seconds']:.1f} s | {h['conflicts']} | {h['rebalances']} | {h['api_per_s']:.0f} |"
            )
    if res.get("groups"):
        g = res["groups"]
        out += [
            "",
            "| groups | exporter refresh | requests | `static ls` (in the library) | `elastic ls` "
            "| `static status` | `elastic status` | instances started in | KV consumers (static, elastic) | steady API req/s "
            "| steady msgs out/s | steady server CPU | config change seen after | exporter, instances running |",
            "|" + "---|" * 14,
        ]
        for r in g["levels"]:
            cg, kv = r["cg"], r.get("kv_consumers", {})
            out.append(
                f"| {r['groups']}{' (3 nodes)' if g['cluster'] else ''} | {r['exporter']['seconds']:.2f} s "
                f"| {r['exporter']['requests']} | "
                + " | ".join(
                    f"{cg[k]['seconds']:.2f} s ({r['library'][k] * 1000:.0f} ms)"
                    for k in ("static ls", "elastic ls", "static status", "elastic status")
                )
                + f" | {r['start_s']:.1f} s | {kv.get('KV_static-consumer-groups')}, "
                f"{kv.get('KV_elastic-consumer-groups')} | {r['steady']['api_per_s']:.0f} "
                f"| {r['steady']['out_msgs_per_s']:.0f} | {r['steady']['server_cpu_pct']:.0f} % "
                f"| {r['change_s'] or 0:.2f} s | {r['exporter_running']['seconds']:.2f} s |"
            )
        if g.get("limit"):
            out += ["", f"limit: {json.dumps(g['limit'])}"]
    return "\n".join(out)


def plot(results: list[dict[str, Any]], path: str) -> None:
    """The curves of docs/SCALE.md: the crowd (top) and many groups (bottom); one server in solid lines with
    circles, 3 nodes dashed with squares, one colour per measure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 3, figsize=(13, 7.5))
    colours: dict[str, str] = {}

    def line(a: Any, xs: list[int], ys: list[float], what: str, cluster: bool) -> None:
        colour = colours.setdefault(what, f"C{len(colours) % 10}")
        a.plot(xs, ys, "s--" if cluster else "o-", color=colour, label=None if cluster else what)

    crowd = [c for res in results for c in res.get("crowd", [])]
    for cluster in (False, True):
        cs = [c for c in crowd if c["cluster"] == cluster]
        xs = [c["instances"] for c in cs]
        if not cs:
            continue
        line(ax[0][0], xs, [c["join"]["seconds"] for c in cs], "all started at once", cluster)
        line(ax[0][0], xs, [c["stop_half"]["seconds"] for c in cs], "half stopped at once", cluster)
        line(ax[0][1], xs, [c["join"]["conflicts"] for c in cs], "all started at once", cluster)
        line(ax[0][1], xs, [c["stop_half"]["conflicts"] for c in cs], "half stopped at once", cluster)
        line(ax[0][2], xs, [c["join"]["api_per_s"] for c in cs], "API requests, starting", cluster)
        line(ax[0][2], xs, [c["steady"]["api_per_s"] for c in cs], "API requests, steady", cluster)
        line(ax[0][2], xs, [c["steady"]["out_msgs_per_s"] for c in cs], "messages out, steady", cluster)
    if crowd:
        xs = sorted({c["instances"] for c in crowd})
        ax[0][2].plot(xs, [3 * n * n / LEASE_TTL for n in xs], ":", color="grey", label="3 N² / lease TTL")
    levels = [(r, res["groups"]["cluster"]) for res in results if res.get("groups") for r in res["groups"]["levels"]]
    for cluster in (False, True):
        rs = [r for r, c in levels if c == cluster]
        xs = [r["groups"] for r in rs]
        if not rs:
            continue
        line(ax[1][0], xs, [r["exporter"]["seconds"] for r in rs], "exporter refresh", cluster)
        line(ax[1][0], xs, [r["exporter_running"]["seconds"] for r in rs], "exporter, instances running", cluster)
        line(ax[1][0], xs, [r["cg"]["static ls"]["seconds"] for r in rs], "cg static ls", cluster)
        line(ax[1][0], xs, [r["library"]["static ls"] for r in rs], "static ls, library call", cluster)
        line(ax[1][0], xs, [r["library"]["elastic status"] for r in rs], "elastic status, library call", cluster)
        line(ax[1][1], xs, [r["exporter"]["requests"] for r in rs], "exporter requests per refresh", cluster)
        line(ax[1][1], xs, [sum(r["kv_consumers"].values()) for r in rs], "consumers of the KV watches", cluster)
        line(ax[1][2], xs, [r["steady"]["server_cpu_pct"] for r in rs], "server CPU % (idle instances)", cluster)
        line(ax[1][2], xs, [r["start_s"] for r in rs], "seconds to start them", cluster)
    titles = (
        (
            "crowd: seconds until one owner per partition",
            "crowd: compare-and-set conflicts",
            "crowd: the server, per second",
        ),
        ("many groups: seconds", "many groups: requests, consumers", "many groups: one instance each"),
    )
    for row, (axes, names) in enumerate(zip(ax, titles, strict=False)):
        for a, title in zip(axes, names, strict=False):
            a.set_title(title + " (dashed: 3 nodes)", fontsize=9)
            a.set_xlabel(
                "automatic instances on 1,024 partitions" if row == 0 else "groups (half static, half elastic)",
                fontsize=8,
            )
            a.set_xscale("log")
            a.legend(fontsize=6.5)
            a.grid(alpha=0.3)
    ax[0][2].set_yscale("log")
    ax[1][0].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def machine() -> dict[str, Any]:
    from .__main__ import machine as bench_machine

    return bench_machine()


async def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--crowd", default="10,30,100", help="automatic instances per run (multiples of 5; '' for none)")
    p.add_argument("--groups", default="100,300,1000", help="group counts (even; '' for none)")
    p.add_argument("--cluster", action="store_true", help="on a 3-node cluster (R3) instead of one server")
    p.add_argument(
        "--limit",
        action="store_true",
        help="after the largest group count, start instances until the server refuses one",
    )
    p.add_argument("--json", default="", help="write the results here")
    p.add_argument(
        "--merge", default="", help="with --plot: also draw the results of these earlier --json files (comma-separated)"
    )
    p.add_argument("--plot", default="", help="draw the curves into this PNG (needs matplotlib)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    try:
        crowd_sizes = [int(x) for x in args.crowd.split(",") if x.strip()]
        levels = [int(x) for x in args.groups.split(",") if x.strip()]
    except ValueError:
        p.error(f"--crowd {args.crowd!r} --groups {args.groups!r}: comma-separated whole numbers")
    if any(n % PER_PROCESS or n < 2 * PER_PROCESS for n in crowd_sizes):
        p.error(f"--crowd {args.crowd}: each size a multiple of {PER_PROCESS}, at least {2 * PER_PROCESS}")
    if any(g % 2 or g < 2 for g in levels) or levels != sorted(levels):
        p.error(f"--groups {args.groups}: even counts, growing")
    info = machine()
    print(
        f"machine: {info['nproc']} CPUs, Python {info['python']}, {info['nats_server']}, load average "
        f"{' '.join(f'{x:.2f}' for x in info['loadavg_at_start'])}",
        flush=True,
    )
    res: dict[str, Any] = {"machine": info, "crowd": [], "groups": None}
    t0 = time.time()

    def log(text: str) -> None:
        print(text, flush=True)

    for n in crowd_sizes:
        res["crowd"].append(await crowd(n, cluster=args.cluster, log=log))
    if levels:
        res["groups"] = await many_groups(levels, cluster=args.cluster, limit=args.limit, log=log)
    res["seconds"] = round(time.time() - t0)
    res["machine"]["loadavg_at_end"] = list(os.getloadavg())
    print()
    print(tables(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    if args.plot:
        earlier = []
        for path in filter(None, args.merge.split(",")):
            with open(path) as f:
                earlier.append(json.load(f))
        plot([*earlier, res], args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))

"""``cg demo``: partitioned consumer groups at work on an embedded nats-server, checked as they run.

What it does, all on a throwaway nats-server (free loopback port, temporary store):

1. streams ``orders`` (a partition transform puts ``{{partition(4,1)}}`` first) and ``events``;
   a static group ``sg`` on ``orders`` (members m1, m2; m1 runs two instances) and an elastic group
   ``eg`` on ``events`` (6 partitions; members e1, e2; e2 runs two instances, e3 waits to be added);
   every instance is its own process (``python -m cg.demo_worker``);
2. publishes to both streams at a bounded rate, and shows a live view: partitions, their owner
   member and its pinned instance, processing rates and pending messages;
3. SIGKILLs the pinned instance of m1, then the pinned one of e2, and times the standby's takeover;
4. adds e3 to the elastic group, then drops e1, and times the hand-over of their partitions;
5. stops publishing, lets the groups catch up, stops every instance and checks the record of every
   handler call with :mod:`pcgroups.checker`: no loss, order of success per partition, no two
   instances on one partition at once, redeliveries within a bound. Any failure: exit status 1.

With ``--cluster`` the server is a 3-node JetStream cluster (:class:`pcgroups.cluster.EmbeddedCluster`), the
streams have three replicas, every instance connects with the three URLs, and one more phase SIGKILLs the
node leading the ``orders`` stream, times how long until every partition of both groups is handled again
(a JetStream leader election: 4-9 s), and restarts the node.

Every phase scales with ``--duration`` (default 36 s, 60 s with ``--cluster``; 12 s still runs every phase). Into a pipe it
prints progress lines instead of the live view. Every process it started, and the server, are
stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table
    from rich.text import Text

    from nats.aio.client import Client

    from pcgroups.checker import Recorder, Report
    from pcgroups.cluster import EmbeddedCluster
    from pcgroups.jsapi import JetStreamApi
    from pcgroups.server import EmbeddedServer

DEFAULT_DURATION = 36.0
CLUSTER_DURATION = 60.0       # the default with --cluster: a leader election takes 4-9 s
ELECTION = 9.0                # nats-server's longest raft election timeout
MIN_DURATION = 8.0
DEFAULT_RATE = 150.0          # messages per second, both streams together
MIN_RATE, MAX_RATE = 10.0, 2000.0

STATIC_STREAM, STATIC_GROUP, STATIC_PARTITIONS = "orders", "sg", 4
STATIC_MEMBERS = ["m1", "m2"]
ELASTIC_STREAM, ELASTIC_GROUP, ELASTIC_PARTITIONS = "events", "eg", 6
ELASTIC_FIRST = ["e1", "e2"]
ELASTIC_ADDED, ELASTIC_DROPPED = "e3", "e1"
KEYS = 24                     # distinct keys per stream (customers, devices)

# (flavour, member, instance): m1 and e2 run a standby each; e3 runs before it is a member
INSTANCES = [("static", "m1", "m1-a"), ("static", "m1", "m1-b"), ("static", "m2", "m2-a"),
             ("elastic", "e1", "e1-a"), ("elastic", "e2", "e2-a"), ("elastic", "e2", "e2-b"),
             ("elastic", "e3", "e3-a")]
KILL_STATIC_MEMBER, KILL_ELASTIC_MEMBER = "m1", "e2"

PHASES = ["setup", "traffic", "kill m1's pinned", "kill e2's pinned", "add e3", "drop e1", "catch up", "summary"]
CLUSTER_PHASES = PHASES[:-2] + ["kill a node"] + PHASES[-2:]


@dataclass
class Plan:
    """When each step happens, in seconds after the traffic starts."""

    span: float               # the traffic and change phases; the drain follows until ``span``
    ack_wait: float
    rate: float
    work: float
    kill_static: float = 0.0
    kill_elastic: float = 0.0
    add_member: float = 0.0
    drop_member: float = 0.0
    stop_traffic: float = 0.0
    kill_node: float | None = None     # --cluster: SIGKILL the orders stream's leader node

    @classmethod
    def make(cls, span: float, *, rate: float, ack_wait: float | None, work: float,
             cluster: bool = False) -> "Plan":
        span = max(span, MIN_DURATION - 1)
        aw = ack_wait if ack_wait else min(3.0, max(1.0, round(span / 12 * 2) / 2))
        if cluster:  # the changes first, then the node kill with an election's time left before the traffic stops
            aw = ack_wait if ack_wait else 2.0
            return cls(span=span, ack_wait=aw, rate=rate, work=work, kill_static=0.10 * span,
                       kill_elastic=0.20 * span, add_member=0.30 * span, drop_member=0.40 * span,
                       kill_node=0.52 * span, stop_traffic=max(0.86 * span, 0.52 * span + ELECTION + 2))
        return cls(span=span, ack_wait=aw, rate=rate, work=work, kill_static=0.18 * span,
                   kill_elastic=0.34 * span, add_member=0.50 * span, drop_member=0.64 * span,
                   stop_traffic=0.86 * span)

    @property
    def grace(self) -> float:
        """How long the catch-up may run past the span (failover and hand-over bounds)."""
        return 2 * self.ack_wait + 3 + (2 * ELECTION if self.kill_node is not None else 0)


@dataclass
class Move:
    """A partition that changed owner in a membership change, and when its new owner first handled it."""

    partition: int
    src: str | None           # the owner before (None: nobody)
    dst: str | None           # the owner after
    after: float | None = None    # seconds from the change to the new owner's first call on it
    by: str = ""              # the instance that made that call


@dataclass
class Takeover:
    what: str                 # "static m1", "elastic e2", "add e3", "drop e1"
    at: float                 # wall time of the kill or change
    victim: str = ""
    by: str = ""
    after: float | None = None    # seconds until the successor started a message (a change: every moved partition)
    moves: list[Move] = field(default_factory=list)   # a membership change: every partition that moved
    partitions: list[int] = field(default_factory=list)   # a kill: the member's partitions


@dataclass
class DemoResult:
    """What the demo found (``exit_code`` 0 when every check passed)."""

    exit_code: int
    reports: dict[str, Report] = field(default_factory=dict)
    published: dict[str, int] = field(default_factory=dict)
    takeovers: list[Takeover] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    elapsed: float = 0.0


def _flavour_of(member: str) -> str:
    return next(f for f, m, _ in INSTANCES if m == member)


class Worker:
    """One member instance process and what it reported."""

    def __init__(self, demo: "Demo", flavour: str, member: str, name: str):
        self.demo = demo
        self.flavour = flavour
        self.member = member
        self.name = name
        self.proc: asyncio.subprocess.Process | None = None
        self.reader: asyncio.Task | None = None
        self.ready = asyncio.Event()
        self.pin: str | None = None
        self.state = "starting"
        self.killed_at: float | None = None
        self.error: str | None = None

    @property
    def recorder(self) -> Recorder:
        return self.demo.recorders[self.flavour]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and self.state not in ("killed", "done")

    async def start(self, url: str, log_dir: str, plan: Plan) -> None:
        stream, group = (STATIC_STREAM, STATIC_GROUP) if self.flavour == "static" else (ELASTIC_STREAM, ELASTIC_GROUP)
        root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.pop("CG_PRETTY", None)
        with open(os.path.join(log_dir, f"{self.name}.log"), "wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "cg.demo_worker", url, self.flavour, stream, group, self.member, self.name,
                "--ack-wait", str(plan.ack_wait), "--work", str(plan.work),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
                start_new_session=True, env=env, limit=1 << 20)
        self.reader = asyncio.create_task(self._read(), name=f"demo-read-{self.name}")

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            ev = obj.get("ev")
            if ev in ("start", "end"):
                call = self.recorder.feed(obj)
                if ev == "end" and call is not None and call.outcome == "ack":
                    self.demo.acked[self.flavour][call.partition] += 1
                    self.demo.acked[self.name][0] += 1
            elif ev == "pin":
                self.pin = obj.get("pin")
                if self.pin:
                    self.demo.pins[self.pin] = self.name
            elif ev == "ready":
                self.state = "running"
                self.ready.set()
            elif ev == "done":
                self.error = obj.get("error")
                if self.state != "killed":
                    self.state = "done"
        if self.state not in ("killed", "done"):
            self.state = "exited"
        self.pin = None

    def kill(self) -> float:
        """SIGKILL (a crash). Returns the time it was sent."""
        self.killed_at = time.time()
        self.state = "killed"
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
        return self.killed_at

    async def settle_kill(self) -> None:
        """After a kill: read what it printed before it died, then close its open call."""
        if self.reader is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.reader), 5)
            except (asyncio.TimeoutError, Exception):
                pass
        self.pin = None
        if self.killed_at is not None:
            self.recorder.close_instance(self.name, t=self.killed_at)

    async def stop(self, timeout: float) -> None:
        """SIGTERM (the in-flight handler finishes), SIGKILL if it lingers."""
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.send_signal(signal.SIGTERM)
            except (ProcessLookupError, OSError):
                pass
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except asyncio.TimeoutError:
                try:
                    proc.kill()
                except ProcessLookupError:
                    pass
                await proc.wait()
        if self.reader is not None:
            try:
                await asyncio.wait_for(self.reader, 5)
            except (asyncio.TimeoutError, Exception):
                self.reader.cancel()
        if self.killed_at is not None:
            self.recorder.close_instance(self.name, t=self.killed_at)


class Demo:
    def __init__(self, *, duration: float, console: Console, rate: float, ack_wait: float | None, work: float,
                 live: bool | None, cluster: bool = False):
        from pcgroups.checker import Recorder

        self.duration = max(duration, MIN_DURATION)
        self.cluster_mode = cluster
        self.cluster: EmbeddedCluster | None = None   # with --cluster
        self.url = ""
        self.phases = CLUSTER_PHASES if cluster else PHASES
        self.console = console
        self.rate = rate
        self.ack_wait_opt = ack_wait
        self.work = work
        self.live_view = console.is_terminal if live is None else live
        self.started = time.monotonic()
        self.t0_wall = 0.0                 # wall time the traffic started
        self.plan: Plan | None = None
        self.server: EmbeddedServer | None = None
        self._nc: Client | None = None     # setup() connects
        self._api: JetStreamApi | None = None
        self.recorders = {"static": Recorder(), "elastic": Recorder()}
        self.expected: dict[str, list[int]] = {"static": [], "elastic": []}
        self.acked: dict[str, Counter] = defaultdict(Counter)   # per flavour: partition -> acks; per instance: 0
        self.pins: dict[str, str] = {}
        self.workers: dict[str, Worker] = {}
        self.events: deque[tuple[float, Text]] = deque(maxlen=9)
        self.takeovers: list[Takeover] = []
        self.phase = "setup"
        self.elastic_members = list(ELASTIC_FIRST)
        self.status: dict[str, Any] = {}
        self.publishing = False
        self.publish_errors = 0
        self._tasks: list[asyncio.Task] = []
        self._last_progress = 0.0
        self.log_dir = ""

    # --- output ---------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def event(self, text: str, style: str = "") -> None:
        from rich.text import Text

        self.events.append((self.elapsed(), Text(text, style=style)))
        if not self.live_view:
            self.console.print(Text(f"[{self.elapsed():6.1f}s] {text}"), soft_wrap=True)

    def set_phase(self, phase: str) -> None:
        self.phase = phase

    # --- setup ----------------------------------------------------------------------------
    async def setup(self) -> None:
        import nats
        from nats.js.api import StreamConfig, SubjectTransform

        from pcgroups import (JetStreamApi, PartitioningFilter, add_members, create_elastic, create_static)
        from pcgroups.cluster import EmbeddedCluster
        from pcgroups.server import EmbeddedServer

        if self.cluster_mode:
            self.cluster = EmbeddedCluster(size=3)
            await asyncio.to_thread(self.cluster.start)
            self.url = self.cluster.url
            self.log_dir = self.cluster._tmp.name if self.cluster._tmp else ""
            self.event(f"3-node nats-server cluster on {self.url} (meta leader {self.cluster.meta_leader()}, "
                       f"stores under {self.log_dir})")
        else:
            self.server = EmbeddedServer()
            await asyncio.to_thread(self.server.start)
            self.url = self.server.url
            self.log_dir = self.server.store_dir
            self.event(f"nats-server on {self.server.url} (store {self.server.store_dir})")
        self._nc = await nats.connect(servers=self.url.split(","), max_reconnect_attempts=-1,
                                      reconnect_time_wait=0.2, name="cg-demo")
        self._api = JetStreamApi(self._nc)
        js = self.nc.jetstream()
        replicas = 3 if self.cluster_mode else 1
        await js.add_stream(StreamConfig(
            name=STATIC_STREAM, subjects=[f"{STATIC_STREAM}.*"], num_replicas=replicas,
            subject_transform=SubjectTransform(
                src=f"{STATIC_STREAM}.*",
                dest=f"{{{{partition({STATIC_PARTITIONS},1)}}}}.{STATIC_STREAM}.{{{{wildcard(1)}}}}")))
        await js.add_stream(StreamConfig(name=ELASTIC_STREAM, subjects=[f"{ELASTIC_STREAM}.*"], num_replicas=replicas))
        await create_static(self.nc, STATIC_STREAM, STATIC_GROUP, STATIC_PARTITIONS, members=STATIC_MEMBERS,
                            api=self.api)
        await create_elastic(self.nc, ELASTIC_STREAM, ELASTIC_GROUP, ELASTIC_PARTITIONS,
                             partitioning_filters=[PartitioningFilter(f"{ELASTIC_STREAM}.*", [1])], api=self.api)
        await add_members(self.nc, ELASTIC_STREAM, ELASTIC_GROUP, ELASTIC_FIRST, api=self.api)
        self.event(f"stream {STATIC_STREAM} ({STATIC_PARTITIONS} partitions by key), static group {STATIC_GROUP}: "
                   f"members {' '.join(STATIC_MEMBERS)}")
        self.event(f"stream {ELASTIC_STREAM}, elastic group {ELASTIC_GROUP} ({ELASTIC_PARTITIONS} partitions): "
                   f"members {' '.join(ELASTIC_FIRST)}")
        span = self.duration - self.elapsed() - 1.5     # what is left after setup and the instances' start
        self.plan = Plan.make(span, rate=self.rate, ack_wait=self.ack_wait_opt, work=self.work,
                              cluster=self.cluster_mode)
        for flavour, member, name in INSTANCES:
            self.workers[name] = Worker(self, flavour, member, name)
        await asyncio.gather(*(w.start(self.url, self.log_dir, self.plan) for w in self.workers.values()))
        try:
            await asyncio.wait_for(asyncio.gather(*(w.ready.wait() for w in self.workers.values())), 20)
        except asyncio.TimeoutError:
            late = [w.name for w in self.workers.values() if not w.ready.is_set()]
            raise RuntimeError(f"instances did not start: {', '.join(late)} (logs in {self.log_dir})") from None
        self.event(f"{len(self.workers)} instances running as processes: "
                   + ", ".join(f"{w.name}" for w in self.workers.values())
                   + f" (AckWait = PinnedTTL = {self.plan.ack_wait:g}s, max_ack_pending 1)")

    @property
    def nc(self) -> Client:
        """The demo's connection (setup() makes it)."""
        assert self._nc is not None, "setup() connects first"
        return self._nc

    @property
    def api(self) -> JetStreamApi:
        assert self._api is not None, "setup() connects first"
        return self._api

    # --- traffic --------------------------------------------------------------------------
    async def publish(self) -> None:
        assert self.plan is not None
        js = self.nc.jetstream()
        rng = random.Random(7)
        per_stream = self.plan.rate / 2
        interval = 1.0 / per_stream
        n = {"static": 0, "elastic": 0}
        next_at = time.monotonic()
        self.publishing = True
        try:
            while self.publishing:
                for flavour, stream in (("static", STATIC_STREAM), ("elastic", ELASTIC_STREAM)):
                    key = rng.randrange(KEYS)
                    subject = f"{stream}.{'c' if flavour == 'static' else 'd'}{key}"
                    payload = n[flavour]
                    n[flavour] += 1
                    try:
                        await js.publish(subject, str(payload).encode(), timeout=2)
                        self.expected[flavour].append(payload)
                    except Exception:
                        self.publish_errors += 1
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -1:
                    next_at = time.monotonic()
        finally:
            self.publishing = False

    async def poll_status(self) -> None:
        from pcgroups.status import elastic_status, static_status

        while True:
            try:
                self.status["static"] = await static_status(self.nc, STATIC_STREAM, STATIC_GROUP, api=self.api)
                self.status["elastic"] = await elastic_status(self.nc, ELASTIC_STREAM, ELASTIC_GROUP, api=self.api)
            except asyncio.CancelledError:
                raise
            except Exception:
                pass
            await asyncio.sleep(1.0)

    # --- the steps ------------------------------------------------------------------------
    def pinned_worker(self, member: str) -> Worker | None:
        candidates = [w for w in self.workers.values() if w.member == member and w.alive and w.pin]
        if len(candidates) > 1:  # a standby that has not noticed yet: ask the server's view
            st = self.status.get("static" if candidates[0].flavour == "static" else "elastic")
            ms = st.member(member) if st is not None else None
            if ms is not None and ms.pinned_id in self.pins:
                named = self.workers.get(self.pins[ms.pinned_id])
                if named in candidates:
                    return named
            return max(candidates, key=lambda w: self.recorders[w.flavour].first_start(instance=w.name) or 0)
        return candidates[0] if candidates else None

    async def kill_pinned(self, member: str) -> Takeover:
        victim = None
        deadline = time.monotonic() + 2 * (self.plan.ack_wait if self.plan else 2)
        while victim is None and time.monotonic() < deadline:
            victim = self.pinned_worker(member)
            if victim is None:
                await asyncio.sleep(0.05)
        flavour = _flavour_of(member)
        if victim is None:
            self.event(f"no pinned instance of {member} to kill", "red")
            return Takeover(f"{flavour} {member}", time.time())
        from pcgroups.partitions import balanced_assignment

        at = victim.kill()
        self.event(f"SIGKILL {victim.name} (pid {victim.pid}), the pinned instance of {member}", "bold red")
        members, n = (STATIC_MEMBERS, STATIC_PARTITIONS) if flavour == "static" else (self.elastic_members,
                                                                                        ELASTIC_PARTITIONS)
        take = Takeover(f"{flavour} {member}", at, victim=victim.name,
                        partitions=balanced_assignment(members, n).get(member, []))
        self.takeovers.append(take)
        self._tasks.append(asyncio.create_task(victim.settle_kill()))
        self._tasks.append(asyncio.create_task(self._watch_takeover(take, member, exclude={victim.name})))
        return take

    async def _watch_takeover(self, take: Takeover, member: str, *, exclude: set[str]) -> None:
        """A kill: until another instance of ``member`` starts a message."""
        assert self.plan is not None
        rec = self.recorders[_flavour_of(member)]
        seen = 0      # calls looked at so far (the record only grows)
        first = None
        while True:
            calls = rec.calls[seen:]
            seen += len(calls)
            for c in calls:
                if c.start > take.at and c.instance not in exclude and c.member == member:
                    if first is None or c.start < first.start:
                        first = c
            if first is not None:
                take.after = first.start - take.at
                take.by = first.instance
                self.event(f"{first.instance} took over {member} {take.after:.2f}s after the kill "
                           f"(PinnedTTL {self.plan.ack_wait:g}s)", "bold green")
                return
            await asyncio.sleep(0.02)

    async def _watch_moves(self, take: Takeover) -> None:
        """A membership change: until the new owner of every moved partition has started one of its messages."""
        rec = self.recorders["elastic"]
        seen = 0
        waiting = {m.partition: m for m in take.moves}
        while waiting:
            calls = rec.calls[seen:]
            seen += len(calls)
            for c in calls:
                move = waiting.get(c.partition)
                if move is not None and c.start > take.at and c.member == move.dst:
                    move.after, move.by = c.start - take.at, c.instance
                    del waiting[c.partition]
            if waiting:
                await asyncio.sleep(0.02)
        take.after = max(m.after or 0.0 for m in take.moves)
        take.by = " ".join(sorted({m.by for m in take.moves}))
        self.event(f"{take.what}: every moved partition handled by its new owner within {take.after:.2f}s ("
                   + ", ".join(f"{m.partition} by {m.by} {m.after:.2f}s" for m in take.moves) + ")", "green")

    async def _change(self, what: str, victim: str, change: Any) -> None:
        """Add or drop an elastic member (``change`` writes it and returns the new members); reports and
        watches every partition that moved, not only the member's own."""
        from pcgroups.partitions import balanced_assignment

        from .changes import describe_moves, moves

        before = balanced_assignment(self.elastic_members, ELASTIC_PARTITIONS)
        at = time.time()
        self.elastic_members = await change()
        found = moves(before, balanced_assignment(self.elastic_members, ELASTIC_PARTITIONS))
        self.event(f"elastic {what}: members {' '.join(self.elastic_members)}; partitions moved: "
                   f"{describe_moves(found)}", "bold yellow")
        take = Takeover(what, at, victim=victim,
                        moves=[Move(p, src, dst) for src, dst, ps in found for p in ps])
        self.takeovers.append(take)
        self._tasks.append(asyncio.create_task(self._watch_moves(take)))

    async def add_member(self) -> None:
        from pcgroups import add_members

        await self._change(f"add {ELASTIC_ADDED}", ELASTIC_ADDED, lambda: add_members(
            self.nc, ELASTIC_STREAM, ELASTIC_GROUP, [ELASTIC_ADDED], api=self.api))

    async def drop_member(self) -> None:
        from pcgroups import delete_members

        await self._change(f"drop {ELASTIC_DROPPED}", ELASTIC_DROPPED, lambda: delete_members(
            self.nc, ELASTIC_STREAM, ELASTIC_GROUP, [ELASTIC_DROPPED], api=self.api))

    async def kill_node(self) -> None:
        """--cluster: SIGKILL the node leading the orders stream; once every partition of both groups is
        handled again, restart it."""
        from pcgroups.cluster import stream_leader

        assert self.cluster is not None
        try:
            name = stream_leader(await self.api.stream_info(STATIC_STREAM)) or self.cluster.meta_leader()
        except Exception:  # noqa: BLE001 - any node will do
            name = None
        node = self.cluster.node(name) if name else self.cluster.nodes[0]
        at = time.time()
        self.cluster.kill(node)
        self.event(f"SIGKILL nats-server {node.name} (port {node.port}), the leader of stream {STATIC_STREAM}",
                   "bold red")
        take = Takeover(f"node {node.name}", at, victim=node.name)
        self.takeovers.append(take)
        self._tasks.append(asyncio.create_task(self._watch_node(take, node)))

    async def _watch_node(self, take: Takeover, node: Any) -> None:
        parts = {"static": STATIC_PARTITIONS, "elastic": ELASTIC_PARTITIONS}
        while True:
            starts = [self.recorders[f].first_start(after=take.at, partition=p) for f, n in parts.items()
                      for p in range(n)]
            firsts = [t for t in starts if t is not None]
            if len(firsts) == len(starts):
                take.after = max(firsts) - take.at
                take.by = "every partition"
                self.event(f"every partition of both groups handled again {take.after:.2f}s after the node kill "
                           f"(new leaders elected)", "bold green")
                break
            await asyncio.sleep(0.05)
        assert self.cluster is not None
        await asyncio.to_thread(self.cluster.restart, node)
        self.event(f"nats-server {node.name} restarted on port {node.port}: it catches up and rejoins", "yellow")

    # --- the run --------------------------------------------------------------------------
    def caught_up(self) -> bool:
        return all(set(self.expected[f]) <= self.recorders[f].acked_keys() for f in ("static", "elastic"))

    async def run(self) -> None:
        plan = self.plan
        assert plan is not None
        self.set_phase("traffic")
        t0 = time.monotonic()
        self.t0_wall = time.time()
        self.event(f"publishing {plan.rate:g} msg/s to {STATIC_STREAM}.* and {ELASTIC_STREAM}.* "
                   f"({KEYS} keys each)")
        publisher = asyncio.create_task(self.publish(), name="demo-publish")
        self._tasks.append(publisher)
        self._tasks.append(asyncio.create_task(self.poll_status(), name="demo-status"))

        async def at(offset: float) -> None:
            delay = t0 + offset - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

        await at(plan.kill_static)
        self.set_phase("kill m1's pinned")
        await self.kill_pinned(KILL_STATIC_MEMBER)
        await at(plan.kill_elastic)
        self.set_phase("kill e2's pinned")
        await self.kill_pinned(KILL_ELASTIC_MEMBER)
        await at(plan.add_member)
        self.set_phase("add e3")
        await self.add_member()
        await at(plan.drop_member)
        self.set_phase("drop e1")
        await self.drop_member()
        if plan.kill_node is not None:
            await at(plan.kill_node)
            self.set_phase("kill a node")
            await self.kill_node()
        await at(plan.stop_traffic)
        self.publishing = False
        await publisher
        self.set_phase("catch up")
        self.event(f"stopped publishing: {len(self.expected['static'])} to {STATIC_STREAM}, "
                   f"{len(self.expected['elastic'])} to {ELASTIC_STREAM}; waiting for the groups to catch up")
        deadline = t0 + plan.span + plan.grace
        while not self.caught_up() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if self.caught_up():
            self.event(f"caught up {time.monotonic() - t0 - plan.stop_traffic:.2f}s after the traffic stopped",
                       "green")
        else:
            self.event("did not catch up in time", "bold red")
        # give the hand-over watchers a last look
        for take in self.takeovers:
            if take.after is None:
                await asyncio.sleep(0.1)
                break
        self.set_phase("summary")

    async def stop_workers(self) -> None:
        timeout = (self.plan.ack_wait if self.plan else 3.0) + 2
        await asyncio.gather(*(w.stop(timeout) for w in self.workers.values()), return_exceptions=True)

    async def cleanup(self) -> None:
        self.publishing = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except BaseException:
                pass
        await self.stop_workers()
        if self._nc is not None:
            try:
                await asyncio.wait_for(self._nc.close(), 2)
            except Exception:
                pass
        if self.server is not None:
            await asyncio.to_thread(self.server.close)
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.close)

    # --- checks ---------------------------------------------------------------------------
    def check(self) -> DemoResult:
        reports: dict[str, Report] = {}
        failures: list[str] = []
        kills = Counter(t.what.split()[0] for t in self.takeovers if t.victim and not t.what.startswith(("add", "drop")))
        changes = sum(1 for t in self.takeovers if t.what.startswith(("add", "drop")))
        node_kills = kills.get("node", 0)
        for flavour in ("static", "elastic"):
            # a node kill may lose the acks in flight: at most one message per partition again
            partitions = STATIC_PARTITIONS if flavour == "static" else ELASTIC_PARTITIONS
            bound = kills.get(flavour, 0) + (changes if flavour == "elastic" else 0) + node_kills * partitions
            report = self.recorders[flavour].check(self.expected[flavour], redelivery_bound=bound)
            reports[flavour] = report
            failures += [f"{flavour}: {f}" for f in report.failures]
            failures += [f"{flavour}: {v.message}" for v in report.examples[:3]]
        for take in self.takeovers:
            if take.what.startswith(("static", "elastic")) and take.after is None:
                failures.append(f"{take.what}: no standby took over after {take.victim} was killed")
            if take.what.startswith("node") and take.after is None:
                failures.append(f"{take.what}: not every partition was handled again after the node was killed")
        if not any(t.what.startswith("static") for t in self.takeovers):
            failures.append("the static pinned instance was not killed")
        if not self.expected["static"] or not self.expected["elastic"]:
            failures.append("nothing was published")
        return DemoResult(exit_code=1 if failures else 0, reports=reports,
                          published={f: len(v) for f, v in self.expected.items()}, takeovers=list(self.takeovers),
                          failures=failures, elapsed=self.elapsed())

    # --- the live view --------------------------------------------------------------------
    def _rates(self, flavour: str, window: float = 2.0) -> dict[int, float]:
        now = time.time()
        rates: defaultdict[int, float] = defaultdict(float)
        for c in reversed(self.recorders[flavour].calls):
            if c.start < now - window - 5:
                break
            if c.outcome == "ack" and c.end is not None and c.end >= now - window:
                rates[c.partition] += 1 / window
        return rates

    def _group_table(self, flavour: str, *, caption: bool = True) -> Table:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        from pcgroups.partitions import balanced_assignment

        if flavour == "static":
            title = f"static group {STATIC_GROUP} on {STATIC_STREAM}: members {' '.join(STATIC_MEMBERS)}"
            if not caption:
                title += " (* pending: per member)"
            owners = balanced_assignment(STATIC_MEMBERS, STATIC_PARTITIONS)
            n = STATIC_PARTITIONS
        else:
            title = (f"elastic group {ELASTIC_GROUP} on {ELASTIC_STREAM}: members "
                     f"{' '.join(self.elastic_members) or '-'}")
            owners = balanced_assignment(self.elastic_members, ELASTIC_PARTITIONS)
            n = ELASTIC_PARTITIONS
        owner = {p: m for m, ps in owners.items() for p in ps}
        st = self.status.get(flavour)
        rates = self._rates(flavour)
        acked = self.acked[flavour]
        table = Table(title=title, title_justify="left", expand=False, box=box.SIMPLE_HEAD, padding=(0, 1),
                      show_edge=False)
        for col, just in (("partition", "right"), ("member", "left"), ("pinned instance", "left"),
                          ("msg/s", "right"), ("pending", "right"), ("acked", "right")):
            table.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
        for p in range(n):
            member = owner.get(p)
            pinned = self.pinned_worker(member) if member else None
            if member is None:
                pin_text = Text("-", style="dim")
            elif pinned is not None:
                standby = [w.name for w in self.workers.values() if w.member == member and w.alive and w is not pinned]
                pin_text = Text(pinned.name, style="bold cyan")
                if standby:
                    pin_text.append(f"  (standby {' '.join(standby)})", style="dim")
            else:
                waiting = [w.name for w in self.workers.values() if w.member == member and w.alive]
                pin_text = Text("waiting for the pin: " + " ".join(waiting) if waiting else "no instance",
                                style="yellow")
            pending = "-"
            if st is not None and p < len(st.partitions):
                row = st.partitions[p]
                if row.pending is not None:
                    pending = f"{row.pending}" + ("" if row.pending_exact else "*")
            rate = rates.get(p, 0) if pinned is not None else 0   # no pinned instance: nothing handles it now
            table.add_row(str(p), member or Text("unassigned", style="yellow"), pin_text, f"{rate:.0f}",
                          pending, str(acked.get(p, 0)))
        if flavour == "static" and caption:
            table.caption = "* pending: the member's partitions together"
            table.caption_justify = "left"
        return table

    def _instances_table(self) -> Table:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        table = Table(title="instances (one process each)", title_justify="left", box=box.SIMPLE_HEAD,
                      padding=(0, 1))
        for col in ("instance", "member", "pid", "state", "acked"):
            table.add_column(col, no_wrap=True)
        for w in self.workers.values():
            if w.state == "killed":
                state = Text("killed (SIGKILL)", style="bold red")
            elif not w.alive:
                state = Text(w.state, style="dim")
            elif w.pin:
                state = Text("pinned", style="bold cyan")
            elif w.flavour == "elastic" and w.member not in self.elastic_members:
                state = Text("not a member", style="dim")
            else:
                state = Text("standby", style="yellow")
            table.add_row(w.name, w.member, str(w.pid or "-"), state, str(self.acked[w.name][0]))
        return table

    def render(self) -> RenderableType:
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        plan = self.plan
        width, height = self.console.size
        header = Text()
        header.append("cg demo", style="bold")
        if self.server is not None and width >= 110:   # narrower: the first event says where it runs
            header.append(f"  nats-server {self.server.url}", style="dim")
        elif self.cluster is not None:
            up = " ".join(n.name if n.running else f"{n.name}(down)" for n in self.cluster.nodes)
            header.append(f"  3-node cluster: {up}", style="dim")
        header.append(f"  {self.elapsed():5.1f}s")
        if self.phase != "summary":   # the plan's bound: the run ends once the groups caught up
            header.append(f" (ends by {self.duration:g}s)", style="dim")
        if plan is not None:
            header.append(f"  {plan.rate:g} msg/s" if self.publishing else "  not publishing", style="dim")
        phases = self.phases
        current = phases.index(self.phase) if self.phase in phases else 0
        steps: Text | None = None
        if width < 110:   # the phase bar would wrap: the phase goes on the header line
            header.append(f"  phase {current + 1}/{len(phases)}: ", style="dim")
            header.append(self.phase, style="bold")
        else:
            steps = Text()
            for i, name in enumerate(phases):
                style = "green" if i < current else "bold reverse" if i == current else "dim"
                steps.append(f" {name} ", style=style)
                if i < len(phases) - 1:
                    steps.append("›", style="dim")
        wide = width >= 150
        groups: RenderableType
        if wide:
            groups = Table.grid(padding=(0, 3))
            groups.add_row(self._group_table("static", caption=True), self._group_table("elastic"))
            used = 10
        else:
            groups = Group(self._group_table("static", caption=False), self._group_table("elastic"))
            used = 7 + 9
        used += 1 + (steps is not None)
        instances: RenderableType | None = self._instances_table()
        room = height - used - 1
        if not wide:
            if room - 10 >= 5:
                room -= 10
            else:                     # a short terminal: the group tables and the events matter most
                instances = None
        panel = Panel(self._events_text(room - 2, width - 4 if not wide else width // 2), title="events",
                      title_align="left")
        parts: list[RenderableType] = [header, *([steps] if steps is not None else []), groups]
        if instances is not None and wide:
            bottom = Table.grid(padding=(0, 3))
            bottom.add_column(no_wrap=True)
            bottom.add_column(ratio=1)
            bottom.add_row(instances, panel)
            parts.append(bottom)
        else:
            if instances is not None:
                parts.append(instances)
            parts.append(panel)
        return Group(*parts)

    def _events_text(self, lines: int, width: int) -> Text:
        """The newest events that fit ``lines`` lines of ``width`` columns (a long event wraps)."""
        from rich.text import Text

        chosen: list[tuple[float, Text]] = []
        used = 0
        for t, text in reversed(self.events):
            need = -(-(8 + len(text.plain)) // max(width, 20))
            if chosen and used + need > max(lines, 2):
                break
            chosen.append((t, text))
            used += need
        log = Text()
        for t, text in reversed(chosen):
            log.append(f"{t:6.1f}s  ", style="dim")
            log.append_text(text)
            log.append("\n")
        log.rstrip()
        return log if log.plain else Text("-")

    def progress_line(self) -> None:
        from rich.text import Text

        now = time.monotonic()
        if self.phase == "setup" or now - self._last_progress < 2.0:
            return
        self._last_progress = now
        parts = []
        for flavour in ("static", "elastic"):
            done = len(self.recorders[flavour].acked_keys())
            parts.append(f"{flavour} acked {done}/{len(self.expected[flavour])}")
        pinned = []
        for member in (KILL_STATIC_MEMBER, KILL_ELASTIC_MEMBER):
            w = self.pinned_worker(member)
            pinned.append(f"{member}→{w.name if w else '-'}")
        self.console.print(Text(f"[{self.elapsed():6.1f}s] {self.phase}: {', '.join(parts)}; pinned "
                                f"{' '.join(pinned)}"), soft_wrap=True)

    async def refresh_loop(self, live) -> None:
        while True:
            if live is not None:
                live.update(self.render(), refresh=True)
            else:
                self.progress_line()
            await asyncio.sleep(0.25)

    # --- the summary ----------------------------------------------------------------------
    def print_summary(self, result: DemoResult) -> None:
        """The summary; into a pipe or a log without the spaces rich pads wrapped lines and titles with."""
        renderables = summary(result, self.plan.ack_wait if self.plan else None)
        if self.console.is_terminal:
            for renderable in renderables:
                self.console.print(renderable)
            return
        with self.console.capture() as cap:
            for renderable in renderables:
                self.console.print(renderable)
        self.console.file.write("".join(line.rstrip() + "\n" for line in cap.get().splitlines()))
        self.console.file.flush()


GROUP_NAMES = {"static": f"static {STATIC_GROUP}", "elastic": f"elastic {ELASTIC_GROUP}"}


def _counts_table(result: DemoResult) -> Table:
    """What the checker found, a column per group (narrow: fits 80 columns with room to spare)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False)
    table.add_column("", no_wrap=True)
    for flavour in result.reports:
        table.add_column(GROUP_NAMES[flavour], justify="right", no_wrap=True)
    rows: list[tuple[str, Any]] = [
        ("published", lambda f, r: str(result.published.get(f, 0))),
        ("processed (acked)", lambda f, r: str(r.processed)),
        ("handler calls", lambda f, r: str(r.calls)),
        ("redelivered (allowed)", lambda f, r: f"{r.redelivered} (≤ {r.redelivery_bound})"),
        ("lost", lambda f, r: str(r.lost)),
        ("overlapping calls", lambda f, r: str(r.overlaps)),
        ("out of order", lambda f, r: str(r.order_violations)),
        ("result", lambda f, r: Text("PASS", style="bold green") if r.ok else Text("FAIL", style="bold red")),
    ]
    for name, cell in rows:
        table.add_row(name, *(cell(f, r) for f, r in result.reports.items()))
    return table


def _moves_table(result: DemoResult) -> Table:
    """Each kill and each partition moved by a membership change, with how long until it was handled again."""
    from rich import box
    from rich.table import Table

    from .output import ranges

    table = Table(title="failover and hand-over", title_justify="left", box=box.SIMPLE_HEAD,
                  padding=(0, 1, 0, 0), pad_edge=False, show_edge=False)
    for col, justify in (("what", "left"), ("partitions", "left"), ("from", "left"), ("to", "left"),
                         ("after", "right")):
        table.add_column(col, justify=justify, no_wrap=col != "partitions", overflow="fold")  # type: ignore[arg-type]

    def took(after: float | None) -> str:
        return f"{after:.2f}s" if after is not None else "never"

    for t in result.takeovers:
        kind = t.what.split()[0]
        if not t.moves:
            what = f"SIGKILL pinned {t.what.split()[-1]}" if kind in ("static", "elastic") else t.what
            table.add_row(what, ranges(t.partitions) if t.partitions else "all", t.victim, t.by or "-", took(t.after))
            continue
        pairs: dict[tuple[str | None, str | None], list[Move]] = {}
        for m in t.moves:
            pairs.setdefault((m.src, m.dst), []).append(m)
        for (src, dst), ms in pairs.items():
            by = " ".join(sorted({m.by for m in ms if m.by})) or dst or "-"
            done = None if any(m.after is None for m in ms) else max(m.after or 0.0 for m in ms)
            table.add_row(t.what, ranges([m.partition for m in ms]), src or "-", by, took(done))
    return table


def summary(result: DemoResult, pinned_ttl: float | None) -> list[Any]:
    """The demo's last screen: the counts, what they mean, the hand-overs, the checks, the verdict."""
    from rich.text import Text

    kills = sum(1 for t in result.takeovers if not t.moves)
    changes = sum(1 for t in result.takeovers if t.moves)
    ttl = f" (about PinnedTTL, {pinned_ttl:g}s)" if pinned_ttl else ""
    explain = Text(
        "processed counts each message once; handler calls = processed + redelivered. A redelivery is a message "
        "handled again: the one a killed instance was working on, and the one in flight on a partition that "
        f"moved, so up to one per kill or membership change ({kills} kills, {changes} changes here). A standby "
        f"takes over a killed pinned instance after its pin expires{ttl}.", style="dim")
    parts: list[Any] = [Text("summary: every handler call checked by pcgroups.checker", style="bold"),
                        _counts_table(result), explain, _moves_table(result)]
    checks = [("no loss", all(r.lost == 0 for r in result.reports.values())),
              ("order of success per partition", all(r.order_violations == 0 for r in result.reports.values())),
              ("exclusivity (no overlapping calls on a partition)",
               all(r.overlaps == 0 for r in result.reports.values())),
              ("redeliveries within the bound (1 per kill or membership change)",
               all(r.redeliveries_ok for r in result.reports.values())),
              ("standby took over after each kill",
               all(t.after is not None for t in result.takeovers if t.what.startswith(("static", "elastic"))))]
    for name, ok in checks:
        line = Text("  ")
        line.append("✔ " if ok else "✘ ", style="bold green" if ok else "bold red")
        line.append(name)
        parts.append(line)
    parts += [Text(f"  {f}", style="red") for f in result.failures]
    verdict = "PASS: every check passed" if result.exit_code == 0 else "FAIL: some checks failed"
    parts.append(Text(f"{verdict} ({result.elapsed:.1f}s)", style="bold green" if result.exit_code == 0 else "bold red"))
    return parts


async def demo(*, duration: float = DEFAULT_DURATION, console: Console | None = None, rate: float = DEFAULT_RATE,
               ack_wait: float | None = None, work: float = 0.005, live: bool | None = None,
               cluster: bool = False) -> DemoResult:
    """Run the demo; returns what it found. ``live``: the live view (default: the console is a terminal);
    ``cluster``: on a 3-node cluster, with a node kill."""
    from rich.console import Console

    console = console or Console()
    d = Demo(duration=duration, console=console, rate=rate, ack_wait=ack_wait, work=work, live=live,
             cluster=cluster)
    live_ctx = None
    refresher: asyncio.Task | None = None
    try:
        if d.live_view:
            from rich.live import Live

            live_ctx = Live(d.render(), console=console, auto_refresh=False, transient=False,
                            redirect_stdout=False, redirect_stderr=False)
            live_ctx.start()
        refresher = asyncio.create_task(d.refresh_loop(live_ctx))
        await d.setup()
        await d.run()
        await d.stop_workers()      # every call ends and is recorded before the checks
        result = d.check()
        refresher.cancel()
        if live_ctx is not None:
            live_ctx.update(d.render(), refresh=True)
            live_ctx.stop()
            live_ctx = None
        d.print_summary(result)
        return result
    finally:
        if refresher is not None:
            refresher.cancel()
        if live_ctx is not None:
            live_ctx.stop()
        await d.cleanup()


async def run_demo(*, duration: float = DEFAULT_DURATION, console: Console | None = None,
                   rate: float = DEFAULT_RATE, ack_wait: float | None = None, live: bool | None = None,
                   cluster: bool = False) -> int:
    """Run the demo and return its exit code: 0 when every check passed, 1 otherwise."""
    from rich.console import Console
    from rich.text import Text

    console = console or Console()
    try:
        result = await demo(duration=duration, console=console, rate=rate, ack_wait=ack_wait, live=live,
                            cluster=cluster)
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception as e:  # setup failed (no nats-server binary, a port, ...): one clear line
        console.print(Text(f"cg demo: error: {e}", style="bold red"), soft_wrap=True)
        return 1
    return result.exit_code


def demo_command(
    duration: Annotated[str | None, typer.Option("--duration", metavar="DURATION",
                                                 help="the longest the demo runs: it ends once the groups caught up "
                                                      "after the traffic (a Go duration like 40s; "
                                                      "every phase scales with it; at least 8s; default "
                                                      f"{DEFAULT_DURATION:g}s, {CLUSTER_DURATION:g}s with "
                                                      "--cluster)")] = None,
    rate: Annotated[float, typer.Option("--rate", metavar="PER-SECOND",
                                        help=f"messages per second to publish, both streams together "
                                             f"({MIN_RATE:g} to {MAX_RATE:g})")] = DEFAULT_RATE,
    cluster: Annotated[bool, typer.Option("--cluster", help="run on a 3-node JetStream cluster (R3 streams) and "
                                                            "also SIGKILL the stream leader's node")] = False,
) -> None:
    """Run partitioned consumer groups on an embedded nats-server: a live view, a SIGKILL failover, elastic
    membership changes, and a summary that checks order, exclusivity and no loss."""
    from rich.console import Console

    from .common import parse_duration_option
    from .errors import CLIError

    if duration is None:
        duration = f"{CLUSTER_DURATION if cluster else DEFAULT_DURATION:g}s"
    seconds = parse_duration_option("--duration", duration, minimum=MIN_DURATION)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise CLIError(f"invalid --rate {rate:g}: must be between {MIN_RATE:g} and {MAX_RATE:g} messages per second")
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=80)  # a log or a pipe: the 80 columns the summary is made for
    try:
        code = asyncio.run(run_demo(duration=seconds, console=console, rate=rate, cluster=cluster))
    except KeyboardInterrupt:
        sys.stderr.write("cg demo: interrupted (every process it started was stopped)\n")
        raise typer.Exit(130) from None
    raise typer.Exit(code)


def register(app: "typer.Typer", name: str = "demo") -> None:
    """Add ``cg demo`` to the root app."""
    from .help import Command

    app.command(name, help=DEMO_HELP, cls=Command)(demo_command)


DEMO_HELP = ("run partitioned consumer groups on an embedded nats-server: live view, failover, membership "
             "changes and a checked summary")

__all__ = ["DEFAULT_DURATION", "DemoResult", "demo", "demo_command", "register", "run_demo"]

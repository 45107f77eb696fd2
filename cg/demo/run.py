"""The demo's run (:class:`Demo`): the server (or a 3-node cluster), the streams, the groups and the instance
processes; the traffic; the kills and the membership changes at the times of the :class:`~cg.demo.script.Plan`,
each timed until its partitions are handled again; catching up; then the checks of every handler call
(:mod:`pcgroups.testing._checker`). What it shows while it runs is :mod:`cg.demo.view`'s."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict, deque
from typing import TYPE_CHECKING, Any

from .instances import Worker
from .script import (
    CLUSTER_PHASES,
    ELASTIC_ADDED,
    ELASTIC_DROPPED,
    ELASTIC_FIRST,
    ELASTIC_GROUP,
    ELASTIC_PARTITIONS,
    ELASTIC_STREAM,
    INSTANCES,
    KEYS,
    KILL_ELASTIC_MEMBER,
    KILL_STATIC_MEMBER,
    MIN_DURATION,
    PHASES,
    STATIC_GROUP,
    STATIC_MEMBERS,
    STATIC_PARTITIONS,
    STATIC_STREAM,
    DemoResult,
    Move,
    Plan,
    Takeover,
    flavour_of,
)

if TYPE_CHECKING:
    from nats.aio.client import Client
    from rich.console import Console
    from rich.text import Text

    from pcgroups.jetstream import JetStreamApi
    from pcgroups.testing import EmbeddedCluster, EmbeddedServer, Report


class Demo:
    def __init__(
        self,
        *,
        duration: float,
        console: Console,
        rate: float,
        ack_wait: float | None,
        work: float,
        live: bool | None,
        cluster: bool = False,
    ):
        from pcgroups.testing import Recorder

        self.duration = max(duration, MIN_DURATION)
        self.cluster_mode = cluster
        self.cluster: EmbeddedCluster | None = None  # with --cluster
        self.url = ""
        self.phases = CLUSTER_PHASES if cluster else PHASES
        self.console = console
        self.rate = rate
        self.ack_wait_opt = ack_wait
        self.work = work
        self.live_view = console.is_terminal if live is None else live
        self.started = time.monotonic()
        self.t0_wall = 0.0  # wall time the traffic started
        self.plan: Plan | None = None
        self.server: EmbeddedServer | None = None
        self._nc: Client | None = None  # setup() connects
        self._api: JetStreamApi | None = None
        self.recorders = {"static": Recorder(), "elastic": Recorder()}
        self.expected: dict[str, list[int]] = {"static": [], "elastic": []}
        self.acked: dict[str, Counter[int]] = defaultdict(Counter)  # per flavour: partition -> acks; per instance: 0
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

        from pcgroups import JetStreamApi, PartitioningFilter, add_members, create_elastic, create_static
        from pcgroups.testing import EmbeddedCluster, EmbeddedServer

        if self.cluster_mode:
            self.cluster = EmbeddedCluster(size=3)
            await asyncio.to_thread(self.cluster.start)
            self.url = self.cluster.url
            self.log_dir = self.cluster._tmp.name if self.cluster._tmp else ""
            self.event(
                f"3-node nats-server cluster on {self.url} (meta leader {self.cluster.meta_leader()}, "
                f"stores under {self.log_dir})"
            )
        else:
            self.server = EmbeddedServer()
            await asyncio.to_thread(self.server.start)
            self.url = self.server.url
            self.log_dir = self.server.store_dir
            self.event(f"nats-server on {self.server.url} (store {self.server.store_dir})")
        self._nc = await nats.connect(
            servers=self.url.split(","), max_reconnect_attempts=-1, reconnect_time_wait=0.2, name="cg-demo"
        )
        self._api = JetStreamApi(self._nc)
        js = self.nc.jetstream()
        replicas = 3 if self.cluster_mode else 1
        await js.add_stream(
            StreamConfig(
                name=STATIC_STREAM,
                subjects=[f"{STATIC_STREAM}.*"],
                num_replicas=replicas,
                subject_transform=SubjectTransform(
                    src=f"{STATIC_STREAM}.*",
                    dest=f"{{{{partition({STATIC_PARTITIONS},1)}}}}.{STATIC_STREAM}.{{{{wildcard(1)}}}}",
                ),
            )
        )
        await js.add_stream(StreamConfig(name=ELASTIC_STREAM, subjects=[f"{ELASTIC_STREAM}.*"], num_replicas=replicas))
        await create_static(
            self.nc, STATIC_STREAM, STATIC_GROUP, STATIC_PARTITIONS, members=STATIC_MEMBERS, api=self.api
        )
        await create_elastic(
            self.nc,
            ELASTIC_STREAM,
            ELASTIC_GROUP,
            ELASTIC_PARTITIONS,
            partitioning_filters=[PartitioningFilter(f"{ELASTIC_STREAM}.*", [1])],
            api=self.api,
        )
        await add_members(self.nc, ELASTIC_STREAM, ELASTIC_GROUP, ELASTIC_FIRST, api=self.api)
        self.event(
            f"stream {STATIC_STREAM} ({STATIC_PARTITIONS} partitions by key), static group {STATIC_GROUP}: "
            f"members {' '.join(STATIC_MEMBERS)}"
        )
        self.event(
            f"stream {ELASTIC_STREAM}, elastic group {ELASTIC_GROUP} ({ELASTIC_PARTITIONS} partitions): "
            f"members {' '.join(ELASTIC_FIRST)}"
        )
        span = self.duration - self.elapsed() - 1.5  # what is left after setup and the instances' start
        self.plan = Plan.make(
            span, rate=self.rate, ack_wait=self.ack_wait_opt, work=self.work, cluster=self.cluster_mode
        )
        for flavour, member, name in INSTANCES:
            self.workers[name] = Worker(self, flavour, member, name)
        await asyncio.gather(*(w.start(self.url, self.log_dir, self.plan) for w in self.workers.values()))
        try:
            await asyncio.wait_for(asyncio.gather(*(w.ready.wait() for w in self.workers.values())), 20)
        except TimeoutError:
            late = [w.name for w in self.workers.values() if not w.ready.is_set()]
            raise RuntimeError(f"instances did not start: {', '.join(late)} (logs in {self.log_dir})") from None
        self.event(
            f"{len(self.workers)} instances running as processes: "
            + ", ".join(f"{w.name}" for w in self.workers.values())
            + f" (AckWait = PinnedTTL = {self.plan.ack_wait:g}s, max_ack_pending 1)"
        )

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
        from pcgroups.ops import elastic_status, static_status

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
        flavour = flavour_of(member)
        if victim is None:
            self.event(f"no pinned instance of {member} to kill", "red")
            return Takeover(f"{flavour} {member}", time.time())
        from pcgroups.partitions import balanced_assignment

        at = victim.kill()
        self.event(f"SIGKILL {victim.name} (pid {victim.pid}), the pinned instance of {member}", "bold red")
        members, n = (
            (STATIC_MEMBERS, STATIC_PARTITIONS) if flavour == "static" else (self.elastic_members, ELASTIC_PARTITIONS)
        )
        take = Takeover(
            f"{flavour} {member}", at, victim=victim.name, partitions=balanced_assignment(members, n).get(member, [])
        )
        self.takeovers.append(take)
        self._tasks.append(asyncio.create_task(victim.settle_kill()))
        self._tasks.append(asyncio.create_task(self._watch_takeover(take, member, exclude={victim.name})))
        return take

    async def _watch_takeover(self, take: Takeover, member: str, *, exclude: set[str]) -> None:
        """A kill: until another instance of ``member`` starts a message."""
        assert self.plan is not None
        rec = self.recorders[flavour_of(member)]
        seen = 0  # calls looked at so far (the record only grows)
        first = None
        while True:
            calls = rec.calls[seen:]
            seen += len(calls)
            for c in calls:
                if (
                    c.start > take.at
                    and c.instance not in exclude
                    and c.member == member
                    and (first is None or c.start < first.start)
                ):
                    first = c
            if first is not None:
                take.after = first.start - take.at
                take.by = first.instance
                self.event(
                    f"{first.instance} took over {member} {take.after:.2f}s after the kill "
                    f"(PinnedTTL {self.plan.ack_wait:g}s)",
                    "bold green",
                )
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
        self.event(
            f"{take.what}: every moved partition handled by its new owner within {take.after:.2f}s ("
            + ", ".join(f"{m.partition} by {m.by} {m.after:.2f}s" for m in take.moves)
            + ")",
            "green",
        )

    async def _change(self, what: str, victim: str, change: Any) -> None:
        """Add or drop an elastic member (``change`` writes it and returns the new members); reports and
        watches every partition that moved, not only the member's own."""
        from pcgroups.partitions import balanced_assignment

        from ..changes import describe_moves, moves

        before = balanced_assignment(self.elastic_members, ELASTIC_PARTITIONS)
        at = time.time()
        self.elastic_members = await change()
        found = moves(before, balanced_assignment(self.elastic_members, ELASTIC_PARTITIONS))
        self.event(
            f"elastic {what}: members {' '.join(self.elastic_members)}; partitions moved: {describe_moves(found)}",
            "bold yellow",
        )
        take = Takeover(what, at, victim=victim, moves=[Move(p, src, dst) for src, dst, ps in found for p in ps])
        self.takeovers.append(take)
        self._tasks.append(asyncio.create_task(self._watch_moves(take)))

    async def add_member(self) -> None:
        from pcgroups import add_members

        await self._change(
            f"add {ELASTIC_ADDED}",
            ELASTIC_ADDED,
            lambda: add_members(self.nc, ELASTIC_STREAM, ELASTIC_GROUP, [ELASTIC_ADDED], api=self.api),
        )

    async def drop_member(self) -> None:
        from pcgroups import delete_members

        await self._change(
            f"drop {ELASTIC_DROPPED}",
            ELASTIC_DROPPED,
            lambda: delete_members(self.nc, ELASTIC_STREAM, ELASTIC_GROUP, [ELASTIC_DROPPED], api=self.api),
        )

    async def kill_node(self) -> None:
        """--cluster: SIGKILL the node leading the orders stream; once every partition of both groups is
        handled again, restart it."""
        from pcgroups.testing import stream_leader

        assert self.cluster is not None
        try:
            name = stream_leader(await self.api.stream_info(STATIC_STREAM)) or self.cluster.meta_leader()
        except Exception:
            name = None
        node = self.cluster.node(name) if name else self.cluster.nodes[0]
        at = time.time()
        self.cluster.kill(node)
        self.event(
            f"SIGKILL nats-server {node.name} (port {node.port}), the leader of stream {STATIC_STREAM}", "bold red"
        )
        take = Takeover(f"node {node.name}", at, victim=node.name)
        self.takeovers.append(take)
        self._tasks.append(asyncio.create_task(self._watch_node(take, node)))

    async def _watch_node(self, take: Takeover, node: Any) -> None:
        parts = {"static": STATIC_PARTITIONS, "elastic": ELASTIC_PARTITIONS}
        while True:
            starts = [
                self.recorders[f].first_start(after=take.at, partition=p) for f, n in parts.items() for p in range(n)
            ]
            firsts = [t for t in starts if t is not None]
            if len(firsts) == len(starts):
                take.after = max(firsts) - take.at
                take.by = "every partition"
                self.event(
                    f"every partition of both groups handled again {take.after:.2f}s after the node kill "
                    f"(new leaders elected)",
                    "bold green",
                )
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
        self.event(f"publishing {plan.rate:g} msg/s to {STATIC_STREAM}.* and {ELASTIC_STREAM}.* ({KEYS} keys each)")
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
        self.event(
            f"stopped publishing: {len(self.expected['static'])} to {STATIC_STREAM}, "
            f"{len(self.expected['elastic'])} to {ELASTIC_STREAM}; waiting for the groups to catch up"
        )
        deadline = t0 + plan.span + plan.grace
        while not self.caught_up() and time.monotonic() < deadline:  # noqa: ASYNC110 - the readers of the instances fill the records
            await asyncio.sleep(0.1)
        if self.caught_up():
            self.event(f"caught up {time.monotonic() - t0 - plan.stop_traffic:.2f}s after the traffic stopped", "green")
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
        kills = Counter(
            t.what.split()[0] for t in self.takeovers if t.victim and not t.what.startswith(("add", "drop"))
        )
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
        return DemoResult(
            exit_code=1 if failures else 0,
            reports=reports,
            published={f: len(v) for f, v in self.expected.items()},
            takeovers=list(self.takeovers),
            failures=failures,
            elapsed=self.elapsed(),
        )

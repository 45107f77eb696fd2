"""Chaos scenarios against real nats-servers, every member instance its own process.

usage: python -m tests.chaos [--long | --runs N] [--only NAME[,NAME...]] [--json PATH] [-v]
       python -m tests.chaos worker URL static|elastic STREAM GROUP MEMBER INSTANCE [options]   (one instance)
       python -m tests.chaos evidence      (the server-restart limit reproduced with nats-py alone)
       PCG_CHAOS_UNFENCED=1 python -m tests.chaos --only sigstop-buffered   (workers without the check of
       the pin after a pause, for comparison)
       PCG_CHAOS_KEEP_LOGS=DIR python -m tests.chaos ...   (the instances' logs copied to DIR/<scenario>)

Each scenario starts its own nats-server (file storage, 127.0.0.1), creates its groups, starts member
instances as subprocesses (``worker`` below), publishes continuously, injects its fault ``runs`` times,
then stops publishing, waits until every published message was acked, stops every process it started
and checks the record of all handler calls with :class:`pcgroups.testing._checker.Recorder`: nothing lost, order
of success per partition, no two calls overlapping on one partition, redeliveries within the stated
bound. Every wait is bounded; a scenario that overruns its limit fails.

Scenarios (CI size / ``--long`` size, in fault injections):

- ``sigkill-static``, ``sigkill-elastic``: SIGKILL of member m1's pinned instance under traffic, a new
  instance started each time (3 / 20);
- ``sigstop-static``, ``sigstop-elastic``: SIGSTOP of m1's pinned instance for 2.5 x PinnedTTL, then
  SIGCONT: the paused instance must start nothing once resumed (its pin moved); the overlap of its
  in-flight handler with the successor is measured (1 / 10); ``sigstop-buffered``: the same with
  max_ack_pending 8, so that the paused instance holds buffered messages (1 / 5); ``sigstop-keyed``: the
  same with key-level concurrency 4 (exclusivity and order checked per key) (1 / 5);
- ``server-restart``: the nats-server (file storage) stopped and started again mid-run, SIGTERM and
  SIGKILL alternately; static and elastic instances reconnect and continue (2 / 6);
- ``membership``: add, drop and member-mapping changes of an elastic group under traffic (12 / 50);
- ``stepdown-storm``: step-downs of static and elastic m1 (3 instances each) in quick succession (8 / 50);
- ``stepdown-keyed``: single step-downs of m1 (2 instances, key-level concurrency 4, 0.2 s calls) 1.5 s apart in
  static and elastic groups: exclusivity and order checked per key (4 / 20);
- ``replay-static``, ``replay-elastic``: one key's messages always fail (``--max-deliver 3 --park-keys``): the first is
  dead-lettered, the later ones follow it without running, while its owner's pinned instance is SIGKILLed (the
  first time while the first one is retried); then the handler is fixed and every dead letter replayed under
  traffic: each runs once, in order, and the dead-letter stream empties (2 / 10);
- ``slow-handler``: handlers running 1.6 x AckWait: one calling ``msg.in_progress()`` (auto progress
  off), one relying on pcgroups' automatic ``+WPI``, one with neither (4 / 12 messages each).
- ``partition-static``, ``partition-elastic``: m1's pinned instance cut off from its server (its own fault
  proxy, tests/helpers/faultproxy.py, blackholed) 0.1 s into a 1.5 s handler call, for 2.5 x PinnedTTL, then healed:
  the standby takes over, the cut-off call learns it was superseded and does not ack, the healed instance starts
  nothing (1 / 10);
- ``slow-link``: 200 ms more latency each way under m1's pinned instance for 4 s: it keeps the pin (1 / 5);
- ``server-closes``: every instance's connection closed every 2 s (static and elastic groups) (2 / 20);
- ``cluster-partition``: a 3-node cluster whose routes pass through fault proxies; n3's routes blackholed
  (process alive) until every instance connected to it moved to n1 or n2, then healed (1 / 3).
- ``poison-static``, ``poison-elastic``: a message that always fails (strict path, park_keys, m1: 2 instances): the
  pinned instance SIGKILLed while it retries it, then while it moves a parked key's message to the dead-letter
  stream (between the PubAck and the +TERM); nothing lost, nothing dead-lettered twice, order kept (1 / 5).
- ``pool-*``: the worker pool (a dispatching member, worker processes): a worker SIGKILLed, SIGSTOPped, started and
  stopped; the pinned dispatcher SIGKILLed (0.2 s and 2.5 s calls) or SIGSTOPped (one key, mid-burst); the server
  restarted under one or two dispatchers (docs/RELIABILITY.md, *Key-level step-downs and the worker pool*).

Times are ``time.time()`` in every process. Take-over: from the fault (for a restart: from the server
being back) until every affected partition has started a handler call again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACK_WAIT = 1.0  # PinnedTTL = max(AckWait, 1 s) = 1 s
PARTITIONS = 4
RATE = 40.0  # messages per second per group
GROUP = "g"


# ============================================================== the member instance (a subprocess)
def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def worker_main(argv: list[str]) -> None:
    import nats

    from pcgroups import ConsumerConfig, elastic_consume, static_consume
    from pcgroups.testing._checker import event_line, origin_of

    p = argparse.ArgumentParser(prog="python -m tests.chaos worker")
    p.add_argument("url")
    p.add_argument("flavour", choices=["static", "elastic"])
    p.add_argument("stream")
    p.add_argument("group")
    p.add_argument("member")
    p.add_argument("instance")
    p.add_argument("--ack-wait", type=float, default=ACK_WAIT)
    p.add_argument("--work", type=float, default=0.0, help="seconds each handler call works")
    p.add_argument(
        "--slow",
        type=float,
        default=0.0,
        help="seconds a call works on a message whose data starts "
        "with 'slow' (the partition scenarios' call in flight)",
    )
    p.add_argument("--window", type=int, default=1, help="max_ack_pending")
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="key-level concurrency (keys: the subjects); calls are then recorded per key, not per "
        "partition (partition 1000 x p + key number), the unit of exclusivity and order",
    )
    p.add_argument(
        "--progress",
        choices=["auto", "call", "none"],
        default="auto",
        help="auto: pcgroups sends +WPI; call: the handler calls msg.in_progress() (auto off); none: neither",
    )
    p.add_argument("--dispatch", action="store_true", help="a dispatching instance: the pool's workers handle")
    p.add_argument("--pool-worker", action="store_true", help="a worker of the group's pool (INSTANCE: its name)")
    p.add_argument("--capacity", type=int, default=1, help="a pool worker's capacity")
    p.add_argument(
        "--superseded-at-end",
        action="store_true",
        help="look at msg.superseded only when the work is done (as cg's handler), not during it",
    )
    p.add_argument(
        "--sample",
        type=float,
        default=0.0,
        help="every so many seconds a line of what the process costs (tests/helpers/sampler.py; 0: none)",
    )
    p.add_argument("--fail", default="", help="the handler raises on a message whose data starts with this")
    p.add_argument("--max-deliver", type=int, default=5, help="RetryPolicy.max_deliver")
    p.add_argument("--backoff", type=float, default=0.1, help="RetryPolicy.backoff")
    p.add_argument("--park-keys", action="store_true", help="RetryPolicy.park_keys")
    p.add_argument(
        "--store-pause",
        type=float,
        default=0.0,
        help="seconds between a dead letter's PubAck and the +TERM of its message (a 'stored' line says when)",
    )
    args = p.parse_args(argv)
    member, instance = args.member, args.instance
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")

    async def on_reconnect() -> None:
        _emit(json.dumps({"ev": "reconnected", "t": time.time()}))

    # URLs in the order given (a cluster scenario picks each instance's first server)
    nc = await nats.connect(
        servers=args.url.split(","),
        dont_randomize=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.1,
        connect_timeout=2,
        reconnected_cb=on_reconnect,
        name=f"{args.stream}/{instance}",
    )

    keyed = args.concurrency > 1 or args.dispatch or args.pool_worker

    failing = args.fail.encode()

    async def handler(msg) -> None:
        subject, origin = origin_of(msg)
        if failing and msg.data.startswith(failing):
            _emit(json.dumps({"ev": "failed", "data": msg.data.decode(), "t": time.time()}))
            raise ValueError(msg.data.decode())
        # key and order: the origin stream sequence; seq: the sequence it was delivered with (work queue's, elastic)
        unit = 1000 * msg.partition + int(subject.rsplit(".k", 1)[1]) if keyed else msg.partition
        ids = dict(
            member=member,
            instance=instance,
            partition=unit,
            key=origin,
            order=origin,
            seq=msg.sequence,
            subject=subject,
        )
        # when the instance decided to hand this message out (a SIGSTOP may fall between that and this line)
        if "Pcg-Replayed" in (msg.headers or {}):  # a dead letter replayed: said apart (the replay scenarios)
            await msg.ack()
            _emit(json.dumps({"ev": "replayed", "data": msg.data.decode(), "t": time.time()}))
            return
        _emit(json.dumps({"ev": "dispatch", "key": origin, "t": time.time() - (time.monotonic() - msg.started)}))
        _emit(event_line("start", **ids, deliveries=msg.metadata.num_delivered or 1))
        deadline = time.monotonic() + (args.slow if msg.data.startswith(b"slow") else args.work)
        last_wpi = time.monotonic()
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(0.05, left))
            if msg.superseded and not args.superseded_at_end:
                break
            if args.progress == "call" and time.monotonic() - last_wpi >= args.ack_wait / 3:
                await msg.in_progress()
                last_wpi = time.monotonic()
        if msg.superseded:
            # our pin moved (or may have, after a pause): the new pin holder handles it; no ack
            _emit(event_line("end", **ids, outcome="superseded"))
            return
        await msg.ack()
        # printed once the ack is handed to the client, before the server can see it
        _emit(event_line("end", **ids, outcome="ack"))

    if args.store_pause:
        from pcgroups.consume._dead import DeadLetters

        store = DeadLetters.store

        async def paused(self, m, key, reason, deliveries, *, lane, parked):  # type: ignore[no-untyped-def]
            await store(self, m, key, reason, deliveries, lane=lane, parked=parked)
            _emit(json.dumps({"ev": "stored", "data": m.data.decode(), "parked": parked, "t": time.time()}))
            await asyncio.sleep(args.store_pause)  # stored, not yet terminated

        DeadLetters.store = paused  # type: ignore[method-assign]

    if os.environ.get("PCG_CHAOS_UNFENCED") == "1":
        # for comparison only (docs/RELIABILITY.md): without the check of the pin after a pause
        from pcgroups.consume._delivery import Delivery

        Delivery.pin_doubtful = lambda self: False

    def said(ev) -> None:
        _emit(json.dumps({"ev": "state", "kind": ev.kind, "detail": ev.detail, "t": time.time()}))

    if args.pool_worker:
        from pcgroups import serve_worker

        inst = await serve_worker(
            nc,
            args.flavour,
            args.stream,
            args.group,
            handler,
            name=instance,
            capacity=args.capacity,
            ack_wait=args.ack_wait,
            auto_in_progress=args.progress == "auto",
            on_event=said,
        )
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, inst.stop)
        await inst.wait_for_consuming(30)
    else:
        from pcgroups import RetryPolicy

        consume = static_consume if args.flavour == "static" else elastic_consume
        pool = {"dispatch": True, "max_in_flight": args.concurrency if args.concurrency > 1 else 0, "on_event": said}
        inst = await consume(
            nc,
            args.stream,
            args.group,
            member,
            None if args.dispatch else handler,
            config=ConsumerConfig(max_ack_pending=args.window, ack_wait=args.ack_wait),
            auto_in_progress=args.progress == "auto",
            retry=RetryPolicy(max_deliver=args.max_deliver, backoff=args.backoff, park_keys=args.park_keys),
            **(pool if args.dispatch else {"concurrency": args.concurrency}),
        )
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, inst.stop)
    _emit(json.dumps({"ev": "ready", "t": time.time()}))
    sampler = None
    if args.sample:
        from .helpers.sampler import sample_forever

        def state() -> str:
            return ("pinned" if inst.pinned else "standby") if inst.partitions else "idle"

        sampler = asyncio.create_task(sample_forever(args.sample, _emit, state=state))
    err = await inst.done()
    if sampler is not None:
        sampler.cancel()
    _emit(json.dumps({"ev": "done", "error": str(err) if err else None, "t": time.time()}))
    await nc.close()


# ============================================================== the harness
def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))
    return s[k]


@dataclass
class Result:
    """One scenario's figures (a table row) and its checker report."""

    scenario: str
    runs: int = 0  # fault injections
    messages: int = 0  # messages published (each must be acked)
    lost: int = 0
    redelivered: int = 0  # handler calls beyond the first per message
    redelivery_bound: int | None = None
    duplicates: int = 0  # messages acked more than once
    overlaps: int = 0
    order_violations: int = 0
    takeover: list[float] = field(default_factory=list)
    seconds: float = 0.0
    overlap_note: str = ""  # what the overlaps (or order violations) are, when they are expected
    redelivered_note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)

    @property
    def takeover_p50(self) -> float | None:
        return percentile(self.takeover, 50)

    @property
    def takeover_p99(self) -> float | None:
        return percentile(self.takeover, 99)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(takeover_p50=self.takeover_p50, takeover_p99=self.takeover_p99, ok=self.ok)
        return d


class Worker:
    """One member instance process and what it printed."""

    def __init__(self, group: Group, member: str, name: str, proc: asyncio.subprocess.Process):
        self.group, self.member, self.name, self.proc = group, member, name, proc
        self.ready = asyncio.Event()
        self.ended: str | None = None  # the 'done' line's error, or why it ended
        self.killed_at: float | None = None
        self.stopped = False
        self.reconnects = 0
        self.reconnected_at: list[float] = []
        self.dispatched: dict[Any, float] = {}  # message key -> when the instance last handed it out
        self.state: str | None = None  # its last instance event (pool scenarios): pinned, ...
        self.samples: list[dict[str, Any]] = []  # what the process costs over time (--sample)
        self.started_at = time.time()
        self.reader: asyncio.Task | None = None
        self.proxy: Any = None  # its tests.helpers.faultproxy.FaultProxy, when it connects through one
        self.marks: list[dict[str, Any]] = []  # its 'failed' and 'stored' lines (the poison scenario)

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and self.killed_at is None


class Group:
    """One consumer group under test: its stream, the record of its handler calls, what was published."""

    def __init__(
        self,
        env: Env,
        flavour: str,
        stream: str,
        partitions: int,
        *,
        work: float,
        window: int,
        progress: str,
        concurrency: int = 1,
        slow: float = 0.0,
        proxied: bool = False,
        sample: float = 0.0,
    ):
        from pcgroups.testing._checker import Recorder

        self.env, self.flavour, self.stream, self.partitions = env, flavour, stream, partitions
        self.work, self.window, self.progress, self.concurrency = work, window, progress, concurrency
        self.slow, self.proxied, self.sample = slow, proxied, sample
        self.rec = Recorder()
        self.expected: set[int] = set()
        self.workers: list[Worker] = []
        self.keys = self._keys()
        self.sent = 0
        self.poison: str | None = None  # a key whose messages the publisher marks 'poison-<n>' (the replay scenarios)
        self.published: dict[int, tuple[str, str]] = {}  # stream sequence -> (key, data), by the publisher
        self.replayed: list[str] = []  # the data of each replayed dead letter handled, in order

    def _keys(self) -> list[str]:
        """Subject keys, 4 per partition, in round-robin partition order (every partition gets traffic)."""
        from pcgroups import partition_of_subject

        by: dict[int, list[str]] = {p: [] for p in range(self.partitions)}
        i = 0
        while min(len(v) for v in by.values()) < 4:
            by[partition_of_subject(f"{self.stream}.k{i}", self.partitions, [1], f"{self.stream}.*")].append(f"k{i}")
            i += 1
        return [by[p][j] for j in range(4) for p in range(self.partitions)]

    def alive(self, member: str | None = None) -> list[Worker]:
        return [w for w in self.workers if w.alive and (member is None or w.member == member)]

    def active(self, member: str) -> Worker | None:
        """The member's instance that started the latest call (the pinned one, with max_ack_pending 1)."""
        live = {w.name: w for w in self.alive(member)}
        for c in reversed(list(self.rec.calls)):
            if c.instance in live:
                return live[c.instance]
        return None

    def partitions_of(self, member: str, *, window: float = 2.0) -> set[int]:
        """Partitions whose latest call (within ``window`` s) was the member's."""
        since = time.time() - window
        latest: dict[int, Any] = {}
        for c in list(self.rec.calls):
            if c.start >= since:
                latest[c.partition] = c
        return {p for p, c in latest.items() if c.member == member}

    def first_start(self, partition: int, after: float, *, exclude: str | None = None) -> float | None:
        starts = [
            c.start
            for c in list(self.rec.calls)
            if c.partition == partition and c.start > after and c.instance != exclude
        ]
        return min(starts) if starts else None


class Env:
    """A nats-server of its own, groups on it, member processes, a publisher; everything cleaned up."""

    def __init__(self, name: str, *, verbose: bool = False):
        self.name = name
        self.verbose = verbose
        self.tmp = tempfile.TemporaryDirectory(prefix=f"pcg-chaos-{name}-")
        self.server = None
        self.nc = None
        self.groups: list[Group] = []
        self.publishing = False
        self._pub_task: asyncio.Task | None = None
        self.pub_stalled = 0.0
        self._n = 0
        self.proxies: list[Any] = []  # fault proxies between instances and the server, closed last

    # --- lifecycle --------------------------------------------------------------------------
    async def __aenter__(self) -> Env:
        import nats

        from pcgroups.testing._server import EmbeddedServer

        self.server = EmbeddedServer(store_dir=os.path.join(self.tmp.name, "server"))
        os.makedirs(self.server.store_dir, exist_ok=True)
        await asyncio.to_thread(self.server.start)

        async def quiet(e: Exception) -> None:  # the restart scenario's reconnects are expected
            self.log(f"harness connection: {e!r}")

        self.nc = await nats.connect(
            self.server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1, connect_timeout=2, error_cb=quiet
        )
        return self

    replicas = 1

    async def _close_servers(self) -> None:
        await asyncio.to_thread(self.server.close)

    async def __aexit__(self, *exc) -> None:
        self.publishing = False
        if self._pub_task is not None:
            self._pub_task.cancel()
            await asyncio.gather(self._pub_task, return_exceptions=True)
        await self.stop_workers()
        for proxy in self.proxies:
            await proxy.close()
        try:
            await self.nc.close()
        except Exception:
            pass
        await self._close_servers()
        keep = os.environ.get("PCG_CHAOS_KEEP_LOGS")
        if keep:  # the instances' logs, for a closer look at a run
            import shutil

            shutil.copytree(
                self.tmp.name,
                os.path.join(keep, self.name),
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("server", "n1", "n2", "n3"),
            )
        self.tmp.cleanup()

    def log(self, text: str) -> None:
        if self.verbose:
            print(f"  [{self.name} {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    # --- groups and instances ---------------------------------------------------------------
    async def group(
        self,
        flavour: str,
        members: dict[str, int],
        *,
        partitions: int = PARTITIONS,
        work: float = 0.002,
        window: int = 1,
        progress: str = "auto",
        add: list[str] | None = None,
        concurrency: int = 1,
        slow: float = 0.0,
        proxied: bool = False,
        url_of: Callable[[str, int], str] | None = None,
        dispatch: bool = False,
        sample: float = 0.0,
    ) -> Group:
        """A group on a stream of its own: ``members`` maps member -> instance count (all started). ``proxied``:
        each instance connects through a fault proxy of its own (``Worker.proxy``); ``url_of(member, k)``: the
        server URL(s) of the member's k-th instance; ``sample``: each instance reports what it costs every so
        many seconds (``Worker.samples``)."""
        from nats.js.api import StreamConfig, SubjectTransform

        from pcgroups import PartitioningFilter, add_members, create_elastic, create_static

        self._n += 1
        s = f"{self.name.replace('-', '')}{self._n}"
        js = self.nc.jetstream()
        if flavour == "static":
            await js.add_stream(
                StreamConfig(
                    name=s,
                    subjects=[f"{s}.*"],
                    duplicate_window=120,
                    num_replicas=self.replicas,
                    subject_transform=SubjectTransform(
                        src=f"{s}.*", dest=f"{{{{partition({partitions},1)}}}}.{s}.{{{{wildcard(1)}}}}"
                    ),
                )
            )
            await create_static(self.nc, s, GROUP, partitions, members=list(members))
        else:
            await js.add_stream(
                StreamConfig(name=s, subjects=[f"{s}.*"], duplicate_window=120, num_replicas=self.replicas)
            )
            await create_elastic(
                self.nc, s, GROUP, partitions, partitioning_filters=[PartitioningFilter(f"{s}.*", [1])]
            )
            await add_members(self.nc, s, GROUP, list(members) if add is None else add)
        g = Group(
            self,
            flavour,
            s,
            partitions,
            work=work,
            window=window,
            progress=progress,
            concurrency=concurrency,
            slow=slow,
            proxied=proxied,
            sample=sample,
        )
        self.groups.append(g)
        for member, count in members.items():
            for k in range(count):
                await self.spawn(
                    g, member, url_of(member, k) if url_of else None, extra=("--dispatch",) if dispatch else ()
                )
        await self.wait_ready(g.workers)
        return g

    async def spawn(
        self, g: Group, member: str, url: str | None = None, *, extra: tuple[str, ...] = (), name: str | None = None
    ) -> Worker:
        name = name or f"{member}-{sum(1 for w in g.workers if w.member == member)}"
        proxy = None
        if g.proxied and url is None:
            from .helpers.faultproxy import FaultProxy

            proxy = await FaultProxy(self.server.port, name=name).start()
            self.proxies.append(proxy)
            url = proxy.url
        with open(self.log_path(g, name), "w") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.chaos",
                "worker",
                url or self.server.url,
                g.flavour,
                g.stream,
                GROUP,
                member,
                name,
                "--ack-wait",
                str(ACK_WAIT),
                "--work",
                str(g.work),
                "--slow",
                str(g.slow),
                "--window",
                str(g.window),
                "--progress",
                g.progress,
                "--concurrency",
                str(g.concurrency),
                "--sample",
                str(g.sample),
                *extra,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                cwd=ROOT,
                env={k: v for k, v in os.environ.items() if not k.startswith("NATS_")},
            )
        w = Worker(g, member, name, proc)
        w.proxy = proxy
        w.reader = asyncio.create_task(self._read(w))
        g.workers.append(w)
        return w

    async def pool_worker(self, g: Group, name: str, capacity: int = 1, *extra: str) -> Worker:
        """A worker of ``g``'s pool (its calls are recorded with instance ``name``, member ``pool``)."""
        return await self.spawn(g, "pool", name=name, extra=("--pool-worker", "--capacity", str(capacity), *extra))

    def log_path(self, g: Group, name: str) -> str:
        return os.path.join(self.tmp.name, f"{g.stream}-{name}.log")

    def log_of(self, w: Worker) -> str:
        try:
            with open(self.log_path(w.group, w.name), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    async def _read(self, w: Worker) -> None:
        while True:
            line = await w.proc.stdout.readline()
            if not line:
                break
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            kind = ev.get("ev")
            if kind in ("start", "end"):
                w.group.rec.feed(ev)
            elif kind == "dispatch":
                w.dispatched[ev.get("key")] = float(ev.get("t", 0.0))
            elif kind == "replayed":
                w.group.replayed.append(str(ev.get("data")))
            elif kind == "ready":
                w.ready.set()
            elif kind == "state":
                w.state = ev.get("kind")
            elif kind == "sample":
                w.samples.append(ev)
            elif kind in ("failed", "stored"):
                w.marks.append(ev)
            elif kind == "reconnected":
                w.reconnects += 1
                w.reconnected_at.append(float(ev.get("t", 0.0)))
            elif kind == "done":
                w.ended = ev.get("error") or "ended"
        if w.ended is None and w.killed_at is None:
            w.ended = f"exited ({await w.proc.wait()})"

    async def wait_ready(self, workers: list[Worker], timeout: float = 30.0) -> None:
        await bounded(asyncio.gather(*(w.ready.wait() for w in workers)), timeout, "instances ready")

    async def kill(self, w: Worker) -> float:
        """SIGKILL; its running call ends now (recorded as killed)."""
        t = time.time()
        w.killed_at = t
        w.proc.send_signal(signal.SIGKILL)
        await w.proc.wait()
        w.group.rec.close_instance(w.name, t=t)
        return t

    async def stop_workers(self) -> None:
        workers = [w for g in self.groups for w in g.workers]
        for w in workers:
            if w.proxy is not None:
                w.proxy.pass_through()  # a partition heals before the end: instances drain through it
            if w.proc.returncode is None:
                if w.stopped:
                    w.proc.send_signal(signal.SIGCONT)
                w.proc.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                await asyncio.wait_for(w.proc.wait(), 15)
            except TimeoutError:
                w.proc.kill()
                await w.proc.wait()
            if w.reader is not None:
                try:
                    await asyncio.wait_for(w.reader, 5)
                except (TimeoutError, Exception):
                    w.reader.cancel()

    # --- traffic ----------------------------------------------------------------------------
    def start_publishing(self, rate: float = RATE) -> None:
        self.publishing = True
        self._pub_task = asyncio.create_task(self._publish(rate))

    async def _publish(self, rate: float) -> None:
        """Every group's stream at ``rate`` msg/s; a failed publish is retried with its msg id (dedup)."""
        js = self.nc.jetstream()
        i = 0
        next_at = time.monotonic()
        while self.publishing:
            for g in self.groups:
                key = g.keys[i % len(g.keys)]
                subject, data = f"{g.stream}.{key}", f"poison-{i}" if key == g.poison else str(i)
                t0 = time.monotonic()
                while True:
                    try:
                        ack = await js.publish(
                            subject, data.encode(), timeout=1.0, headers={"Nats-Msg-Id": f"{g.stream}-{i}"}
                        )
                        break
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        if time.monotonic() - t0 > 60:
                            raise
                        await asyncio.sleep(0.1)
                self.pub_stalled = max(self.pub_stalled, time.monotonic() - t0)
                g.published[ack.seq] = (key, data)
                g.expected.add(ack.seq)
                g.sent += 1
            i += 1
            next_at += 1 / rate
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                next_at = time.monotonic()

    async def stop_publishing(self) -> None:
        self.publishing = False
        if self._pub_task is not None:
            await bounded(self._pub_task, 70, "the publisher to stop")
            self._pub_task = None

    async def publish_slow(self, g: Group, partition: int) -> int:
        """One message that the workers handle for ``g.slow`` seconds, on a key of ``partition``; its key."""
        from pcgroups import partition_of_subject

        key = next(
            k
            for k in g.keys
            if partition_of_subject(f"{g.stream}.{k}", g.partitions, [1], f"{g.stream}.*") == partition
        )
        ack = await self.nc.jetstream().publish(f"{g.stream}.{key}", b"slow", timeout=5)
        g.expected.add(ack.seq)
        g.sent += 1
        return ack.seq

    async def publish_keys(self, g: Group, keys: list[str]) -> list[int]:
        """One message on each of ``keys`` (names of ``g.keys``), in order; their stream sequences."""
        js = self.nc.jetstream()
        seqs = []
        for i, key in enumerate(keys):
            ack = await js.publish(f"{g.stream}.{key}", f"b{i}".encode(), timeout=5)
            g.expected.add(ack.seq)
            g.sent += 1
            seqs.append(ack.seq)
        return seqs

    async def publish_batch(self, g: Group, count: int) -> None:
        js = self.nc.jetstream()
        for i in range(count):
            ack = await js.publish(f"{g.stream}.{g.keys[i % len(g.keys)]}", str(i).encode())
            g.expected.add(ack.seq)
            g.sent += 1

    # --- waiting ----------------------------------------------------------------------------
    async def progress(self, count: int = 20, timeout: float = 20.0) -> None:
        """Wait until every group acked ``count`` more calls."""
        targets = [(g, g.rec.count() + count) for g in self.groups]
        await wait_until(lambda: all(g.rec.count() >= n for g, n in targets), timeout, f"{count} more acks")

    async def resumed(
        self, g: Group, partitions: set[int], after: float, timeout: float = 30.0, exclude: str | None = None
    ) -> float:
        """Wait until each partition started a call after ``after``; the take-over time (s)."""

        def starts():
            return [g.first_start(p, after, exclude=exclude) for p in sorted(partitions)]

        await wait_until(
            lambda: all(s is not None for s in starts()),
            timeout,
            f"{g.flavour} partitions {sorted(partitions)} handled again",
        )
        return max(starts()) - after

    async def drained(self, timeout: float = 60.0) -> None:
        for g in self.groups:
            await wait_until(
                lambda g=g: g.expected <= g.rec.acked_keys(),
                timeout,
                f"every message of {g.stream} acked ({len(g.expected - g.rec.acked_keys())} of {len(g.expected)} left)",
            )

    async def server_redeliveries(self, g: Group) -> int:
        """Deliveries beyond one per message: the consumers' delivered consumer sequences (every delivery,
        redeliveries included) less the messages published (for groups whose consumers were never re-created)."""
        from pcgroups import JetStreamApi, work_queue_name

        stream = g.stream if g.flavour == "static" else work_queue_name(g.stream, GROUP)
        infos = await JetStreamApi(self.nc).list_consumers(stream)
        return sum(int((c.get("delivered") or {}).get("consumer_seq", 0)) for c in infos) - len(g.expected)

    def result(
        self, name: str, g: Group, runs: int, *, bound: int | None, takeover: list[float], t0: float, **extra: Any
    ) -> Result:
        report = g.rec.check(g.expected, redelivery_bound=bound)
        r = Result(
            name,
            runs=runs,
            messages=len(g.expected),
            lost=report.lost,
            redelivered=report.redelivered,
            redelivery_bound=bound,
            duplicates=report.duplicates,
            overlaps=report.overlaps,
            order_violations=report.order_violations,
            takeover=[round(x, 3) for x in takeover],
            seconds=round(time.time() - t0, 1),
            extra=extra,
            failures=list(report.failures),
            examples=[f"{v.kind}: {v.message}" for v in report.examples],
        )
        ended = [(w.name, w.ended) for w in g.workers if w.ended and w.killed_at is None]
        if ended:
            r.failures.append(f"instances ended: {ended}")
        return r


class ClusterEnv(Env):
    """An Env on a 3-node cluster (R3 streams) whose routes all pass through fault proxies, one per ordered pair of
    nodes (each node dials its peers through its own proxies, and advertises no reachable route address, so no
    route bypasses them). The harness and the publisher use n1 and n2."""

    replicas = 3

    async def __aenter__(self) -> ClusterEnv:
        import nats

        from pcgroups.testing._cluster import EmbeddedCluster
        from pcgroups.testing._server import free_port

        from .helpers.faultproxy import FaultProxy

        ports = [(free_port(), free_port(), free_port()) for _ in range(3)]
        self.routes = {
            (i, j): await FaultProxy(ports[j][1], name=f"n{i + 1}->n{j + 1}").start()
            for i in range(3)
            for j in range(3)
            if i != j
        }
        self.proxies.extend(self.routes.values())
        self.cluster = EmbeddedCluster(
            size=3,
            ports=ports,
            extra_args=["--cluster_advertise", "127.0.0.1:1"],
            routes=[
                [f"nats-route://127.0.0.1:{self.routes[(i, j)].port}" for j in range(3) if j != i] for i in range(3)
            ],
        )
        await asyncio.to_thread(self.cluster.start)

        async def quiet(e: Exception) -> None:
            self.log(f"harness connection: {e!r}")

        self.nc = await nats.connect(
            servers=self.cluster.urls[:2],
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.1,
            connect_timeout=2,
            error_cb=quiet,
        )
        return self

    async def _close_servers(self) -> None:
        await asyncio.to_thread(self.cluster.close)

    def urls_from(self, node: int) -> str:
        """Every node's URL, ``node`` (0-based) first: the instance connects there, and moves to the others."""
        urls = self.cluster.urls
        return ",".join(urls[node:] + urls[:node])

    def cut(self, node: int) -> None:
        """Blackhole every route to and from ``node`` (its process and its clients' connections stay up)."""
        for (i, j), proxy in self.routes.items():
            if node in (i, j):
                proxy.blackhole()

    def heal(self) -> None:
        for proxy in self.routes.values():
            proxy.pass_through()

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Until every node's JetStream is current again (its /healthz says ok)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if all(n.monitor("/healthz").get("status") == "ok" for n in self.cluster.nodes):
                    return
            except Exception:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the cluster was not healthy {timeout:g}s after the partition healed")


async def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.02)


async def bounded(aw: Awaitable, timeout: float, what: str):
    try:
        return await asyncio.wait_for(aw, timeout)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}") from None


# ============================================================== scenarios
async def sigkill(flavour: str, runs: int, verbose: bool = False) -> Result:
    """SIGKILL of m1's pinned instance (m1: 2 instances, m2: 1), a replacement started each time."""
    t_start = time.time()
    async with Env(f"kill-{flavour}", verbose=verbose) as env:
        g = await env.group(flavour, {"m1": 2, "m2": 1})
        env.start_publishing()
        await env.progress(30)
        takeover = []
        for _run in range(runs):
            victim = g.active("m1")
            parts = g.partitions_of("m1")
            t = await env.kill(victim)
            takeover.append(await env.resumed(g, parts, t))
            env.log(f"killed {victim.name}: partitions {sorted(parts)} handled again after {takeover[-1]:.2f}s")
            await env.wait_ready([await env.spawn(g, "m1")])
            await env.progress(10)
        await env.stop_publishing()
        await env.drained()
        # each kill costs at most the one message of m1's consumer in flight (max_ack_pending 1)
        return env.result(
            f"sigkill-{flavour}",
            g,
            runs,
            bound=runs,
            takeover=takeover,
            t0=t_start,
            publish_stall=round(env.pub_stalled, 2),
        )


async def sigstop(
    flavour: str, runs: int, verbose: bool = False, *, window: int = 1, name: str | None = None, concurrency: int = 1
) -> Result:
    """SIGSTOP m1's pinned instance for 2.5 x PinnedTTL, SIGCONT; it must start nothing afterwards
    (until it is pinned again, in the next run when the other instance is paused)."""
    name = name or f"sigstop-{flavour}"
    t_start = time.time()
    async with Env(name.replace("sigstop", "stop"), verbose=verbose) as env:
        g = await env.group(flavour, {"m1": 2, "m2": 1}, work=0.05, window=window, concurrency=concurrency)
        env.start_publishing()
        await env.progress(30)
        takeover, overlap_ms, late_starts, superseded, inflight, repinned_starts = [], [], 0, 0, [], 0
        for _run in range(runs):
            victim = g.active("m1")
            parts = g.partitions_of("m1")
            t_stop = time.time()
            victim.stopped = True
            victim.proc.send_signal(signal.SIGSTOP)
            takeover.append(await env.resumed(g, parts, t_stop, exclude=victim.name))
            await asyncio.sleep(max(0.0, t_stop + 2.5 * ACK_WAIT - time.time()))  # the pause itself
            t_cont = time.time()
            victim.proc.send_signal(signal.SIGCONT)
            victim.stopped = False
            await env.progress(15)
            await asyncio.sleep(0.5)  # the resumed instance had time to start something, if it would
            t_next = time.time()
            calls = [c for c in list(g.rec.calls) if c.instance == victim.name]
            # a start after SIGCONT is allowed only under a pin given to it again (the log says 'pinned')
            repins = [t for t, line in _log_lines(env.log_of(victim)) if t >= t_cont and "pinned (" in line]
            late = [
                c for c in calls if t_cont <= c.start <= t_next and not victim.dispatched.get(c.key, c.start) < t_stop
            ]  # handed out before the pause
            repinned_starts += sum(1 for c in late if any(t <= c.start for t in repins))
            late = [c for c in late if not any(t <= c.start for t in repins)]
            late_starts += len(late)
            # its call in flight when paused: how long it overlapped the successor's calls on that partition
            for c in calls:
                if (c.start < t_stop and (c.end is None or c.end > t_stop)) or (
                    t_cont <= c.start and victim.dispatched.get(c.key, c.start) < t_stop
                ):
                    inflight.append(c)
                    if c.outcome == "superseded":
                        superseded += 1
                    others = [
                        o.start
                        for o in list(g.rec.calls)
                        if o.partition == c.partition and o.instance != victim.name and o.start > c.start
                    ]
                    end = c.end if c.end is not None else time.time()
                    if others and min(others) < end:
                        overlap_ms.append(round((end - min(others)) * 1000))
            env.log(
                "victim log since the pause: "
                + " | ".join(
                    line
                    for line in env.log_of(victim).splitlines()
                    if line[:19] >= time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t_stop))
                )
            )
            for c in late:
                env.log(f"started after SIGCONT: {c.show()} (SIGCONT at {t_cont:.3f})")
            env.log(
                f"paused {victim.name}: take-over {takeover[-1]:.2f}s, {len(late)} starts after SIGCONT, "
                f"in-flight overlap {overlap_ms[-1:] or '-'} ms"
            )
        await env.stop_publishing()
        await env.drained()
        # what the paused instances had buffered when their pin moved, dropped unhandled (pcgroups' log)
        import re

        dropped = sum(
            int(n)
            for w in g.workers
            for n in re.findall(r"pin moved while this instance was paused; dropping (\d+)", env.log_of(w))
        )
        # Every overlap must be a paused instance's call in flight (frozen, it cannot stop: its handler
        # learns it was superseded once it runs again): without those calls, none may overlap.
        from pcgroups.testing._checker import Recorder

        rest = Recorder()
        rest.calls = [c for c in g.rec.calls if all(c is not p for p in inflight)]
        rest_report = rest.check()
        unexplained = rest_report.overlaps
        r = env.result(
            name,
            g,
            runs,
            bound=runs * window,
            takeover=takeover,
            t0=t_start,
            starts_after_resume=late_starts,
            paused_inflight_calls=len(inflight),
            paused_inflight_acked=sum(1 for c in inflight if c.outcome == "ack"),
            inflight_overlaps_ms=overlap_ms,
            other_overlaps=unexplained,
            window=window,
            buffered_dropped=dropped,
            starts_after_repin=repinned_starts,
            other_overlap_examples=[v.message for v in rest_report.examples if v.kind == "overlap"],
        )
        r.overlap_note = f"all {len(inflight)} paused call(s) in flight" if r.overlaps and not unexplained else ""
        if late_starts:
            r.failures.append(f"{late_starts} handler calls started by a paused instance after SIGCONT")
        if r.extra["paused_inflight_acked"]:
            r.failures.append(f"{r.extra['paused_inflight_acked']} paused call(s) acked after their pin moved")
        if not unexplained:
            r.failures = [f for f in r.failures if "overlapping" not in f]
        return r  # order holds with a window > 1 too: the take-over hands out in stream order


async def partition(flavour: str, runs: int, verbose: bool = False) -> Result:
    """m1's pinned instance cut off from its server (its fault proxy blackholed, both directions, sockets open)
    0.1 s into a 1.5 s handler call, for 2.5 x PinnedTTL, then healed. The standby must take over; the cut-off
    call must learn it was superseded (and not ack); once healed the instance must start nothing unless pinned
    again (it is a standby)."""
    name = f"partition-{flavour}"
    t_start = time.time()
    async with Env(name.replace("partition", "part"), verbose=verbose) as env:
        g = await env.group(flavour, {"m1": 2, "m2": 1}, slow=1.5, proxied=True)
        env.start_publishing()
        await env.progress(30)
        takeover, learnt, overlap_ms, inflight, late_starts, repinned_starts = [], [], [], [], 0, 0
        for _run in range(runs):
            parts = g.partitions_of("m1")
            key = await env.publish_slow(g, min(parts))
            await wait_until(lambda key=key: any(c.key == key for c in list(g.rec.calls)), 20, "the slow call to start")
            call = next(c for c in list(g.rec.calls) if c.key == key)
            victim = next(w for w in g.workers if w.name == call.instance)
            await asyncio.sleep(max(0.0, call.start + 0.1 - time.time()))
            t_cut = time.time()
            victim.proxy.blackhole()
            # take-over: the successor starts the partition's next call (m1's other partition waits behind the
            # 1.5 s call it then makes: max_ack_pending 1)
            takeover.append(await env.resumed(g, {call.partition}, t_cut, exclude=victim.name))
            await wait_until(lambda call=call: call.end is not None, 10, "the cut-off call to end")
            inflight.append(call)
            learnt.append(round(call.end - t_cut, 3))
            others = [o.start for o in list(g.rec.calls) if o.key == key and o is not call]
            if others and min(others) < call.end:
                overlap_ms.append(round((call.end - min(others)) * 1000))
            await asyncio.sleep(max(0.0, t_cut + 2.5 * ACK_WAIT - time.time()))
            t_heal = time.time()
            victim.proxy.pass_through()
            await env.progress(15)
            await asyncio.sleep(0.5)  # the healed instance had time to start something, if it would
            late, repinned = _starts_after(env, victim, t_heal, time.time())
            late_starts += len(late)
            repinned_starts += repinned
            for c in late:
                env.log(f"started after the partition healed: {c.show()} (healed at {t_heal:.3f})")
            env.log(
                f"cut {victim.name} off: take-over {takeover[-1]:.2f}s, its call learnt after {learnt[-1]:.2f}s "
                f"({call.outcome}), {len(late)} starts after healing"
            )
        await env.stop_publishing()
        await env.drained()
        r = _fenced_result(
            env,
            name,
            g,
            runs,
            inflight,
            takeover=takeover,
            t0=t_start,
            superseded_after_s=learnt,
            inflight_overlaps_ms=overlap_ms,
            starts_after_heal=late_starts,
            starts_after_repin=repinned_starts,
        )
        if late_starts:
            r.failures.append(f"{late_starts} handler calls started by a cut-off instance after the partition healed")
        if r.extra["inflight_acked"]:
            r.failures.append(f"{r.extra['inflight_acked']} cut-off call(s) acked")
        return r


async def slow_link(runs: int, verbose: bool = False, seconds: float = 4.0) -> Result:
    """A link with 200 ms more latency each way (its fault proxy delaying) under m1's pinned instance, ``seconds``
    per run: the instance must keep its pin (no other m1 instance handles m1's partitions meanwhile, no pin
    change in any log) and no call of it may be marked superseded."""
    t_start = time.time()
    async with Env("slowlink", verbose=verbose) as env:
        g = await env.group("static", {"m1": 2, "m2": 1}, proxied=True)
        env.start_publishing()
        await env.progress(30)
        moves, superseded, handled = 0, 0, []
        for _run in range(runs):
            victim = g.active("m1")
            parts = g.partitions_of("m1")
            t0 = time.time()
            victim.proxy.delay(200)
            await asyncio.sleep(seconds)
            t1 = time.time()
            victim.proxy.pass_through()
            calls = [c for c in list(g.rec.calls) if t0 <= c.start <= t1 and c.partition in parts]
            others = [c for c in calls if c.instance != victim.name]
            pin_lines = [
                line
                for w in g.workers
                for t, line in _log_lines(env.log_of(w))
                if t0 <= t <= t1 + 0.5 and ("pinned (" in line or "lost the pin" in line or "pin moved" in line)
            ]
            moves += len(others) + len(pin_lines)
            superseded += sum(1 for c in calls if c.outcome == "superseded")
            handled.append(len(calls) - len(others))
            env.log(
                f"200 ms on {victim.name} for {seconds:g}s: it handled {handled[-1]} of m1's calls, others "
                f"{len(others)}, pin changes logged {len(pin_lines)}"
            )
            await env.progress(20)
        await env.stop_publishing()
        await env.drained()
        r = env.result(
            "slow-link",
            g,
            runs,
            bound=0,
            takeover=[],
            t0=t_start,
            pin_moves=moves,
            superseded_calls=superseded,
            calls_on_slow_link=handled,
            delay_ms=200,
            seconds_per_run=seconds,
        )
        if moves:
            r.failures.append(f"m1's pin moved {moves} time(s) on a slow link")
        if superseded:
            r.failures.append(f"{superseded} call(s) of the slow-linked instance were marked superseded")
        return r


async def server_closes(runs: int, verbose: bool = False, every: float = 2.0) -> list[Result]:
    """Every instance's connection closed by the other end every ``every`` seconds (their fault proxies close
    them; nats-py reconnects), static and elastic groups under traffic: nothing lost, no overlap, order kept."""
    t_start = time.time()
    async with Env("closes", verbose=verbose) as env:
        gs = await env.group("static", {"m1": 2, "m2": 1}, proxied=True)
        ge = await env.group("elastic", {"m1": 2, "m2": 1}, proxied=True)
        env.start_publishing()
        await env.progress(30)
        takeover: dict[str, list[float]] = {"static": [], "elastic": []}
        for _run in range(runs):
            t = time.time()
            closed = sum(w.proxy.close_connections() for g in (gs, ge) for w in g.workers)
            for g in (gs, ge):
                takeover[g.flavour].append(await env.resumed(g, set(range(g.partitions)), t))
            env.log(
                f"closed {closed} connections: handled again after "
                + ", ".join(f"{f} {v[-1]:.2f}s" for f, v in takeover.items())
            )
            await asyncio.sleep(max(0.0, t + every - time.time()))
        await env.stop_publishing()
        await env.drained()
        # a close may cost each consumer (m1, m2) the message it had in flight
        return [
            env.result(
                f"server-closes-{g.flavour}",
                g,
                runs,
                bound=2 * runs,
                takeover=takeover[g.flavour],
                t0=t_start,
                reconnects=sum(w.reconnects for w in g.workers),
                publish_stall=round(env.pub_stalled, 2),
            )
            for g in (gs, ge)
        ]


async def cluster_partition(runs: int, verbose: bool = False, hold: float = 5.0) -> list[Result]:
    """A 3-node cluster, static and elastic R3 groups; node n3 cut off from n1 and n2 (its routes blackholed, its
    process and its clients' connections alive) until every instance connected to it moved to n1 or n2, at least
    ``hold`` seconds, then healed. m1 and m2 have an instance on n3 and one on the majority (every instance knows
    all three URLs): the groups must go on on the majority, the instances on n3 must move, nothing may be lost or
    overlap. Each run starts a new instance on n3 for each member that has none there."""
    t_start = time.time()
    async with ClusterEnv("cluster-part", verbose=verbose) as env:
        groups = [
            await env.group(
                flavour,
                {"m1": 2, "m2": 2},
                url_of=lambda member, k: env.urls_from(2 if k == 0 else (0 if member == "m1" else 1)),
            )
            for flavour in ("static", "elastic")
        ]
        env.start_publishing()
        await env.progress(30, timeout=60)
        takeover: dict[str, list[float]] = {"static": [], "elastic": []}
        moved_after: list[float] = []
        unmoved = 0
        for _run in range(runs):
            on_n3 = await _instances_on(env, groups, 2)
            t_cut = time.time()
            env.cut(2)
            for g in groups:
                takeover[g.flavour].append(await env.resumed(g, set(range(g.partitions)), t_cut, timeout=60))

            def moved(on_n3: list[Any] = on_n3, t_cut: float = t_cut) -> list[float]:
                return [
                    min(t for t in w.reconnected_at if t > t_cut) - t_cut
                    for w in on_n3
                    if any(t > t_cut for t in w.reconnected_at)
                ]

            try:
                await wait_until(
                    lambda moved=moved, on_n3=on_n3: len(moved()) == len(on_n3), 60, "the instances on n3 to move"
                )
            except AssertionError as e:
                env.log(str(e))
            moves = moved()
            moved_after.extend(round(m, 2) for m in moves)
            unmoved += len(on_n3) - len(moves)
            await asyncio.sleep(max(0.0, t_cut + hold - time.time()))
            env.heal()
            await asyncio.to_thread(env.wait_healthy)
            env.log(
                f"n3 cut off for {time.time() - t_cut:.0f}s: handled again after "
                + ", ".join(f"{f} {v[-1]:.2f}s" for f, v in takeover.items())
                + f"; {len(moves)} of {len(on_n3)} instances on n3 moved, after {sorted(round(m, 1) for m in moves)} s"
            )
            await env.progress(20, timeout=60)
        await env.stop_publishing()
        await env.drained(timeout=90)
        out = []
        for g in groups:
            # a cut may cost each consumer (m1, m2) its message in flight, and each leader change of the consumer
            # (or, elastic, of the work queue) the messages it had delivered
            r = env.result(
                f"cluster-partition-{g.flavour}",
                g,
                runs,
                bound=4 * runs,
                takeover=takeover[g.flavour],
                t0=t_start,
                moved_after_s=sorted(moved_after),
                not_moved=unmoved,
                reconnects=sum(w.reconnects for w in g.workers),
                publish_stall=round(env.pub_stalled, 2),
            )
            if unmoved:
                r.failures.append(f"{unmoved} instance(s) on n3 did not move to the majority")
            out.append(r)
        return out


async def _instances_on(env: ClusterEnv, groups: list[Group], node: int) -> list[Worker]:
    """The instances connected to ``node`` (0-based), after starting one there for each member that has none
    (the earlier runs' instances moved away)."""

    def names() -> set[str]:
        conns = env.cluster.nodes[node].monitor("/connz?limit=1024").get("connections") or []
        return {str(c.get("name")) for c in conns}

    here = await asyncio.to_thread(names)
    for g in groups:
        for member in sorted({w.member for w in g.workers}):
            if not any(f"{g.stream}/{w.name}" in here for w in g.alive(member)):
                await env.wait_ready([await env.spawn(g, member, env.urls_from(node))])
    here = await asyncio.to_thread(names)
    return [w for g in groups for w in g.alive() if f"{g.stream}/{w.name}" in here]


def _starts_after(env: Env, w: Worker, since: float, until: float) -> tuple[list[Any], int]:
    """Calls ``w`` started in [since, until] that no pin given to it again explains (its log says 'pinned'), and
    how many such a pin explains."""
    repins = [t for t, line in _log_lines(env.log_of(w)) if t >= since and "pinned (" in line]
    started = [
        c
        for c in list(w.group.rec.calls)
        if c.instance == w.name and since <= c.start <= until and not w.dispatched.get(c.key, c.start) < since
    ]
    late = [c for c in started if not any(t <= c.start for t in repins)]
    return late, len(started) - len(late)


def _fenced_result(env: Env, name: str, g: Group, runs: int, inflight: list[Any], **extra: Any) -> Result:
    """The result of a run whose faulted instances had calls in flight that ran on (a SIGSTOP, a partition):
    those calls may overlap their successors until the instance learns; no other call may overlap."""
    from pcgroups.testing._checker import Recorder

    rest = Recorder()
    rest.calls = [c for c in g.rec.calls if all(c is not p for p in inflight)]
    unexplained = rest.check().overlaps
    r = env.result(
        name,
        g,
        runs,
        bound=runs * g.window,
        other_overlaps=unexplained,
        inflight_calls=len(inflight),
        inflight_acked=sum(1 for c in inflight if c.outcome == "ack"),
        **extra,
    )
    r.overlap_note = f"all {len(inflight)} cut-off call(s) in flight" if r.overlaps and not unexplained else ""
    if not unexplained:
        r.failures = [f for f in r.failures if "overlapping" not in f]
    return r


def _log_lines(text: str) -> list[tuple[float, str]]:
    """(epoch seconds, line) of a worker log's lines (logging's default asctime, local time)."""
    out = []
    for line in text.splitlines():
        try:
            t = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
        except ValueError:
            continue
        out.append((t, line))
    return out


async def server_restart(runs: int, verbose: bool = False) -> list[Result]:
    """Stop (SIGTERM; SIGKILL on odd runs) and restart the nats-server (same store) under traffic."""
    t_start = time.time()
    async with Env("restart", verbose=verbose) as env:
        gs = await env.group("static", {"m1": 2, "m2": 1})
        ge = await env.group("elastic", {"e1": 2, "e2": 1})
        env.start_publishing()
        await env.progress(30)
        takeover: dict[str, list[float]] = {"static": [], "elastic": []}
        crashes: list[float] = []
        for run in range(runs):
            how = "SIGKILL" if run % 2 else "SIGTERM"
            if run % 2:
                crashes.append(time.time())
            await asyncio.to_thread(env.server.kill if run % 2 else env.server.stop)
            await asyncio.sleep(0.5)
            await asyncio.to_thread(env.server.start)
            t_up = time.time()
            for g in (gs, ge):
                takeover[g.flavour].append(await env.resumed(g, set(range(g.partitions)), t_up, timeout=60))
            env.log(
                f"restart ({how}): handled again after " + ", ".join(f"{f} {v[-1]:.2f}s" for f, v in takeover.items())
            )
            await env.progress(20, timeout=60)
        await env.stop_publishing()
        await env.drained()
        out = []
        for g in (gs, ge):
            # A restart may redeliver what each consumer had in flight (3 consumers per group, window 1).
            # After a crash (SIGKILL) the server may also have lost recent acks and, for the elastic work
            # queue, the position of its source: messages acked before the crash come again (a server limit,
            # docs/RELIABILITY.md). Those are counted apart; the bound holds for the rest.
            crash = _crash_redeliveries(g, crashes)
            r = env.result(
                f"server-restart-{g.flavour}",
                g,
                runs,
                bound=3 * runs + crash,
                takeover=takeover[g.flavour],
                t0=t_start,
                publish_stall=round(env.pub_stalled, 2),
                crashes=len(crashes),
                after_crash=crash,
                resourced=_resourced(g),
                reconnects=sum(w.reconnects for w in g.workers),
            )
            if crash:
                r.redelivered_note = f"{crash} after a server SIGKILL"
            out.append(r)
        return out


def _crash_redeliveries(g: Group, crashes: list[float]) -> int:
    """Calls of messages acked before a server crash and handled again after it."""
    by_key: dict[Any, list] = {}
    for c in list(g.rec.calls):
        by_key.setdefault(c.key, []).append(c)
    n = 0
    for calls in by_key.values():
        for t in crashes:
            if any(c.acked and c.end is not None and c.end < t for c in calls):
                n += sum(1 for c in calls if c.start > t)
                break
    return n


def _resourced(g: Group) -> int:
    """Messages delivered again under a new work-queue sequence (sourced twice into the work queue)."""
    seqs: dict[Any, set[int]] = {}
    for c in list(g.rec.calls):
        seqs.setdefault(c.key, set()).add(c.seq)
    return sum(1 for s in seqs.values() if len(s) > 1) if g.flavour == "elastic" else 0


async def membership(runs: int, verbose: bool = False, seed: int = 5) -> Result:
    """``runs`` membership changes of an elastic group (6 partitions, members m1..m4 with one instance
    each): add, drop, set mappings, mappings changed, back to members."""
    from pcgroups import MemberMapping, add_members, delete_member_mappings, delete_members, set_member_mappings

    rnd = random.Random(seed)
    names = ["m1", "m2", "m3", "m4"]
    t_start = time.time()
    async with Env("members", verbose=verbose) as env:
        g = await env.group("elastic", dict.fromkeys(names, 1), partitions=6, add=["m1", "m2"])
        s, nc = g.stream, env.nc
        members, mapped = {"m1", "m2"}, False
        env.start_publishing(RATE * 1.5)
        await env.progress(30)
        takeover, kinds = [], {}
        for run in range(runs):
            t = time.time()
            if mapped:
                if rnd.random() < 0.5:
                    kind = "remap"
                    await set_member_mappings(nc, s, GROUP, _mappings(rnd, names, g.partitions, MemberMapping))
                else:
                    kind = "unmap"
                    members = set(rnd.sample(names, rnd.randint(1, 4)))
                    await delete_member_mappings(nc, s, GROUP)
                    await add_members(nc, s, GROUP, sorted(members))
                    mapped = False
            else:
                choices = (["add"] if len(members) < 4 else []) + (["drop"] if len(members) > 1 else []) + ["map"]
                kind = rnd.choice(choices)
                if kind == "add":
                    new = rnd.choice(sorted(set(names) - members))
                    members.add(new)
                    await add_members(nc, s, GROUP, [new])
                elif kind == "drop":
                    gone = rnd.choice(sorted(members))
                    members.discard(gone)
                    await delete_members(nc, s, GROUP, [gone])
                else:
                    await set_member_mappings(nc, s, GROUP, _mappings(rnd, names, g.partitions, MemberMapping))
                    mapped = True
            kinds[kind] = kinds.get(kind, 0) + 1
            takeover.append(await env.resumed(g, set(range(g.partitions)), t))
            env.log(f"change {run + 1} ({kind}): every partition handled again after {takeover[-1]:.2f}s")
            await env.progress(10)
        await env.stop_publishing()
        await env.drained()
        return env.result("membership", g, runs, bound=runs, takeover=takeover, t0=t_start, changes=kinds)


def _mappings(rnd: random.Random, names: list[str], partitions: int, MemberMapping) -> list:
    chosen = rnd.sample(names, rnd.randint(2, 3))
    parts = list(range(partitions))
    rnd.shuffle(parts)
    out = {m: [] for m in chosen}
    for i, p in enumerate(parts):
        out[chosen[i % len(chosen)]].append(p)
    return [MemberMapping(m, sorted(ps)) for m, ps in out.items()]


async def stepdown_storm(runs: int, verbose: bool = False) -> list[Result]:
    """Step-downs of m1 (3 instances) in static and elastic groups, each right after the last took effect."""
    from pcgroups import elastic_member_step_down, static_member_step_down

    t_start = time.time()
    rnd = random.Random(7)
    async with Env("stepdown", verbose=verbose) as env:
        gs = await env.group("static", {"m1": 3, "m2": 1})
        ge = await env.group("elastic", {"m1": 3, "m2": 1})
        env.start_publishing()
        await env.progress(30)
        takeover: dict[str, list[float]] = {"static": [], "elastic": []}
        for run in range(runs):
            parts = {g.flavour: g.partitions_of("m1") for g in (gs, ge)}
            t = time.time()
            await asyncio.gather(
                static_member_step_down(env.nc, gs.stream, GROUP, "m1"),
                elastic_member_step_down(env.nc, ge.stream, GROUP, "m1"),
            )
            for g in (gs, ge):
                takeover[g.flavour].append(await env.resumed(g, parts[g.flavour], t))
            env.log(f"step-down {run + 1}: " + ", ".join(f"{f} {v[-1]:.2f}s" for f, v in takeover.items()))
            await asyncio.sleep(rnd.uniform(0.0, 0.2))
        await env.stop_publishing()
        await env.drained()
        # a call in flight at a step-down sees msg.superseded and does not ack: redelivered once
        return [
            env.result(
                f"stepdown-{g.flavour}",
                g,
                runs,
                bound=runs,
                takeover=takeover[g.flavour],
                t0=t_start,
                pins=len({c.instance for c in g.rec.calls if c.member == "m1"}),
            )
            for g in (gs, ge)
        ]


async def stepdown_keyed(runs: int, verbose: bool = False, *, work: float = 0.2, every: float = 1.5) -> list[Result]:
    """Single step-downs of m1 (2 instances, key-level concurrency 4, window 16, 0.2 s calls) in static and
    elastic groups, ``every`` s apart: the new pin holder must not start a key while the old one still runs a
    call of it (its calls in flight end first, and may ack), and every key keeps its order."""
    from pcgroups import elastic_member_step_down, static_member_step_down

    t_start = time.time()
    async with Env("stepdownkeyed", verbose=verbose) as env:
        gs = await env.group("static", {"m1": 2}, work=work, window=16, concurrency=4)
        ge = await env.group("elastic", {"m1": 2}, work=work, window=16, concurrency=4)
        env.start_publishing()
        await env.progress(30)
        takeover: dict[str, list[float]] = {"static": [], "elastic": []}
        for run in range(runs):
            before = {g.flavour: g.active("m1") for g in (gs, ge)}
            t = time.time()
            await asyncio.gather(
                static_member_step_down(env.nc, gs.stream, GROUP, "m1"),
                elastic_member_step_down(env.nc, ge.stream, GROUP, "m1"),
            )
            for g in (gs, ge):
                old = before[g.flavour]
                await wait_until(
                    lambda g=g, old=old, t=t: (
                        g.rec.first_start(after=t) is not None
                        and any(c.start > t and (old is None or c.instance != old.name) for c in list(g.rec.calls))
                    ),
                    20,
                    f"{g.flavour}: a call of the new pin holder",
                )
                takeover[g.flavour].append(
                    min(c.start for c in list(g.rec.calls) if c.start > t and (old is None or c.instance != old.name))
                    - t
                )
            env.log(f"step-down {run + 1}: " + ", ".join(f"{f} {v[-1]:.2f}s" for f, v in takeover.items()))
            await asyncio.sleep(every)
        await env.stop_publishing()
        await env.drained()
        # the old holder's calls in flight at a step-down finish and ack; a call that had not would be nak'd
        # at its end and handled once more: at most K per step-down
        return [
            env.result(
                f"stepdown-keyed-{g.flavour}",
                g,
                runs,
                bound=4 * runs,
                takeover=takeover[g.flavour],
                t0=t_start,
                pins=len({c.instance for c in g.rec.calls}),
            )
            for g in (gs, ge)
        ]


def _open_call(g: Group, instance: str) -> Any:
    """The call ``instance`` is running now (the latest without an end), or None."""
    for c in reversed(list(g.rec.calls)):
        if c.instance == instance and c.end is None:
            return c
    return None


async def _pool(
    env: Env,
    flavour: str,
    dispatchers: int,
    *,
    work: float,
    workers: int,
    capacity: int,
    rate: float,
    worker_args: tuple[str, ...] = (),
) -> tuple[Group, list[Worker]]:
    """A pool scenario's start: member m1 with ``dispatchers`` dispatching instances, ``workers`` workers
    (w0, w1, ...) of ``capacity``, traffic at ``rate`` and a first few calls made."""
    g = await env.group(flavour, {"m1": dispatchers}, work=work, window=256, dispatch=True)
    started = [await env.pool_worker(g, f"w{i}", capacity, *worker_args) for i in range(workers)]
    await env.wait_ready(started)
    env.start_publishing(rate=rate)
    await env.progress(max(int(rate), 3))
    return g, started


async def pool_sigkill_worker(runs: int, verbose: bool = False, capacity: int = 2) -> Result:
    """SIGKILL of a pool worker in the middle of a call (static group, m1 dispatching, 3 workers of capacity 2,
    0.2 s calls on 16 keys): the killed call's message runs on another worker within about REVOKE_AFTER, nothing
    is lost, every key keeps its order, no key runs twice at once; a new worker is started after each kill."""
    t_start = time.time()
    async with Env("poolkill", verbose=verbose) as env:
        g, _ = await _pool(env, "static", 1, work=0.2, workers=3, capacity=capacity, rate=20.0)
        again: list[float] = []
        for run in range(runs):
            await wait_until(lambda: any(_open_call(g, w.name) for w in g.alive("pool")), 10, "a call in flight")
            victim = next(w for w in g.alive("pool") if _open_call(g, w.name))
            call = _open_call(g, victim.name)
            t = await env.kill(victim)

            def elsewhere(call=call, t=t):
                return [c.start for c in list(g.rec.calls) if c.key == call.key and c.start > t]

            await wait_until(lambda: bool(elsewhere()), 15, f"message {call.key} handled again after the kill")
            again.append(min(elsewhere()) - t)
            env.log(f"kill {run + 1}: {victim.name}'s message {call.key} running again after {again[-1]:.2f}s")
            await env.wait_ready([await env.pool_worker(g, f"w{3 + run}", capacity)])
        await env.stop_publishing()
        await env.drained()
        return env.result("pool-sigkill-worker", g, runs, bound=runs * capacity, takeover=again, t0=t_start)


async def pool_sigkill_dispatcher(flavour: str, runs: int, verbose: bool = False) -> Result:
    """SIGKILL of the pinned dispatching instance of m1 (2 instances, 3 workers of capacity 2, 0.2 s calls): the
    standby takes the pin, waits for the calls the workers still run for the dead one, and the same workers,
    not restarted, handle its messages; a new standby is started after each kill."""
    t_start = time.time()
    async with Env(f"pooldisp{flavour}", verbose=verbose) as env:
        g, _ = await _pool(env, flavour, 2, work=0.2, workers=3, capacity=2, rate=20.0)
        gaps: list[float] = []
        for run in range(runs):
            await wait_until(lambda: any(w.state == "pinned" for w in g.alive("m1")), 30, "a pinned dispatcher")
            victim = next(w for w in g.alive("m1") if w.state == "pinned")
            t = await env.kill(victim)
            await wait_until(lambda t=t: g.rec.first_start(after=t + 0.05) is not None, 30, "calls after the kill")
            gaps.append(g.rec.longest_pause(since=t - 0.5, until=t + 30))
            env.log(f"kill {run + 1}: {victim.name}; longest pause {gaps[-1]:.2f}s")
            await env.spawn(g, "m1", extra=("--dispatch",))
            await env.progress(10)
        await env.stop_publishing()
        await env.drained()
        return env.result(
            f"pool-sigkill-dispatcher-{flavour}",
            g,
            runs,
            bound=runs * 6,
            takeover=gaps,
            t0=t_start,
            workers_restarted=0,
            worker_names=sorted({c.instance for c in g.rec.calls}),
        )


async def pool_churn(runs: int, verbose: bool = False) -> Result:
    """Workers started and stopped (SIGTERM) at will under traffic (elastic group, 2 workers at any time, 0.1 s
    calls): a stopped worker finishes its calls and leaves, nothing is handled twice, a new worker gets work
    within a second of enrolling."""
    t_start = time.time()
    async with Env("poolchurn", verbose=verbose) as env:
        g, live = await _pool(env, "elastic", 1, work=0.1, workers=2, capacity=1, rate=20.0)
        first_work: list[float] = []
        for run in range(runs):
            new = await env.pool_worker(g, f"w{2 + run}", 1)
            await env.wait_ready([new])
            ready = time.time()
            await wait_until(
                lambda n=new.name, ready=ready: g.rec.first_start(after=ready, instance=n) is not None,
                15,
                f"{new.name} handling",
            )
            first_work.append(g.rec.first_start(after=ready, instance=new.name) - ready)
            old = live.pop(0)
            old.proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(old.proc.wait(), 15)
            old.killed_at = time.time()  # gone (it ended by itself: every call it took had ended)
            if code != 0:
                raise AssertionError(f"{old.name} exited {code} on SIGTERM")
            live.append(new)
            env.log(f"churn {run + 1}: {new.name} worked {first_work[-1]:.2f}s after enrolling, {old.name} left")
        await env.stop_publishing()
        await env.drained()
        stopped_open = [c for c in g.rec.calls if c.end is None]
        r = env.result(
            "pool-churn", g, runs, bound=0, takeover=first_work, t0=t_start, calls_left_open=len(stopped_open)
        )
        return r


async def pool_server_restart(runs: int, verbose: bool = False, dispatchers: int = 1) -> Result:
    """The nats-server (file storage) stopped with SIGTERM and started again under a pool's traffic (static group,
    m1 dispatching, 3 workers, 3 s calls that span the 2.5 s outage): the dispatcher and the workers reconnect, no
    worker is declared gone for the outage (pcgroups.pool._dispatcher invariant 4), so no key runs on two workers at once.
    With two dispatching instances the pin may move at the restart: the new holder adopts the calls in flight, the
    old one offers nothing again (dispatch invariant 3), no message is acked twice."""
    t_start = time.time()
    name = "pool-server-restart" + ("-2d" if dispatchers > 1 else "")
    async with Env(name.replace("-", ""), verbose=verbose) as env:
        # handlers as cg's: msg.superseded looked at when the work is done (a call spanning the outage goes on)
        g, workers = await _pool(
            env, "static", dispatchers, work=3.0, workers=3, capacity=1, rate=1.0, worker_args=("--superseded-at-end",)
        )
        await wait_until(lambda: sum(1 for w in workers if _open_call(g, w.name)) >= 2, 15, "calls in flight")
        back: list[float] = []
        for run in range(runs):
            await asyncio.to_thread(env.server.stop)
            await asyncio.sleep(2.5)  # longer than REVOKE_AFTER: a dispatcher counting this silence would revoke
            await asyncio.to_thread(env.server.start)
            t_up = time.time()
            await wait_until(lambda t=t_up: g.rec.first_start(after=t) is not None, 60, "calls after the restart")
            back.append(g.rec.first_start(after=t_up) - t_up)
            env.log(f"restart {run + 1}: calls again {back[-1]:.2f}s after the server was back")
            await env.progress(3, timeout=60)
        await env.stop_publishing()
        await env.drained()
        # a call in flight at the restart may not get its ack through (the server was down): handled again once
        return _no_double_acks(
            env.result(
                name,
                g,
                runs,
                bound=3 * runs,
                takeover=back,
                t0=t_start,
                reconnects=sum(w.reconnects for w in g.workers),
            ),
            g,
        )


def _no_double_acks(r: Result, g: Group) -> Result:
    """A message acked twice (two handler calls that both acked) fails the scenario."""
    if r.duplicates:
        acks: dict[Any, list[Any]] = {}
        for c in list(g.rec.calls):
            if c.outcome == "ack":
                acks.setdefault(c.key, []).append(c)
        twice = [" then ".join(c.show() for c in cs) for cs in acks.values() if len(cs) > 1]
        r.failures.append(f"{r.duplicates} message(s) acked twice")
        r.examples += [f"acked twice: {t}" for t in twice[:5]]
    return r


async def _calm(g: Group, quiet: float = 1.5, timeout: float = 30.0) -> None:
    """Until no pool worker has run a call for ``quiet`` s (an offer made again would have started by then)."""

    def calm() -> bool:
        if any(_open_call(g, w.name) for w in g.alive("pool")):
            return False
        ends = [c.end for c in list(g.rec.calls) if c.end is not None]
        return not ends or time.time() - max(ends) >= quiet

    await wait_until(calm, timeout, "the workers idle")


async def pool_sigstop_dispatcher(flavour: str, runs: int, verbose: bool = False, *, burst: bool = False) -> Result:
    """SIGSTOP of m1's pinned dispatching instance (2 instances, workers of capacity 1), then SIGCONT: the standby
    takes the pin, adopts the calls the workers run (they go on and ack through it), and the paused instance,
    resumed, offers nothing again (it lost its pin). Single key: 3 messages on one key, 1.5 s calls, the pause
    (3 x PinnedTTL) during the first. Mid-burst: 4 keys x 20 messages, 0.2 s calls, 4 workers, the pause (2.5 x
    PinnedTTL) once a quarter is acked. No message acked twice, no key on two workers, order kept."""
    t_start = time.time()
    kind = "burst" if burst else "key"
    async with Env(f"poolpause{kind}{flavour}", verbose=verbose) as env:
        g = await env.group(flavour, {"m1": 2}, work=0.2 if burst else 1.5, window=256, dispatch=True)
        await env.wait_ready([await env.pool_worker(g, f"w{i}", 1) for i in range(4 if burst else 3)])
        pause = 2.5 if burst else 3.0
        gaps: list[float] = []
        for run in range(runs):
            if burst:
                keys = [g.keys[(4 * run + i) % len(g.keys)] for i in range(4)]
                seqs = await env.publish_keys(g, keys * 20)
                await wait_until(lambda s=set(seqs): len(s & g.rec.acked_keys()) >= len(s) // 4, 30, "a quarter acked")
            else:
                seqs = await env.publish_keys(g, [g.keys[run % len(g.keys)]] * 3)
                await wait_until(
                    lambda s=seqs[0]: any(c.key == s and c.end is None for c in list(g.rec.calls)),
                    30,
                    "the key's first message running",
                )
            await wait_until(lambda: any(w.state == "pinned" for w in g.alive("m1")), 30, "a pinned dispatcher")
            victim = next(w for w in g.alive("m1") if w.state == "pinned")
            t = time.time()
            victim.proc.send_signal(signal.SIGSTOP)
            victim.stopped = True
            await asyncio.sleep(pause)
            victim.proc.send_signal(signal.SIGCONT)
            victim.stopped = False
            await wait_until(lambda s=set(seqs): s <= g.rec.acked_keys(), 60, f"run {run + 1}'s messages acked")
            await _calm(g)
            gaps.append(g.rec.longest_pause(since=t - 0.5, until=time.time()))
            env.log(f"pause {run + 1}: {victim.name} stopped {pause}s; longest pause between calls {gaps[-1]:.2f}s")
        await env.drained()
        return _no_double_acks(
            env.result(f"pool-sigstop-dispatcher-{kind}-{flavour}", g, runs, bound=0, takeover=gaps, t0=t_start), g
        )


async def pool_sigkill_dispatcher_long(runs: int, verbose: bool = False) -> Result:
    """SIGKILL of m1's pinned dispatching instance (2 instances) while 3 workers run 2.5 s calls (3 keys): the calls
    go on, their acks go through the standby once it holds the pin (it adopts them), and none of them runs again;
    a new standby is started after each kill."""
    t_start = time.time()
    async with Env("pooldisplong", verbose=verbose) as env:
        g = await env.group("static", {"m1": 2}, work=2.5, window=256, dispatch=True)
        await env.wait_ready([await env.pool_worker(g, f"w{i}", 1) for i in range(3)])
        gaps: list[float] = []
        inflight: list[Any] = []
        for run in range(runs):
            seqs = await env.publish_keys(g, [g.keys[(3 * run + i) % len(g.keys)] for i in range(3)])
            await wait_until(
                lambda s=set(seqs): {c.key for c in list(g.rec.calls) if c.end is None} >= s, 30, "three calls running"
            )
            await wait_until(lambda: any(w.state == "pinned" for w in g.alive("m1")), 30, "a pinned dispatcher")
            victim = next(w for w in g.alive("m1") if w.state == "pinned")
            running = [c for c in list(g.rec.calls) if c.end is None]
            t = await env.kill(victim)
            inflight += running
            await wait_until(lambda s=set(seqs): s <= g.rec.acked_keys(), 60, f"run {run + 1}'s messages acked")
            await _calm(g, quiet=3.0)
            gaps.append(max(c.end for c in running) - t)
            env.log(
                f"kill {run + 1}: {victim.name}; the {len(running)} calls in flight ended "
                f"{[c.outcome for c in running]}"
            )
            await env.wait_ready([await env.spawn(g, "m1", extra=("--dispatch",))])
        await env.drained()
        r = _no_double_acks(env.result("pool-sigkill-dispatcher-long", g, runs, bound=0, takeover=gaps, t0=t_start), g)
        again = [c for c in inflight if sum(1 for x in list(g.rec.calls) if x.key == c.key) > 1]
        not_acked = [c for c in inflight if c.outcome != "ack"]
        r.extra.update(inflight=len(inflight), inflight_acked=len(inflight) - len(not_acked), run_again=len(again))
        if not_acked or again:
            r.failures.append(
                f"calls in flight at the kill not acked: {[c.show() for c in not_acked]}; "
                f"run again: {[c.show() for c in again]}"
            )
        return r


async def pool_sigstop_worker(runs: int, verbose: bool = False) -> Result:
    """A pool worker stopped (SIGSTOP) in the middle of a 1.5 s call for 3 s (more than REVOKE_AFTER), then
    continued: its dispatcher offered the message elsewhere after 2 s; the resumed call learns it was superseded
    and does not ack, and the worker is taken back as a new one. The only overlap is that frozen call."""
    t_start = time.time()
    async with Env("poolstop", verbose=verbose) as env:
        g, _ = await _pool(env, "static", 1, work=1.5, workers=3, capacity=1, rate=4.0)
        frozen_calls = []
        for run in range(runs):
            await wait_until(lambda: any(_open_call(g, w.name) for w in g.alive("pool")), 10, "a call in flight")
            victim = next(w for w in g.alive("pool") if _open_call(g, w.name))
            call = _open_call(g, victim.name)
            frozen_calls.append(call)
            victim.proc.send_signal(signal.SIGSTOP)
            await asyncio.sleep(3.0)
            victim.proc.send_signal(signal.SIGCONT)
            await wait_until(lambda c=call: c.end is not None, 15, "the frozen call's end")
            env.log(f"stop {run + 1}: {victim.name}'s call on message {call.key} ended {call.outcome}")
            await env.progress(4, timeout=30)
        await env.stop_publishing()
        await env.drained()
        acked_frozen = sum(1 for c in frozen_calls if c.outcome == "ack")
        r = env.result(
            "pool-sigstop-worker",
            g,
            runs,
            bound=runs,
            takeover=[],
            t0=t_start,
            frozen_acked=acked_frozen,
            frozen_outcomes=[c.outcome for c in frozen_calls],
        )
        if r.overlaps:  # each frozen call overlaps the call that took its message over: expected, those only
            frozen = {c.key for c in frozen_calls}
            other = [e for e in r.examples if e.startswith("overlap") and not any(f"#{k} " in e for k in frozen)]
            r.overlap_note = "the frozen calls"
            r.failures = [f for f in r.failures if "overlapping" not in f] + (
                [f"overlaps beyond the frozen calls: {other}"] if other else []
            )
        return r


async def replay(flavour: str, runs: int, verbose: bool = False) -> Result:
    """Key k0's messages always fail in its owner's instances (``--max-deliver 3 --park-keys``) while the owner's
    pinned instance is SIGKILLed under traffic: every other message is handled as usual (the checker), k0's first
    message is dead-lettered once (the first kill comes at its first failure: the next pin holder tries it again),
    and each later k0 message follows it into the dead-letter stream, in order, without running. Then the handler
    is fixed (every instance stopped, new ones started without ``--fail``), all dead letters are replayed under
    traffic, and they run once each, in publish order; the dead-letter stream is left empty."""
    from pcgroups import partition_of_subject
    from pcgroups.deadletters import execute_plan, list_dead_letters, plan_replay

    t_start = time.time()
    policy = ("--max-deliver", "3", "--backoff", "0.05", "--park-keys")
    failing = (*policy, "--fail", "poison")
    async with Env(f"replay-{flavour}", verbose=verbose) as env:
        g = await env.group(flavour, {"m1": 0, "m2": 0})
        g.poison = "k0"
        for m in ("m1", "m1", "m2", "m2"):
            await env.spawn(g, m, extra=failing)
        await env.wait_ready(g.workers)
        part = partition_of_subject(f"{g.stream}.k0", g.partitions, [1], f"{g.stream}.*")
        half = g.partitions // 2  # balanced: m1 owns the first half
        owner, parts = ("m1", set(range(half))) if part < half else ("m2", set(range(half, g.partitions)))

        def failed() -> list[str]:
            return [m["data"] for w in g.workers for m in w.marks if m["ev"] == "failed"]

        env.start_publishing()
        await wait_until(lambda: bool(failed()), 20, "k0's first failure")  # the first kill: while it is retried
        takeover = []
        for run in range(runs):
            if run:
                await env.progress(20)
            victim = g.active(owner) or g.alive(owner)[0]
            t = await env.kill(victim)
            takeover.append(await env.resumed(g, parts, t))
            await env.wait_ready([await env.spawn(g, owner, extra=failing)])
        await env.progress(10)
        await env.stop_publishing()

        def poison_data() -> list[str]:
            return [d for _, (k, d) in sorted(g.published.items()) if k == "k0"]

        async def dead() -> list[Any]:
            return await list_dead_letters(env.nc, flavour, g.stream, GROUP)

        rest = g.expected - {seq for seq, (k, _) in g.published.items() if k == "k0"}
        await wait_until(lambda: rest <= g.rec.acked_keys(), 60, "every other message acked")
        await wait_until_async(lambda: _count_is(dead(), len(poison_data())), 60, "k0's messages dead-lettered")
        entries = await dead()
        failures: list[str] = []
        if [e.data.decode() for e in entries] != poison_data():
            failures.append(f"dead letters {[e.data.decode() for e in entries]} are not k0's {poison_data()}")
        if [e.parked for e in entries] != [False] + [True] * (len(entries) - 1):
            failures.append(f"parked flags {[e.parked for e in entries]}: only the first ran")
        if set(failed()) != {poison_data()[0]}:
            failures.append(f"attempts at {sorted(set(failed()))}: only k0's first message may run")
        dead_lettered, attempts = len(entries), len(failed())

        # the fix deployed: every instance stopped, new ones without --fail; the dead letters replayed
        await env.stop_workers()
        g.workers = [w for w in g.workers if w.alive]  # stopped on purpose: none of them ended by itself
        await env.wait_ready([await env.spawn(g, m, extra=policy, name=f"{m}-fixed") for m in ("m1", "m2")])
        env.start_publishing()
        await env.progress(10)
        await execute_plan(env.nc, await plan_replay(env.nc, flavour, g.stream, GROUP, everything=True))
        await wait_until_async(lambda: _count_is(dead(), 0), 60, "the dead-letter stream emptied by the replay")
        await env.progress(10)
        await env.stop_publishing()
        replayed = set(g.replayed)
        rest = g.expected - {seq for seq, (k, d) in g.published.items() if k == "k0" and d in replayed}
        await wait_until(lambda: rest <= g.rec.acked_keys(), 60, "every message acked")
        if g.replayed != sorted(g.replayed, key=lambda d: int(d.split("-")[1])) or len(replayed) != len(g.replayed):
            failures.append(f"replayed in the order {g.replayed}: each once, in publish order expected")
        if not set(poison_data()[:dead_lettered]) <= replayed:
            failures.append(f"dead letters not replayed: {sorted(set(poison_data()[:dead_lettered]) - replayed)}")
        g.expected = rest  # the replayed messages are checked above: their success comes after their partition's
        r = env.result(
            f"replay-{flavour}",
            g,
            runs,
            bound=runs,
            takeover=takeover,
            t0=t_start,
            dead_lettered=dead_lettered,
            attempts=attempts,
            replayed=len(g.replayed),
        )
        r.failures += failures
        return r


async def _count_is(aw: Awaitable[list[Any]], n: int) -> bool:
    return len(await aw) == n


async def wait_until_async(pred: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)


async def slow_handler(count: int, verbose: bool = False) -> list[Result]:
    """Handlers running 1.6 x AckWait (2 partitions, a member each, max_ack_pending 1), ``count``
    messages per group: calling in_progress(), relying on automatic +WPI, and neither."""
    t_start = time.time()
    async with Env("slow", verbose=verbose) as env:
        groups = {}
        for progress in ("call", "auto", "none"):
            groups[progress] = await env.group(
                "static", {"m1": 1, "m2": 1}, partitions=2, work=1.6 * ACK_WAIT, progress=progress
            )
        for g in groups.values():
            await env.publish_batch(g, count)
        await env.drained(timeout=20 + count * 4 * ACK_WAIT)
        names = {"call": "slow-in-progress", "auto": "slow-auto-progress", "none": "slow-no-progress"}
        out = []
        for progress, g in groups.items():
            # With +WPI nothing is redelivered. Without it the server redelivers each message after AckWait
            # while its handler runs; the instance drops that copy once the original is acked.
            out.append(
                env.result(
                    names[progress],
                    g,
                    count,
                    bound=0,
                    takeover=[],
                    t0=t_start,
                    work_s=g.work,
                    ack_wait_s=ACK_WAIT,
                    server_redeliveries=await env.server_redeliveries(g),
                )
            )
        return out


# ============================================================== evidence: a server limit, without pcgroups
async def wq_source_crash_evidence() -> list[str]:
    """A plain work-queue stream W sourcing a stream O, one durable consumer acking everything (nats-py
    only, no pcgroups). Twice: publish 30 to O, consume and ack them from W, restart the server. When a
    graceful restart (SIGTERM) is followed by a crash (SIGKILL), W sources again the 30 messages it had
    sourced since the graceful restart: they are delivered and handled a second time."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig, StreamSource

    from pcgroups.testing._server import EmbeddedServer

    async def quiet(e: Exception) -> None:
        pass

    lines = []
    for first, second in (("SIGTERM", "SIGKILL"), ("SIGKILL", "SIGKILL"), ("SIGTERM", "SIGTERM")):
        srv = EmbeddedServer()
        await asyncio.to_thread(srv.start)
        try:
            nc = await nats.connect(srv.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1, error_cb=quiet)
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name="O", subjects=["o.*"]))
            await js.add_stream(
                StreamConfig(name="W", retention=RetentionPolicy.WORK_QUEUE, sources=[StreamSource(name="O")])
            )
            await js.add_consumer("W", ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT))
            sub = await js.pull_subscribe_bind("c", "W")
            steps = []
            for phase, how in ((1, first), (2, second)):
                for i in range(30):
                    await js.publish(f"o.{phase}x{i}", b"x")
                got = 0
                while got < 30:
                    for m in await sub.fetch(30 - got, timeout=5):
                        await m.ack_sync()
                        got += 1
                before = await js.stream_info("W")
                await asyncio.to_thread(srv.kill if how == "SIGKILL" else srv.stop)
                await asyncio.to_thread(srv.start)
                await wait_until(lambda nc=nc: not nc.is_reconnecting and nc.is_connected, 20, "reconnected")
                await asyncio.sleep(2)
                after = await bounded(js.stream_info("W"), 10, "stream info")
                ci = await bounded(js.consumer_info("W", "c"), 10, "consumer info")
                steps.append(
                    f"{how}: W last seq {before.state.last_seq} -> {after.state.last_seq}, "
                    f"{after.state.messages} messages, {ci.num_pending} pending for the consumer"
                )
            lines.append(f"{first} then {second}: " + "; ".join(steps))
            await nc.close()
        finally:
            await asyncio.to_thread(srv.close)
    return lines


# ============================================================== running them
SIZES = {  # scenario -> (CI size, --long size)
    "sigkill-static": (3, 20),
    "sigkill-elastic": (3, 20),
    "sigstop-static": (1, 10),
    "sigstop-elastic": (1, 10),
    "sigstop-buffered": (1, 5),
    "sigstop-keyed": (1, 5),
    "server-restart": (2, 6),
    "membership": (12, 50),
    "stepdown-storm": (8, 50),
    "stepdown-keyed": (4, 20),
    "pool-sigkill-worker": (3, 20),
    "pool-sigkill-dispatcher-static": (2, 10),
    "pool-sigkill-dispatcher-elastic": (2, 10),
    "pool-churn": (5, 30),
    "pool-server-restart": (1, 4),
    "pool-sigstop-worker": (1, 5),
    "pool-server-restart-2d": (1, 20),
    "pool-sigstop-dispatcher-key-static": (1, 20),
    "pool-sigstop-dispatcher-key-elastic": (1, 20),
    "pool-sigstop-dispatcher-burst-static": (1, 20),
    "pool-sigstop-dispatcher-burst-elastic": (1, 20),
    "pool-sigkill-dispatcher-long": (2, 20),
    "slow-handler": (4, 12),
    "replay-static": (2, 10),
    "replay-elastic": (2, 10),
    "partition-static": (1, 10),
    "partition-elastic": (1, 10),
    "slow-link": (1, 5),
    "server-closes": (2, 20),
    "cluster-partition": (1, 3),
    "poison-static": (1, 5),
    "poison-elastic": (1, 5),
}
EXTRA: dict[str, tuple[int, int]] = {}  # scenarios run only when named with --only
LIMITS = {
    "sigkill": 12,
    "sigstop": 15,
    "server-restart": 40,
    "membership": 8,
    "stepdown-storm": 4,
    "stepdown-keyed": 8,
    "pool-sigkill-worker": 8,
    "pool-sigkill-dispatcher": 12,
    "pool-churn": 6,
    "pool-server-restart": 40,
    "pool-sigstop-worker": 15,
    "pool-sigstop-dispatcher": 30,
    "pool-sigkill-dispatcher-long": 25,
    "slow-handler": 8,
    "replay": 20,
    "partition": 15,
    "slow-link": 15,
    "server-closes": 6,
    "cluster-partition": 60,
    "poison": 40,
}  # seconds allowed per run (plus setup)


async def poison(flavour: str, runs: int, verbose: bool = False) -> Result:
    """A message that always fails, on the strict path with park_keys (m1: 2 instances, max_deliver 4): each run
    SIGKILLs the pinned instance while it retries the failing message, then the next pinned one while it moves a
    parked key's message to the dead-letter stream (between the PubAck and the +TERM), a replacement started each
    time. Every other message is acked (the checker: lost, duplicates, order); the dead-letter stream holds the failing
    message and its key's later ones, each once, in order; none of those ran; no instance ended."""
    from pcgroups import JetStreamApi, work_queue_name
    from pcgroups.deadletters import dead_letter_stream, next_entry

    t_start = time.time()
    extra = ("--fail", "poison", "--max-deliver", "4", "--backoff", "0.3", "--park-keys", "--store-pause", "1.0")
    async with Env(f"poison-{flavour}", verbose=verbose) as env:
        g = await env.group(flavour, {"m1": 0}, partitions=1)
        await env.wait_ready([await env.spawn(g, "m1", extra=extra) for _ in range(2)])
        js = env.nc.jetstream()
        dead: list[int] = []  # stream sequences that must end in the dead-letter stream, in order

        async def send(key: str, data: str, *, fails: bool = False) -> None:
            ack = await js.publish(f"{g.stream}.{key}", data.encode(), timeout=5)
            g.sent += 1
            (dead.append if fails else g.expected.add)(ack.seq)

        async def kill_on(mark: str, what: str) -> None:
            def marked() -> Worker | None:
                return next(
                    (w for w in g.alive("m1") if any(m["ev"] == mark and what in m["data"] for m in w.marks)), None
                )

            await wait_until(lambda: marked() is not None, 30, f"a '{mark}' of {what}")
            victim = marked()
            assert victim is not None
            await env.kill(victim)
            env.log(f"killed {victim.name} on '{mark}' of {what}")
            await env.wait_ready([await env.spawn(g, "m1", extra=extra)])

        for run in range(runs):
            bad, good = f"k{100 + 2 * run}", f"k{101 + 2 * run}"  # a key parked for good, and one that flows
            await send(bad, f"poison-{run}", fails=True)
            for i in range(2):
                await send(bad, f"follows-{run}-{i}", fails=True)
                await send(good, f"ok-{run}-{i}")
            await kill_on("failed", f"poison-{run}")  # while it retries the failing message
            await kill_on("stored", f"follows-{run}-0")  # while it moves a parked key's message
            await env.progress(2, timeout=60)
        await env.drained(timeout=60)
        api = JetStreamApi(env.nc)
        stream = g.stream if flavour == "static" else work_queue_name(g.stream, GROUP)

        async def settled() -> bool:
            infos = await api.list_consumers(stream)
            return all(not c.get("num_ack_pending") and not c.get("num_pending") for c in infos)

        deadline = time.monotonic() + 30
        while not (done := await settled()) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        letters: list[Any] = []
        name, seq = dead_letter_stream(flavour, g.stream, GROUP), 1
        while (e := await next_entry(api, name, f"$PCG.DLQ.{flavour}.{g.stream}.{GROUP}.>", seq)) is not None:
            letters.append(e)
            seq = e.seq + 1
        stores = sum(1 for w in g.workers for m in w.marks if m["ev"] == "stored")
        r = env.result(
            f"poison-{flavour}",
            g,
            runs,
            bound=2 * runs,
            takeover=[],
            t0=t_start,
            dead_letters=len(letters),
            stored_again=stores - len(letters),  # a killed holder's dead letter, published again by the next one
        )
        if stores - len(letters) < runs:
            r.failures.append(f"{stores} dead letters stored for {len(letters)} entries: a kill missed its moment")
        origins = [e.origin_seq for e in letters]  # the work queue's sequences on an elastic group
        if len(set(origins)) != len(origins):
            r.failures.append(f"dead-lettered twice: {origins}")
        if len(letters) != len(dead) or origins != sorted(origins) or (flavour == "static" and origins != dead):
            r.failures.append(f"dead letters {origins} (origin sequences); {dead} expected, in order")
        if sum(1 for e in letters if e.headers.get("Pcg-Parked") == "1") != 2 * runs:
            r.failures.append(f"{2 * runs} messages should have followed their parked key: {[e.data for e in letters]}")
        ran = [c for c in g.rec.calls if c.key in dead]
        if ran:
            r.failures.append(f"messages of a parked key ran: {ran}")
        if not done:
            r.failures.append("messages still pending on the consumer after 30 s")
        return r


async def run_scenario(name: str, size: int, verbose: bool = False) -> list[Result]:
    """Run one scenario at ``size`` runs, bounded in time; its result rows."""
    if name.startswith("sigkill-"):
        coro = sigkill(name.split("-", 1)[1], size, verbose)
    elif name == "sigstop-keyed":
        coro = sigstop("static", size, verbose, window=8, name=name, concurrency=4)
    elif name == "sigstop-buffered":
        coro = sigstop("static", size, verbose, window=8, name=name)
    elif name.startswith("sigstop-"):
        coro = sigstop(name.split("-", 1)[1], size, verbose)
    elif name.startswith("partition-"):
        coro = partition(name.split("-", 1)[1], size, verbose)
    elif name == "slow-link":
        coro = slow_link(size, verbose)
    elif name == "server-closes":
        coro = server_closes(size, verbose)
    elif name == "cluster-partition":
        coro = cluster_partition(size, verbose)
    elif name == "server-restart":
        coro = server_restart(size, verbose)
    elif name == "membership":
        coro = membership(size, verbose)
    elif name == "stepdown-storm":
        coro = stepdown_storm(size, verbose)
    elif name == "stepdown-keyed":
        coro = stepdown_keyed(size, verbose)
    elif name == "pool-sigkill-worker":
        coro = pool_sigkill_worker(size, verbose)
    elif name == "pool-sigkill-dispatcher-long":
        coro = pool_sigkill_dispatcher_long(size, verbose)
    elif name.startswith("pool-sigkill-dispatcher-"):
        coro = pool_sigkill_dispatcher(name.rsplit("-", 1)[1], size, verbose)
    elif name.startswith("pool-sigstop-dispatcher-"):
        coro = pool_sigstop_dispatcher(name.rsplit("-", 1)[1], size, verbose, burst="-burst-" in name)
    elif name == "pool-churn":
        coro = pool_churn(size, verbose)
    elif name.startswith("pool-server-restart"):
        coro = pool_server_restart(size, verbose, dispatchers=2 if name.endswith("-2d") else 1)
    elif name == "pool-sigstop-worker":
        coro = pool_sigstop_worker(size, verbose)
    elif name.startswith("replay-"):
        coro = replay(name.split("-", 1)[1], size, verbose)
    elif name == "slow-handler":
        coro = slow_handler(size, verbose)
    elif name.startswith("poison-"):
        coro = poison(name.split("-", 1)[1], size, verbose)
    else:
        raise ValueError(f"unknown scenario {name!r}; one of {', '.join(SIZES)}")
    per_run = LIMITS[max((k for k in LIMITS if name.startswith(k)), key=len)]
    out = await bounded(coro, 60 + per_run * size, f"scenario {name}")
    return out if isinstance(out, list) else [out]


def machine() -> dict[str, Any]:
    from pcgroups.testing._server import nats_server_binary

    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    try:
        server = subprocess.run(
            [nats_server_binary(), "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except Exception as e:
        server = f"unknown ({e})"
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory": mem,
        "python": platform.python_version(),
        "os": platform.platform(),
        "nats_server": server,
        "loadavg_start": os.getloadavg(),
    }


def fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def table(results: list[Result]) -> str:
    head = (
        "scenario",
        "runs",
        "messages",
        "lost",
        "redelivered",
        "overlaps",
        "order violations",
        "takeover p50 s",
        "takeover p99 s",
        "ok",
    )
    rows = [head] + [
        (
            r.scenario,
            str(r.runs),
            str(r.messages),
            str(r.lost),
            f"{r.redelivered}"
            + (f" (≤{r.redelivery_bound})" if r.redelivery_bound is not None else "")
            + (f" ({r.redelivered_note})" if r.redelivered_note else ""),
            str(r.overlaps) + (f" ({r.overlap_note.split(';')[0]})" if r.overlap_note.split(";")[0] else ""),
            str(r.order_violations),
            fmt_s(r.takeover_p50),
            fmt_s(r.takeover_p99),
            "yes" if r.ok else "NO",
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


async def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--long", action="store_true", help="the long size (20 kills, 50 membership changes, ...)")
    p.add_argument("--runs", type=int, default=0, help="this many fault injections in each scenario named")
    p.add_argument("--only", default="", help="comma-separated scenarios: " + ", ".join(SIZES))
    p.add_argument("--json", default="", help="write the results and the machine here")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per fault on stderr")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(SIZES)
    sizes = SIZES | EXTRA
    for n in names:
        if n not in sizes:
            p.error(f"unknown scenario {n!r}; one of {', '.join(sizes)}")
    info = machine()
    print(
        f"machine: {info['nproc']} CPUs ({info['cpu']}), {info['memory']}, Python {info['python']}, "
        f"{info['nats_server']}, load average {' '.join(f'{x:.2f}' for x in info['loadavg_start'])}",
        flush=True,
    )
    results: list[Result] = []
    t0 = time.time()
    for n in names:
        size = args.runs or sizes[n][1 if args.long else 0]
        print(f"{n}: {size} runs ...", flush=True)
        try:
            rows = await run_scenario(n, size, args.verbose)
        except AssertionError as e:
            rows = [Result(n, runs=size, failures=[f"did not finish: {e}"])]
        for r in rows:
            print(
                f"  {r.scenario}: {r.messages} messages, lost {r.lost}, redelivered {r.redelivered}, "
                f"overlaps {r.overlaps}, order violations {r.order_violations}, takeover p50 "
                f"{fmt_s(r.takeover_p50)} s p99 {fmt_s(r.takeover_p99)} s, {r.seconds:.0f} s"
                + (f", {r.extra}" if r.extra else "")
                + ("" if r.ok else f"\n    FAILED: {r.failures}\n    {r.examples[:5]}"),
                flush=True,
            )
        results.extend(rows)
    info["loadavg_end"] = os.getloadavg()
    info["seconds"] = round(time.time() - t0)
    print()
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"size": "long" if args.long else "ci", "machine": info, "results": [r.to_dict() for r in results]},
                f,
                indent=1,
            )
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        asyncio.run(worker_main(sys.argv[2:]))
    elif len(sys.argv) > 1 and sys.argv[1] == "evidence":
        print("\n".join(asyncio.run(wq_source_crash_evidence())))
    else:
        sys.exit(asyncio.run(main(sys.argv[1:])))

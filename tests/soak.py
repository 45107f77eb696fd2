"""A long soak: a static and an elastic group under steady traffic for N minutes, with churn, while every
member instance reports what it costs over time.

usage: python -m tests.soak [--minutes N] [--json PATH] [--plot PNG] [--sample S] [-v]
       (scripts/soak runs it in the project's .venv; the plot needs the ``plot`` extra: matplotlib)

One nats-server (file storage, 127.0.0.1) and the harness of tests/chaos.py: every instance its own process
(``python -m tests.chaos worker ... --sample S``), printing a JSON line per handler start and end for
:class:`pcgroups.testing.Recorder` and, every S seconds, what it costs (tests/helpers/sampler.py: RSS, open file
descriptors, asyncio tasks, event-loop lag). AckWait 1 s, 4 partitions, 40 msg/s per group on 16 keys,
a 2 ms handler, ``max_ack_pending`` 1.

- static group: member m1 with two instances, m2 with one;
- elastic group: member e1 with two instances, e2 and x with one each; e1 and e2 are members at the start.

The churn (:class:`Schedule`; for N = 20 the numbers in brackets, shorter runs compress it so that each kind
happens at least once):

- **SIGKILL** of the pinned instance of m1 or e1 (the groups take turns), a new instance started [every minute];
- **add and drop** in the elastic group: x and e2 take turns being a member (one added, then the other
  dropped), so two long-lived instances are dropped and added again, and e1's instances take partitions and
  give them up [every two minutes];
- **a server restart** (SIGTERM, then started again on the same port and store) [in the middle];
- **resets** (``pcgroups.ops._offsets``, a replay to a second before the oldest message not yet acked) of the
  static and the elastic group in turn [every three minutes].

At the end publishing stops, every message must be acked, and the record is checked: nothing lost, no two
calls overlapping on a partition, first successes in publish order, calls beyond the first per message within
the bound the churn explains (a kill or a restart: the messages in flight; a reset: the messages it replays).

Each instance that lived long enough (:func:`measured`: its first minute plus half the run, at most five
minutes more) is held to the targets: RSS and open descriptors at the end (the median of its last samples)
less than 10 % above what they were after its first minute (the median of the samples that follow it), and
no more asyncio tasks at the end than then (:func:`growth`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .chaos import GROUP, Env, Group, Worker, bounded, fmt_s, machine, percentile, wait_until
from .helpers.sampler import open_fds, rss_kb

SAMPLE_EVERY = 5.0  # seconds between an instance's samples
WARMUP = 60.0  # an instance's first minute is not held to the targets
GROWTH_LIMIT = 0.10  # RSS and descriptors may grow less than this after the first minute
REPLAY_BACK = 40  # a reset replays from this many origin sequences before the oldest unacked message


@dataclass(frozen=True)
class Schedule:
    """When the churn happens, in seconds from the start of the traffic."""

    seconds: float
    kill_every: float
    change_every: float
    reset_every: float
    restart_at: float

    @classmethod
    def of(cls, minutes: float) -> Schedule:
        total = minutes * 60
        return cls(total, min(60.0, total / 4), min(120.0, total / 3), min(180.0, total / 3), total / 2)

    def events(self) -> list[tuple[float, str]]:
        """(time, kind) in time order: kinds ``kill``, ``change``, ``reset``, ``restart``; spread so that two
        kinds rarely fall together (kills on the period, changes and resets between them). The changes are
        even in number, so x and e2 end as they were after their first minute (a member has more tasks)."""
        out: list[tuple[float, str]] = []
        for every, offset, kind in (
            (self.kill_every, 0.0, "kill"),
            (self.change_every, self.kill_every / 2, "change"),
            (self.reset_every, self.kill_every / 4, "reset"),
        ):
            times = []
            t = every + offset
            while t < self.seconds - 5:
                times.append(t)
                t += every
            if kind == "change" and len(times) % 2:
                times.pop()
            out += [(t, kind) for t in times]
        out.append((self.restart_at + self.kill_every / 8, "restart"))
        return sorted(out)


@dataclass
class Event:
    """One churn event as it happened."""

    kind: str
    t: float  # time.time() when it was made
    group: str = ""  # static, elastic or both
    detail: str = ""
    takeover: float | None = None  # until every affected partition was handled again (s)
    replayed: int = 0  # messages a reset sends again


@dataclass
class Soak:
    """The run's state: the environment, the two groups, what happened, and the server's own samples."""

    env: Env
    static: Group
    elastic: Group
    schedule: Schedule
    t0: float = 0.0
    events: list[Event] = field(default_factory=list)
    server_samples: list[dict[str, Any]] = field(default_factory=list)
    bounds: dict[str, int] = field(default_factory=lambda: {"static": 0, "elastic": 0})
    _kills: int = 0
    _changes: int = 0
    _resets: int = 0

    def group(self, flavour: str) -> Group:
        return self.static if flavour == "static" else self.elastic

    def log(self, text: str) -> None:
        self.env.log(f"{time.time() - self.t0:7.1f}s {text}")

    # --- the churn --------------------------------------------------------------------------
    async def kill(self) -> Event:
        """SIGKILL the pinned instance of m1 (static) or e1 (elastic), in turn; a new one takes its place."""
        g = (self.static, self.elastic)[self._kills % 2]
        self._kills += 1
        member = "m1" if g is self.static else "e1"
        victim = g.active(member) or g.alive(member)[0]
        parts = g.partitions_of(member) or set(range(g.partitions))
        mark = len(g.rec.calls)
        t = await self.env.kill(victim)
        takeover = await resumed(g, parts, t, mark)
        await self.env.wait_ready([await self.env.spawn(g, member)])
        self.bounds[g.flavour] += 1  # the one message of the member's consumer in flight
        return Event("kill", t, g.flavour, victim.name, takeover)

    async def change(self) -> Event:
        """Add one of x and e2 to the elastic group, then drop the other (they take turns)."""
        from pcgroups import add_members, delete_members

        g = self.elastic
        new, old = ("x", "e2") if self._changes % 2 == 0 else ("e2", "x")
        self._changes += 1
        mark = len(g.rec.calls)
        t = time.time()
        await add_members(self.env.nc, g.stream, GROUP, [new])
        await delete_members(self.env.nc, g.stream, GROUP, [old])
        takeover = await resumed(g, set(range(g.partitions)), t, mark)
        self.bounds["elastic"] += 2  # each change may cost the message in flight (as in the chaos run)
        return Event("change", t, "elastic", f"+{new} -{old}", takeover)

    async def restart(self) -> Event:
        """Stop the server (SIGTERM) and start it again on the same port and store."""
        env = self.env
        marks = {g.flavour: len(g.rec.calls) for g in (self.static, self.elastic)}
        await asyncio.to_thread(env.server.stop)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(env.server.start)
        t_up = time.time()
        takeover = 0.0
        for g in (self.static, self.elastic):
            takeover = max(takeover, await resumed(g, set(range(g.partitions)), t_up, marks[g.flavour], timeout=60))
            self.bounds[g.flavour] += 3  # each member consumer's message in flight (three per group)
        return Event("restart", t_up, "both", "SIGTERM, started again", takeover)

    async def reset(self) -> Event:
        """Replay the static or the elastic group (in turn) from just before its oldest message not yet acked."""
        from pcgroups.ops._offsets import Target, execute_reset, plan_elastic_reset, plan_static_reset

        g = (self.static, self.elastic)[self._resets % 2]
        self._resets += 1
        pending = g.expected - g.rec.acked_keys()
        floor = min(pending) if pending else max(g.expected, default=0) + 1
        target = Target("seq", seq=max(1, floor - REPLAY_BACK))
        plan_of = plan_static_reset if g is self.static else plan_elastic_reset
        mark = len(g.rec.calls)
        t = time.time()
        plan = await execute_reset(self.env.nc, await plan_of(self.env.nc, g.stream, GROUP, target))
        replayed = sum(m.replay for m in plan.members) + sum(s.messages for s in plan.sources)
        takeover = await resumed(g, set(range(g.partitions)), t, mark)
        self.bounds[g.flavour] += replayed + 3  # what it replays, and each consumer's message in flight
        return Event("reset", t, g.flavour, f"replay from {target}", takeover, replayed)

    # --- the server's own cost --------------------------------------------------------------
    async def sample_server(self) -> None:
        while True:
            proc = self.env.server.proc
            try:
                if proc is not None and proc.poll() is None:
                    self.server_samples.append(
                        {"t": time.time(), "rss_kb": rss_kb(proc.pid), "fds": open_fds(proc.pid)}
                    )
            except OSError:
                pass  # restarting
            await asyncio.sleep(SAMPLE_EVERY)


async def resumed(g: Group, partitions: set[int], after: float, mark: int, timeout: float = 30.0) -> float:
    """Seconds from ``after`` until each partition started a call; only the calls recorded since index ``mark``
    are looked at (the record grows to 100,000 calls in a long run)."""
    first: dict[int, float] = {}
    seen = mark

    def done() -> bool:
        nonlocal seen
        calls = g.rec.calls
        for c in calls[seen:]:
            if c.start > after and c.partition in partitions:
                first[c.partition] = min(first.get(c.partition, c.start), c.start)
        seen = len(calls)
        return len(first) == len(partitions)

    await wait_until(done, timeout, f"{g.flavour} partitions {sorted(partitions)} handled again")
    return max(first.values()) - after


# ============================================================== what each instance cost
@dataclass
class Growth:
    """One instance's cost after its first minute (``start``: the samples that follow it) and at its end."""

    instance: str
    group: str
    lived_s: float
    measured: bool
    samples: int
    rss_start_kb: float = 0.0
    rss_end_kb: float = 0.0
    fds_start: float = 0.0
    fds_end: float = 0.0
    tasks_start: float = 0.0
    tasks_end: float = 0.0
    end_state: str = ""  # pinned, standby or idle (not a member): tasks compare within it
    lag_p50_ms: float | None = None
    lag_p99_ms: float | None = None
    lag_max_ms: float | None = None

    @property
    def rss_growth(self) -> float:
        return self.rss_end_kb / self.rss_start_kb - 1 if self.rss_start_kb else 0.0

    @property
    def fds_growth(self) -> float:
        return self.fds_end / self.fds_start - 1 if self.fds_start else 0.0

    @property
    def failures(self) -> list[str]:
        if not self.measured:
            return []
        out = []
        if self.rss_growth >= GROWTH_LIMIT:
            out.append(f"{self.instance}: RSS grew {self.rss_growth:.1%} after its first minute")
        if self.fds_growth >= GROWTH_LIMIT:
            out.append(f"{self.instance}: open descriptors grew {self.fds_growth:.1%} after its first minute")
        if self.tasks_end > self.tasks_start:
            out.append(f"{self.instance}: asyncio tasks grew from {self.tasks_start:g} to {self.tasks_end:g}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"rss_growth": round(self.rss_growth, 4), "fds_growth": round(self.fds_growth, 4)}


def window(seconds: float) -> float:
    """How long the start and end windows of an instance's samples are: a minute, shorter in short runs."""
    return min(60.0, seconds / 8)


def measured(lived: float, run_seconds: float) -> bool:
    """Whether an instance lived long enough to be held to the targets: its first minute, then half the run
    (at most five minutes)."""
    return lived >= WARMUP + min(300.0, run_seconds / 2) - SAMPLE_EVERY


def growth(w: Worker, run_seconds: float) -> Growth:
    """The instance's cost at the start (the median of the samples in the window after its first minute) and at
    the end (the median of the samples in the window before its last); tasks within the state it ended in."""
    s = w.samples
    lived = (s[-1]["t"] - w.started_at) if s else 0.0
    g = Growth(w.name, w.group.flavour, round(lived, 1), measured(lived, run_seconds), len(s))
    if not s:
        return g
    span = window(run_seconds)
    first = [x for x in s if WARMUP <= x["t"] - w.started_at <= WARMUP + span] or s[:1]
    last = [x for x in s if x["t"] >= s[-1]["t"] - span]
    g.rss_start_kb, g.rss_end_kb = (statistics.median(x["rss_kb"] for x in xs) for xs in (first, last))
    g.fds_start, g.fds_end = (statistics.median(x["fds"] for x in xs) for xs in (first, last))
    # tasks: in the state the instance ended in (pinned, standby, idle), its first samples after its first
    # minute against its last. A leak is a lasting rise, so the fewest tasks at the end are held against the
    # most at the start: a task that lives a moment (a pull, a restart after a reset) in one sample is no leak.
    state = s[-1].get("state")
    same = [x for x in s if x.get("state") == state]
    after = [x for x in same if x["t"] - w.started_at >= WARMUP] or same
    first_same = [x for x in after if x["t"] <= after[0]["t"] + span]
    last_same = [x for x in last if x.get("state") == state]
    g.tasks_start = max((x["tasks"] for x in first_same), default=0.0)
    g.tasks_end = min((x["tasks"] for x in last_same), default=0.0)
    g.end_state = str(state or "")
    lags = [x["lag_max_ms"] for x in s]
    g.lag_p50_ms, g.lag_p99_ms, g.lag_max_ms = percentile(lags, 50), percentile(lags, 99), max(lags)
    return g


# ============================================================== the run
async def soak(minutes: float, *, verbose: bool = False, sample: float = SAMPLE_EVERY) -> dict[str, Any]:
    """Run the soak for ``minutes``; its results (JSON-able): groups, instances, events, samples."""
    schedule = Schedule.of(minutes)
    t_start = time.time()
    info = machine()
    async with Env("soak", verbose=verbose) as env:
        gs = await env.group("static", {"m1": 2, "m2": 1}, sample=sample)
        ge = await env.group("elastic", {"e1": 2, "e2": 1, "x": 1}, add=["e1", "e2"], sample=sample)
        run = Soak(env, gs, ge, schedule)
        server = asyncio.create_task(run.sample_server())
        try:
            env.start_publishing()
            await env.progress(20)
            run.t0 = time.time()
            for at, kind in schedule.events():
                await asyncio.sleep(max(0.0, run.t0 + at - time.time()))
                ev = await getattr(run, kind)()
                run.events.append(ev)
                run.log(
                    f"{ev.kind} ({ev.group}: {ev.detail}): handled again after {fmt_s(ev.takeover)} s"
                    + (f", {ev.replayed} replayed" if ev.replayed else "")
                )
            await asyncio.sleep(max(0.0, run.t0 + schedule.seconds - time.time()))
            t_end = time.time()
            await env.stop_publishing()
            await env.drained(timeout=120)
        finally:
            server.cancel()
        return results(run, t_start, t_end) | {"machine": info | {"loadavg_end": os.getloadavg()}}


def results(run: Soak, t_start: float, t_end: float) -> dict[str, Any]:
    seconds = run.schedule.seconds
    groups = {}
    for g in (run.static, run.elastic):
        report = g.rec.check(g.expected, redelivery_bound=run.bounds[g.flavour])
        ended = [(w.name, w.ended) for w in g.workers if w.ended and w.killed_at is None]
        groups[g.flavour] = {
            "stream": g.stream,
            "messages": len(g.expected),
            "lost": report.lost,
            "redelivered": report.redelivered,
            "redelivery_bound": run.bounds[g.flavour],
            "duplicates": report.duplicates,
            "overlaps": report.overlaps,
            "order_violations": report.order_violations,
            "instances_ended": ended,
            "failures": report.failures + ([f"instances ended: {ended}"] if ended else []),
            "examples": [f"{v.kind}: {v.message}" for v in report.examples],
        }
    workers = [w for g in (run.static, run.elastic) for w in g.workers]
    instances = [growth(w, seconds) for w in workers]
    takeovers: dict[str, list[float]] = {}
    for ev in run.events:
        if ev.takeover is not None:
            takeovers.setdefault(ev.kind, []).append(round(ev.takeover, 3))
    failures = [f"{k}: {f}" for k, v in groups.items() for f in v["failures"]]
    failures += [f for i in instances for f in i.failures]
    if not any(i.measured for i in instances):
        failures.append("no instance lived long enough to be measured")
    return {
        "minutes": seconds / 60,
        "seconds": round(time.time() - t_start),
        "schedule": asdict(run.schedule),
        "groups": groups,
        "instances": [i.to_dict() for i in instances],
        "events": [asdict(e) | {"at": round(e.t - run.t0, 1)} for e in run.events],
        "takeover": {k: {"count": len(v), "p50": percentile(v, 50), "max": max(v)} for k, v in takeovers.items()},
        "t0": run.t0,
        "t_end": t_end,
        "samples": {
            w.name: {"group": w.group.flavour, "started": w.started_at, "killed": w.killed_at, "samples": w.samples}
            for w in workers
        },
        "server_samples": run.server_samples,
        "failures": failures,
        "ok": not failures,
    }


# ============================================================== printing and plotting
def tables(res: dict[str, Any]) -> str:
    """The two markdown tables of docs/RELIABILITY.md: the groups' invariants, each instance's cost."""
    out = [
        "| group | messages | lost | redelivered (bound) | overlaps | order violations |",
        "|---|---|---|---|---|---|",
    ]
    for name, g in res["groups"].items():
        out.append(
            f"| {name} | {g['messages']} | {g['lost']} | {g['redelivered']} (≤ {g['redelivery_bound']}) "
            f"| {g['overlaps']} | {g['order_violations']} |"
        )
    out += ["", "| churn | count | handled again p50 | max |", "|---|---|---|---|"]
    for kind, t in res["takeover"].items():
        out.append(f"| {kind} | {t['count']} | {t['p50']:.2f} s | {t['max']:.2f} s |")
    out += [
        "",
        "| instance | group | lived | RSS after 1 min → end | descriptors | tasks | loop lag p50 / p99 / max |",
        "|---|---|---|---|---|---|---|",
    ]
    for i in sorted(res["instances"], key=lambda i: (not i["measured"], i["group"], i["instance"])):
        if not i["samples"]:
            continue
        mark = "" if i["measured"] else " ¹"
        out.append(
            f"| {i['instance']}{mark} | {i['group']} | {i['lived_s'] / 60:.1f} min "
            f"| {i['rss_start_kb'] / 1024:.1f} → {i['rss_end_kb'] / 1024:.1f} MiB ({i['rss_growth']:+.1%}) "
            f"| {i['fds_start']:g} → {i['fds_end']:g} | {i['tasks_start']:g} → {i['tasks_end']:g} ({i['end_state']}) "
            f"| {i['lag_p50_ms']:g} / {i['lag_p99_ms']:g} / {i['lag_max_ms']:g} ms |"
        )
    return "\n".join(out)


def plot(res: dict[str, Any], path: str) -> None:
    """RSS, descriptors, tasks and loop lag of every instance over the run, with the churn marked (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = res["t0"]
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    panels = (
        ("rss_kb", "RSS (MiB)", 1 / 1024),
        ("fds", "open descriptors", 1),
        ("tasks", "asyncio tasks", 1),
        ("lag_max_ms", "loop lag, worst per sample (ms)", 1),
    )
    measured = {i["instance"]: i["measured"] for i in res["instances"]}
    for ax, (key, label, scale) in zip(axes, panels, strict=False):
        for name, w in sorted(res["samples"].items()):
            s = w["samples"]
            if not s:
                continue
            xs = [(x["t"] - t0) / 60 for x in s]
            ys = [x[key] * scale for x in s]
            if measured.get(name):
                ax.plot(xs, ys, linewidth=1.2, label=f"{name} ({w['group']})")
            else:
                ax.plot(xs, ys, linewidth=0.6, color="grey", alpha=0.5)
        if key in ("rss_kb", "fds") and res["server_samples"]:
            s = res["server_samples"]
            ax2 = ax.twinx()
            ax2.plot(
                [(x["t"] - t0) / 60 for x in s],
                [x[key] * scale for x in s],
                color="black",
                linestyle=":",
                linewidth=1,
                label="nats-server",
            )
            ax2.set_ylabel("nats-server", fontsize=8)
            ax2.tick_params(labelsize=8)
        ax.set_ylabel(label, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        for ev in res["events"]:
            color = {"kill": "red", "change": "blue", "reset": "green", "restart": "black"}[ev["kind"]]
            ax.axvline(ev["at"] / 60, color=color, alpha=0.25, linewidth=0.8)
    axes[0].legend(fontsize=7, ncol=3, loc="upper left")
    axes[-1].set_xlabel(
        "minutes since the traffic started (red: SIGKILL, blue: add and drop, green: reset, "
        "black: server restart; grey: instances not held to the targets)",
        fontsize=8,
    )
    fig.suptitle(f"pcgroups soak, {res['minutes']:g} minutes", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


async def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=20.0, help="how long the traffic and the churn run (default 20)")
    p.add_argument("--json", default="", help="write the results, every sample and the machine here")
    p.add_argument("--plot", default="", help="draw RSS, descriptors, tasks and loop lag over time into this PNG")
    p.add_argument("--sample", type=float, default=SAMPLE_EVERY, help="seconds between an instance's samples")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per churn event on stderr")
    args = p.parse_args(argv)
    if args.minutes < 2:
        p.error(f"--minutes {args.minutes:g}: the soak needs at least 2 (an instance's first minute is warm-up)")
    if args.plot:
        try:
            import matplotlib  # noqa: F401 - imported to learn whether it is installed
        except ImportError:
            p.error("--plot needs matplotlib: pip install -e '.[plot]'")
    info = machine()
    print(
        f"machine: {info['nproc']} CPUs ({info['cpu']}), {info['memory']}, Python {info['python']}, "
        f"{info['nats_server']}, load average {' '.join(f'{x:.2f}' for x in info['loadavg_start'])}",
        flush=True,
    )
    print(f"soak: {args.minutes:g} minutes of traffic and churn ...", flush=True)
    limit = args.minutes * 60 + 300
    try:
        res = await bounded(soak(args.minutes, verbose=args.verbose, sample=args.sample), limit, "the soak")
    except AssertionError as e:
        print(f"FAILED: did not finish: {e}", flush=True)
        return 1
    print()
    print(tables(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    if args.plot:
        plot(res, args.plot)
    for line in res["failures"]:
        print(f"FAILED: {line}")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))

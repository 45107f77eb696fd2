"""Recording handler calls and checking a group's guarantees (docs/DESIGN.md, *Guarantees*) on the record.

A :class:`Recorder` keeps one :class:`Call` per handler invocation: who ran it (member, instance),
on which partition, which message (``key``: a message id, or the stream sequence), its publish
order, when it started and ended, and how it ended (``ack``, ``nak``, ``error``, ``killed``; None
while it runs). Recording is an append to a list, cheap enough for a hot handler, and safe from a
sync handler's worker thread.

Calls can be recorded

- in-process, around a handler: ``rec.handler(member, instance, work)`` or ``rec.start``/``rec.end``;
- from other processes: each prints JSON lines (``event_line``) and the parent ``feed``\\ s them.

:meth:`Recorder.check` then looks at the whole record and returns a :class:`Report`:

- **no loss**: every expected message was acked at least once;
- **order of success**: per partition, the first successes come in publish order;
- **exclusivity**: on one partition no two calls ever overlapped in time, across members and
  instances (a call of a killed instance ends when it was killed);
- **redeliveries within a bound**: calls beyond the first per message, at most ``redelivery_bound``.

Times are seconds on one clock for all calls (``time.time()`` by default, so that calls recorded in
several processes of one machine compare). Record a call's end just after handing the ack to the
client, before the server can see it: a call that starts because of that ack then always starts
after the recorded end.
"""

from __future__ import annotations

import inspect
import itertools
import json
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["SOURCE_HEADER", "Call", "Recorder", "Report", "Violation", "event_line", "origin_of"]

SOURCE_HEADER = "Nats-Stream-Source"
ACK = "ack"
NAK = "nak"
ERROR = "error"
KILLED = "killed"
EXAMPLES = 5


@dataclass(slots=True)
class Call:
    """One handler invocation."""

    member: str
    instance: str
    partition: int
    key: Hashable  # the message's identity: a message id, or its origin stream sequence
    order: int  # publish order within the partition (default: the origin stream sequence)
    start: float
    end: float | None = None
    outcome: str | None = None  # ack, nak, error, killed; None while running
    seq: int = 0  # the stream sequence it was delivered with (informative)
    subject: str = ""
    deliveries: int = 1

    @property
    def acked(self) -> bool:
        return self.outcome == ACK

    def show(self) -> str:
        end = f"{self.end:.3f}" if self.end is not None else "running"
        extra = f" seq {self.seq}" if self.seq and self.seq != self.key else ""
        extra += f" delivery {self.deliveries}" if self.deliveries > 1 else ""
        return (
            f"{self.member}/{self.instance} p{self.partition} #{self.key}{extra} "
            f"[{self.start:.3f}..{end}] {self.outcome or 'open'}"
        )


@dataclass
class Violation:
    """An offending example: what went wrong and the calls involved."""

    kind: str  # lost, order, overlap, redelivery
    message: str
    calls: list[Call] = field(default_factory=list)

    def __str__(self) -> str:
        return self.message


@dataclass
class Report:
    """What :meth:`Recorder.check` found. ``ok`` is True when every check passed."""

    calls: int = 0  # handler calls recorded
    processed: int = 0  # distinct messages acked at least once
    expected: int | None = None  # messages expected (None: no-loss not checked)
    lost: int = 0  # expected messages never acked
    redelivered: int = 0  # calls beyond the first per message
    duplicates: int = 0  # messages acked more than once
    redelivery_bound: int | None = None
    overlaps: int = 0  # pairs of calls overlapping on one partition
    order_violations: int = 0  # first successes out of publish order
    open_calls: int = 0  # calls still running (counted as running until the end of the record)
    partitions: int = 0
    by_instance: dict[str, int] = field(default_factory=dict)  # acked calls per instance
    lost_examples: list[Hashable] = field(default_factory=list)
    examples: list[Violation] = field(default_factory=list)  # the first few offending examples per kind

    @property
    def redeliveries_ok(self) -> bool:
        return self.redelivery_bound is None or self.redelivered <= self.redelivery_bound

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.overlaps == 0 and self.order_violations == 0 and self.redeliveries_ok

    @property
    def failures(self) -> list[str]:
        """One line per failed check (empty when ``ok``)."""
        out = []
        if self.lost:
            out.append(f"{self.lost} of {self.expected} messages never acked, e.g. {self.lost_examples}")
        if self.overlaps:
            out.append(f"{self.overlaps} overlapping calls on one partition")
        if self.order_violations:
            out.append(f"{self.order_violations} successes out of publish order")
        if not self.redeliveries_ok:
            out.append(f"{self.redelivered} redeliveries, more than the bound of {self.redelivery_bound}")
        return out

    def assert_ok(self) -> Report:
        """Raise AssertionError naming every failed check and the first offending calls (for tests)."""
        if not self.ok:
            lines = self.failures + [f"  {v.kind}: {v.message}" for v in self.examples]
            raise AssertionError("invariants violated:\n" + "\n".join(lines))
        return self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        d["lost_examples"] = [_jsonable(k) for k in self.lost_examples]
        d["examples"] = [{"kind": v.kind, "message": v.message} for v in self.examples]
        return d


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def origin_of(msg: Any) -> tuple[str, int]:
    """(origin subject, origin stream sequence) of a pcgroups message.

    Elastic messages are sourced into the work queue: their ``Nats-Stream-Source`` header reads
    ``<origin stream> <origin seq> ...``. Static messages carry their own stream sequence.
    """
    headers = getattr(msg, "headers", None) or {}
    source = headers.get(SOURCE_HEADER)
    if source:
        parts = source.split(" ")
        if len(parts) >= 2 and parts[1].isdigit():
            return msg.subject, int(parts[1])
    return msg.subject, msg.metadata.sequence.stream


def event_line(
    ev: str,
    *,
    member: str,
    instance: str,
    partition: int,
    key: Any,
    order: int | None = None,
    seq: int = 0,
    subject: str = "",
    outcome: str | None = None,
    deliveries: int = 1,
    t: float | None = None,
) -> str:
    """A JSON line another process prints for :meth:`Recorder.feed` (``ev``: ``start`` or ``end``)."""
    obj: dict[str, Any] = {
        "ev": ev,
        "member": member,
        "instance": instance,
        "partition": partition,
        "key": key,
        "seq": seq,
        "t": time.time() if t is None else t,
    }
    if order is not None:
        obj["order"] = order
    if subject:
        obj["subject"] = subject
    if outcome is not None:
        obj["outcome"] = outcome
    if deliveries != 1:
        obj["deliveries"] = deliveries
    return json.dumps(obj, separators=(",", ":"))


class Recorder:
    """The record of every handler call of a run, and the checks on it."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.calls: list[Call] = []
        self.clock = clock
        self._open: dict[tuple[str, Hashable], Call] = {}  # (instance, key) -> running call (for feed)

    # --- recording ------------------------------------------------------------------------
    def start(
        self,
        member: str,
        instance: str,
        partition: int,
        key: Hashable,
        *,
        order: int | None = None,
        seq: int = 0,
        subject: str = "",
        deliveries: int = 1,
        t: float | None = None,
    ) -> Call:
        """Record the start of a call; ``order`` defaults to ``key`` when it is an int, else ``seq``."""
        if order is None:
            order = key if isinstance(key, int) else seq
        call = Call(
            member,
            instance,
            partition,
            key,
            order,
            self.clock() if t is None else t,
            seq=seq,
            subject=subject,
            deliveries=deliveries,
        )
        self.calls.append(call)
        self._open[(instance, key)] = call
        return call

    def end(self, call: Call, outcome: str = ACK, *, t: float | None = None) -> Call:
        """Record the end of a call: ``ack``, ``nak`` or ``error``."""
        call.end = self.clock() if t is None else t
        call.outcome = outcome
        if self._open.get((call.instance, call.key)) is call:
            del self._open[(call.instance, call.key)]
        return call

    def record(
        self,
        member: str,
        instance: str,
        partition: int,
        key: Hashable,
        start: float,
        end: float | None,
        outcome: str | None = ACK,
        *,
        order: int | None = None,
        seq: int = 0,
        subject: str = "",
        deliveries: int = 1,
    ) -> Call:
        """Record a whole call at once."""
        if order is None:
            order = key if isinstance(key, int) else seq
        call = Call(
            member,
            instance,
            partition,
            key,
            order,
            start,
            end,
            outcome if end is not None else None,
            seq=seq,
            subject=subject,
            deliveries=deliveries,
        )
        self.calls.append(call)
        return call

    def start_msg(
        self, member: str, instance: str, msg: Any, *, key: Hashable | None = None, order: int | None = None
    ) -> Call:
        """Record the start of a call on a pcgroups message (key: the origin stream sequence by default)."""
        subject, origin_seq = origin_of(msg)
        try:
            deliveries = msg.metadata.num_delivered or 1
        except Exception:
            deliveries = 1
        return self.start(
            member,
            instance,
            msg.partition,
            origin_seq if key is None else key,
            order=order if order is not None else origin_seq,
            seq=origin_seq,
            subject=subject,
            deliveries=deliveries,
        )

    def handler(
        self,
        member: str,
        instance: str,
        work: Callable[[Any], Awaitable[None] | None] | None = None,
        *,
        key: Callable[[Any], Hashable] | None = None,
    ) -> Callable[[Any], Awaitable[None]]:
        """An async handler that records the call, runs ``work(msg)`` (if any), acks, and records the end.

        ``key(msg)`` gives the message id (default: the origin stream sequence). A failing ``work``
        naks the message, is recorded as ``error`` and re-raised (the instance ends).
        """

        async def handle(msg: Any) -> None:
            call = self.start_msg(member, instance, msg, key=key(msg) if key is not None else None)
            try:
                if work is not None:
                    result = work(msg)
                    if inspect.isawaitable(result):
                        await result
            except BaseException:
                self.end(call, ERROR)
                raise
            await msg.ack()
            self.end(call, ACK)

        return handle

    def feed(self, event: str | bytes | dict[str, Any]) -> Call | None:
        """Record one event line (see :func:`event_line`) from another process; other lines are ignored.

        A ``start`` opens a call, an ``end`` closes the open call of the same instance and key (or
        records a whole call when the start was missed).
        """
        if isinstance(event, (str, bytes)):
            try:
                event = json.loads(event)
            except ValueError:
                return None
        if not isinstance(event, dict):
            return None
        ev = event.get("ev")
        if ev not in ("start", "end"):
            return None
        try:
            member, instance = str(event["member"]), str(event["instance"])
            key = event["key"]
            partition = int(event.get("partition", -1))
            t = float(event["t"])
        except (KeyError, TypeError, ValueError):
            return None
        order = event.get("order")
        seq = int(event.get("seq") or 0)
        if ev == "start":
            return self.start(
                member,
                instance,
                partition,
                key,
                order=order,
                seq=seq,
                subject=event.get("subject", ""),
                deliveries=int(event.get("deliveries", 1)),
                t=t,
            )
        call = self._open.get((instance, key))
        if call is None:
            call = self.record(
                member, instance, partition, key, t, t, order=order, seq=seq, subject=event.get("subject", "")
            )
        return self.end(call, event.get("outcome") or ACK, t=t)

    def close_instance(self, instance: str, *, t: float | None = None, outcome: str = KILLED) -> int:
        """End the running calls of an instance that died (SIGKILL): they stopped when it did."""
        at = self.clock() if t is None else t
        n = 0
        for (inst, _), call in list(self._open.items()):
            if inst == instance:
                self.end(call, outcome, t=max(at, call.start))
                n += 1
        return n

    # --- views ----------------------------------------------------------------------------
    def acked_calls(self) -> list[Call]:
        return [c for c in list(self.calls) if c.outcome == ACK]

    def acked_keys(self) -> set[Hashable]:
        return {c.key for c in self.calls if c.outcome == ACK}

    def by_partition(self) -> dict[int, list[Call]]:
        out: dict[int, list[Call]] = defaultdict(list)
        for c in list(self.calls):
            out[c.partition].append(c)
        for calls in out.values():
            calls.sort(key=lambda c: c.start)
        return dict(out)

    def count(
        self,
        *,
        member: str | None = None,
        instance: str | None = None,
        partition: int | None = None,
        acked: bool = True,
        since: float = float("-inf"),
    ) -> int:
        return sum(
            1
            for c in list(self.calls)
            if (member is None or c.member == member)
            and (instance is None or c.instance == instance)
            and (partition is None or c.partition == partition)
            and (c.acked or not acked)
            and c.start >= since
        )

    def first_start(
        self,
        *,
        after: float = float("-inf"),
        member: str | None = None,
        instance: str | None = None,
        partition: int | None = None,
    ) -> float | None:
        starts = [
            c.start
            for c in list(self.calls)
            if c.start > after
            and (member is None or c.member == member)
            and (instance is None or c.instance == instance)
            and (partition is None or c.partition == partition)
        ]
        return min(starts) if starts else None

    def owners(self, partition: int, *, since: float = float("-inf")) -> list[str]:
        """The members that handled ``partition`` (calls started at or after ``since``), in order of first call."""
        seen: dict[str, None] = {}
        for c in self.by_partition().get(partition, []):
            if c.start >= since:
                seen.setdefault(c.member, None)
        return list(seen)

    def longest_pause(
        self,
        *,
        partitions: Iterable[int] | None = None,
        member: str | None = None,
        since: float = float("-inf"),
        until: float = float("inf"),
    ) -> float:
        """The longest time between consecutive call starts in [since, until] (calls filtered)."""
        wanted = set(partitions) if partitions is not None else None
        starts = sorted(
            c.start
            for c in list(self.calls)
            if since <= c.start <= until
            and (wanted is None or c.partition in wanted)
            and (member is None or c.member == member)
        )
        return max((b - a for a, b in itertools.pairwise(starts)), default=0.0)

    # --- checks ---------------------------------------------------------------------------
    def check(
        self,
        expected: Iterable[Hashable] | None = None,
        *,
        redelivery_bound: int | None = None,
        now: float | None = None,
        examples: int = EXAMPLES,
    ) -> Report:
        """Check the record. ``expected``: the keys that must have been acked (None: skip no-loss).

        ``redelivery_bound``: the most calls beyond the first per message the run may make (None:
        report only). Calls still running count as running until ``now`` (default: the clock).
        """
        calls = list(self.calls)
        end_of_open = self.clock() if now is None else now
        report = Report(calls=len(calls), redelivery_bound=redelivery_bound)
        report.open_calls = sum(1 for c in calls if c.end is None)
        acked = [c for c in calls if c.outcome == ACK]
        acked_keys = {c.key for c in acked}
        report.processed = len(acked_keys)
        by_instance: dict[str, int] = defaultdict(int)
        for c in acked:
            by_instance[c.instance] += 1
        report.by_instance = dict(sorted(by_instance.items()))
        found: dict[str, list[Violation]] = defaultdict(list)

        # no loss
        if expected is not None:
            expected_set = set(expected)
            report.expected = len(expected_set)
            missing = expected_set - acked_keys
            report.lost = len(missing)
            report.lost_examples = sorted(missing, key=_sort_key)[:examples]
            if missing:
                found["lost"].append(
                    Violation(
                        "lost",
                        f"{len(missing)} of {len(expected_set)} messages never acked, e.g. {report.lost_examples}",
                    )
                )

        # redeliveries and duplicate successes
        calls_per_key: dict[Hashable, list[Call]] = defaultdict(list)
        for c in calls:
            calls_per_key[c.key].append(c)
        for key, cs in calls_per_key.items():
            report.redelivered += len(cs) - 1
            if sum(1 for c in cs if c.outcome == ACK) > 1:
                report.duplicates += 1
            if len(cs) > 1 and len(found["redelivery"]) < examples:
                cs = sorted(cs, key=lambda c: c.start)
                found["redelivery"].append(
                    Violation(
                        "redelivery", f"#{key} handled {len(cs)} times: " + ", then ".join(c.show() for c in cs), cs
                    )
                )

        # exclusivity and order, per partition
        parts = self.by_partition()
        report.partitions = len(parts)
        for partition, pcalls in sorted(parts.items()):
            latest: Call | None = None
            for c in pcalls:
                latest_end = 0.0 if latest is None else (latest.end if latest.end is not None else end_of_open)
                if latest is not None and c.start < latest_end:
                    report.overlaps += 1
                    if len(found["overlap"]) < examples:
                        found["overlap"].append(
                            Violation(
                                "overlap", f"partition {partition}: {latest.show()} overlaps {c.show()}", [latest, c]
                            )
                        )
                c_end = c.end if c.end is not None else end_of_open
                if latest is None or c_end > latest_end:
                    latest = c
            done: set[Hashable] = set()
            highest: Call | None = None
            for c in sorted((c for c in pcalls if c.outcome == ACK), key=lambda c: (c.end, c.start)):
                if c.key in done:
                    continue
                done.add(c.key)
                if highest is not None and c.order < highest.order:
                    report.order_violations += 1
                    if len(found["order"]) < examples:
                        found["order"].append(
                            Violation(
                                "order",
                                f"partition {partition}: {c.show()} succeeded after {highest.show()}",
                                [highest, c],
                            )
                        )
                if highest is None or c.order > highest.order:
                    highest = c

        report.examples = [v for kind in ("lost", "overlap", "order", "redelivery") for v in found[kind]]
        if report.redeliveries_ok:  # redeliveries within the bound are information, not offences
            report.examples = [v for v in report.examples if v.kind != "redelivery"]
        return report


def _sort_key(key: Hashable) -> tuple[int, Any]:
    return (0, key) if isinstance(key, (int, float)) else (1, str(key))

"""Recording handler runs and checking the group's guarantees (SPEC §1) on the record.

A :class:`Recorder` keeps one :class:`Run` per handler invocation: who ran it (member, instance),
which partition and which origin message (origin subject and sequence), when it started and when it
ended, and whether it acked. The checks look at the whole record afterwards:

- ``check_no_loss(expected)``: every expected origin message was acked at least once;
- ``check_no_overlap()``: on one partition no two runs ever overlapped in time (exclusivity), across
  members and instances;
- ``check_order()``: per partition, messages first succeeded in origin-stream order;
- ``check_no_duplicates()``: no origin message was processed twice.

Typical use, in a handler::

    rec = Recorder()
    handler = rec.handler("m1", "m1/a")            # records, acks, records the end
    # or by hand:
    run = rec.start("m1", "m1/a", msg)             # msg: a pcgroups Msg
    ...
    await msg.ack(); rec.end(run)

Times are ``time.monotonic()`` in the test process. An end is recorded after the ack is handed to
the client, i.e. before the server can see it, so a later run started because of that ack always
starts after the end recorded here.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

SOURCE_HEADER = "Nats-Stream-Source"


@dataclass
class Run:
    """One handler invocation."""

    member: str
    instance: str
    partition: int
    subject: str        # the origin subject (partition token stripped)
    seq: int            # the origin stream sequence (work-queue sequence when not sourced)
    start: float
    end: float | None = None
    acked: bool = False
    wq_seq: int = 0
    deliveries: int = 1

    @property
    def key(self) -> tuple[str, int]:
        return (self.subject, self.seq)


def origin_of(msg: Any) -> tuple[str, int]:
    """The origin (subject, stream sequence) of a pcgroups message.

    Elastic messages are sourced: their ``Nats-Stream-Source`` header reads
    ``<origin stream> <origin seq> <src> <dest> <origin subject> <id>``. Static ones carry their own
    sequence.
    """
    headers = msg.headers or {}
    source = headers.get(SOURCE_HEADER)
    if source:
        parts = source.split(" ")
        if len(parts) >= 2 and parts[1].isdigit():
            return msg.subject, int(parts[1])
    return msg.subject, msg.metadata.sequence.stream


@dataclass
class Recorder:
    """The record of every handler run of a scenario, and the checks on it."""

    runs: list[Run] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic

    # --- recording ------------------------------------------------------------------------
    def start(self, member: str, instance: str, msg: Any = None, *, partition: int | None = None,
              subject: str | None = None, seq: int | None = None) -> Run:
        """Record the start of a handler run; pass the pcgroups ``msg`` or the fields by hand."""
        wq_seq = deliveries = 0
        if msg is not None:
            o_subject, o_seq = origin_of(msg)
            subject = subject if subject is not None else o_subject
            seq = seq if seq is not None else o_seq
            partition = partition if partition is not None else msg.partition
            try:
                meta = msg.metadata
                wq_seq, deliveries = meta.sequence.stream, meta.num_delivered
            except Exception:
                pass
        run = Run(member=member, instance=instance, partition=-1 if partition is None else partition,
                  subject=subject or "", seq=seq or 0, start=self.clock(), wq_seq=wq_seq,
                  deliveries=deliveries or 1)
        self.runs.append(run)
        return run

    def end(self, run: Run, *, acked: bool = True) -> None:
        """Record the end of a run (``acked``: it succeeded)."""
        run.end = self.clock()
        run.acked = acked

    def handler(self, member: str, instance: str,
                work: Callable[[Any], Awaitable[None] | None] | None = None,
                on_done: Callable[[Run], None] | None = None) -> Callable[[Any], Awaitable[None]]:
        """An async handler that records, runs ``work(msg)`` (if any), acks, and records the end."""

        async def handle(msg: Any) -> None:
            run = self.start(member, instance, msg)
            try:
                if work is not None:
                    result = work(msg)
                    if asyncio.iscoroutine(result):
                        await result
                await msg.ack()
            except BaseException:
                self.end(run, acked=False)
                raise
            self.end(run)
            if on_done is not None:
                on_done(run)

        return handle

    # --- views ----------------------------------------------------------------------------
    def acked(self) -> list[Run]:
        return [r for r in self.runs if r.acked]

    def acked_keys(self) -> set[tuple[str, int]]:
        return {r.key for r in self.runs if r.acked}

    def count(self, member: str | None = None, *, instance: str | None = None, acked: bool = True) -> int:
        return sum(1 for r in self.runs if (member is None or r.member == member)
                   and (instance is None or r.instance == instance) and (r.acked or not acked))

    def by_partition(self) -> dict[int, list[Run]]:
        out: dict[int, list[Run]] = defaultdict(list)
        for r in self.runs:
            out[r.partition].append(r)
        for runs in out.values():
            runs.sort(key=lambda r: r.start)
        return dict(out)

    def owners(self, partition: int, *, since: float = float("-inf")) -> list[str]:
        """The members that ran messages of ``partition`` (started at or after ``since``), in order."""
        seen: dict[str, None] = {}
        for r in self.by_partition().get(partition, []):
            if r.start >= since:
                seen.setdefault(r.member, None)
        return list(seen)

    def longest_pause(self, *, partitions: Iterable[int] | None = None, member: str | None = None,
                      since: float = float("-inf"), until: float = float("inf")) -> float:
        """The longest time between consecutive run starts in [since, until] (runs filtered)."""
        wanted = set(partitions) if partitions is not None else None
        starts = sorted(r.start for r in self.runs if since <= r.start <= until
                        and (wanted is None or r.partition in wanted) and (member is None or r.member == member))
        return max((b - a for a, b in zip(starts, starts[1:])), default=0.0)

    def first_start(self, *, partition: int, member: str | None = None, after: float = float("-inf")) -> float | None:
        starts = [r.start for r in self.runs if r.partition == partition and r.start >= after
                  and (member is None or r.member == member)]
        return min(starts) if starts else None

    # --- checks ---------------------------------------------------------------------------
    def check_no_loss(self, expected: Iterable[tuple[str, int]]) -> None:
        """Every expected (origin subject, origin seq) was acked at least once."""
        expected = set(expected)
        missing = sorted(expected - self.acked_keys(), key=lambda k: k[1])
        assert not missing, f"{len(missing)} of {len(expected)} messages never acked, e.g. {missing[:10]}"

    def check_no_overlap(self, *, now: float | None = None) -> None:
        """On each partition, runs never overlap in time (a run not ended counts as running until ``now``)."""
        end_of_open = self.clock() if now is None else now
        problems = []
        for partition, runs in self.by_partition().items():
            latest: Run | None = None
            for r in runs:
                if latest is not None and r.start < (latest.end if latest.end is not None else end_of_open):
                    problems.append(f"partition {partition}: {_show(latest)} overlaps {_show(r)}")
                if latest is None or (r.end or end_of_open) > (latest.end or end_of_open):
                    latest = r
        assert not problems, f"{len(problems)} overlapping runs:\n" + "\n".join(problems[:10])

    def check_order(self) -> None:
        """Per partition, each message's first success comes after the first success of every older one."""
        problems = []
        for partition, runs in self.by_partition().items():
            done: set[tuple[str, int]] = set()
            highest: Run | None = None
            for r in sorted((r for r in runs if r.acked), key=lambda r: r.end or 0.0):
                if r.key in done:
                    continue
                done.add(r.key)
                if highest is not None and r.seq < highest.seq:
                    problems.append(f"partition {partition}: {_show(r)} succeeded after {_show(highest)}")
                if highest is None or r.seq > highest.seq:
                    highest = r
        assert not problems, f"{len(problems)} out-of-order successes:\n" + "\n".join(problems[:10])

    def check_no_duplicates(self) -> None:
        """No origin message was run twice (no redelivery of work already done or in progress)."""
        seen: dict[tuple[str, int], Run] = {}
        problems = []
        for r in sorted(self.runs, key=lambda r: r.start):
            if r.key in seen:
                problems.append(f"{_show(seen[r.key])} then {_show(r)}")
            else:
                seen[r.key] = r
        assert not problems, f"{len(problems)} duplicate runs:\n" + "\n".join(problems[:10])

    def check_all(self, expected: Iterable[tuple[str, int]], *, duplicates: bool = False) -> None:
        """No loss, no overlap, order of success; with ``duplicates=False`` also no duplicate runs."""
        self.check_no_loss(expected)
        self.check_no_overlap()
        self.check_order()
        if not duplicates:
            self.check_no_duplicates()


def _show(r: Run) -> str:
    end = f"{r.end:.4f}" if r.end is not None else "running"
    return (f"[{r.member}/{r.instance} p{r.partition} {r.subject}#{r.seq} {r.start:.4f}..{end}"
            f"{'' if r.acked else ' not acked'} delivery {r.deliveries}]")

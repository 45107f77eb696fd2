"""Offsets and planning for the ``pcgroups`` Spark source (plain Python: no pyspark, no network).

An offset is, per partition, the **next stream sequence to read** (as in Spark's Kafka source, where
an offset is the next record to read). Stream sequences are global to the stream, so one
``STREAM.INFO`` gives ``earliest`` (= first sequence) and ``latest`` (= last sequence + 1) for every
partition at once, and a micro-batch is, per partition, the half-open range ``[start, end)``.

Offsets are kept in Spark's checkpoint as ``{"<stream>": {"0": 1201, "1": 1201, ...}}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, PCGroupsError
from ._options import EARLIEST, LATEST

log = logging.getLogger("pcgroups.spark")


class DataLossError(PCGroupsError):
    """Messages inside the query's offsets are gone (retention, purge, or the stream was recreated)."""


@dataclass(frozen=True)
class StreamState:
    """What one ``STREAM.INFO`` says about the stream being read."""

    name: str
    first_seq: int
    last_seq: int
    retention: str = "limits"
    allow_direct: bool = False

    @property
    def earliest(self) -> int:
        return max(self.first_seq, 1)

    @property
    def latest(self) -> int:
        """One past the last sequence: the offset of the next message to be stored."""
        return self.last_seq + 1

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> StreamState:
        cfg, state = info.get("config", {}), info.get("state", {})
        return cls(
            name=cfg.get("name", ""),
            first_seq=int(state.get("first_seq", 0)),
            last_seq=int(state.get("last_seq", 0)),
            retention=cfg.get("retention", "limits"),
            allow_direct=bool(cfg.get("allow_direct", False)),
        )


@dataclass(frozen=True)
class Layout:
    """The partitions a query reads: resolved once on the driver from the options and the group."""

    stream: str  # the stream the messages are read from
    partition_count: int
    partitions: tuple[int, ...]  # the partitions read (all, or `assign`)
    filters: tuple[str, ...] = ()  # the group's filters, matched after the partition token

    def filter_subjects(self, p: int) -> tuple[str, ...]:
        return tuple(f"{p}.{f}" for f in self.filters) if self.filters else (f"{p}.>",)


def to_json(stream: str, seqs: dict[int, int]) -> dict[str, dict[str, int]]:
    return {stream: {str(p): int(s) for p, s in sorted(seqs.items())}}


def from_json(layout: Layout, offsets: dict[str, Any]) -> dict[int, int]:
    """Offsets as Spark hands them back (from our own :func:`to_json`, possibly out of a checkpoint)."""
    if not isinstance(offsets, dict) or len(offsets) != 1:
        raise ConfigError(f"not a pcgroups offset: {offsets!r}")
    ((stream, seqs),) = offsets.items()
    if stream != layout.stream:
        raise ConfigError(
            f"the checkpoint's offsets are for stream {stream!r}, but this source reads stream "
            f"{layout.stream!r}: use a new checkpoint location"
        )
    out = {int(p): int(s) for p, s in seqs.items()}
    if set(out) != set(layout.partitions):
        raise ConfigError(
            f"the checkpoint's offsets cover partitions {sorted(out)} of stream {stream!r}, but the source now "
            f"reads partitions {list(layout.partitions)} (did the group's partition count or `assign` change? "
            f"keys move between partitions when the count changes, so order per key cannot carry over): "
            f"use a new checkpoint location"
        )
    return out


def resolve_start(
    spec: str | dict[int, int] | None,
    state: StreamState,
    partitions: tuple[int, ...],
    *,
    timestamp_seq: int | None = None,
    default: str = "earliest",
) -> dict[int, int]:
    """Starting offsets from ``startingOffsets`` (or ``startingTimestamp``, resolved to a sequence)."""
    if timestamp_seq is not None:
        return {p: max(timestamp_seq, state.earliest) for p in partitions}
    spec = default if spec is None else spec
    if isinstance(spec, str):  # earliest or latest (_options.parse_offsets)
        return dict.fromkeys(partitions, state.earliest if spec == "earliest" else state.latest)
    missing = [p for p in partitions if p not in spec]
    extra = sorted(set(spec) - set(partitions))
    if missing or extra:
        raise ConfigError(
            f"startingOffsets must give every partition read, {list(partitions)}: "
            + (f"missing {missing}" if missing else f"unknown {extra}")
        )
    out = {}
    for p in partitions:
        s = spec[p]
        out[p] = state.earliest if s == EARLIEST else state.latest if s == LATEST else s
    return out


def resolve_end(spec: str | dict[int, int], state: StreamState, partitions: tuple[int, ...]) -> dict[int, int]:
    """Batch ending offsets (exclusive) from ``endingOffsets``."""
    if isinstance(spec, str):  # latest (_options.parse_offsets; earliest is refused there)
        return dict.fromkeys(partitions, state.latest)
    missing = [p for p in partitions if p not in spec]
    if missing:
        raise ConfigError(f"endingOffsets must give every partition read, {list(partitions)}: missing {missing}")
    return {p: state.latest if spec[p] == LATEST else spec[p] for p in partitions}


def check_data_loss(start: dict[int, int], state: StreamState, fail: bool) -> dict[int, int]:
    """Messages before ``first_seq`` are gone; offsets past ``latest`` mean the stream was recreated.

    With ``fail``: raise :class:`DataLossError` naming the partitions and the gap. Otherwise log it and
    continue from the first message still stored."""
    out = dict(start)
    for p, s in sorted(start.items()):
        if s < state.earliest and state.first_seq > 0:
            msg = (
                f"stream {state.name!r} partition {p}: messages with sequences {s}..{state.earliest - 1} were "
                f"removed (retention or purge) before they were read"
            )
            if fail:
                raise DataLossError(msg + "; set failOnDataLoss=false to skip them")
            log.warning("%s; skipping them (failOnDataLoss=false)", msg)
            out[p] = state.earliest
        elif s > state.latest:
            msg = (
                f"stream {state.name!r} partition {p}: the query's offset {s} is past the stream's last sequence "
                f"{state.last_seq} (was the stream deleted and created again?)"
            )
            if fail:
                raise DataLossError(
                    msg + "; use a new checkpoint or set failOnDataLoss=false to start again from the earliest message"
                )
            log.warning("%s; reading from the earliest message (failOnDataLoss=false)", msg)
            out[p] = state.earliest
    return out


def next_end(
    start: dict[int, int], latest: int, max_rows: int | None = None, target: int | None = None
) -> dict[int, int]:
    """The end of the next micro-batch.

    ``latest`` is one past the stream's last sequence, capped at ``target`` (the AvailableNow target).
    With ``max_rows`` the batch covers at most that many stream sequences past the lowest start, and
    since the partitions' ranges are disjoint subsets of that window, it holds at most ``max_rows``
    messages. Partitions without new messages still move their offset: an offset is a sequence
    watermark, not a count. Returns ``start`` unchanged when there is nothing new."""
    if not start:
        return dict(start)
    top = latest if target is None else min(latest, target)
    lo = min(start.values())
    end = top if max_rows is None else min(top, lo + max_rows)
    if end <= lo:
        return dict(start)
    return {p: max(s, end) for p, s in start.items()}


def ranges(start: dict[int, int], end: dict[int, int]) -> list[tuple[int, int, int]]:
    """``(partition, start, end)`` per partition with a non-empty range, in partition order."""
    return [(p, start[p], end[p]) for p in sorted(end) if end[p] > start.get(p, end[p])]

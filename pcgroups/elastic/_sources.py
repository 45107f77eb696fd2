"""Where an elastic group's messages come from: the streams its work queue sources.

An elastic group's work queue ``<name>-<group>`` sources one or more streams, each through subject
transforms that prepend the partition. Three layouts, all read by members exactly alike:

- **one stream** (the reference's layout): the group's own stream, one transform per partitioning
  filter (``{{Partition(N,i..)}}.<filter>``), or ``>`` hashed whole when there are no filters;
- **aggregate**: the group's own stream and further ``sources``, each partitioning filter belonging
  to the one stream whose subjects it matches. The same wildcard tokens hash to the same partition
  whatever the stream, so everything about one key (a customer) goes to one member in arrival order;
- **partition streams**: stream *i* of the list is partition *i*, sourced whole with a transform
  ``> → i.>`` (its subjects kept); the group's name need not be a stream.

The work queue's ``sources`` are the record of the layout: :func:`layout_of` reads them back. The
group's KV entry holds only the reference's fields (``partitioning_filters`` is the union of every
stream's filters, ``null`` for partition streams), so a Go member derives the right filter subjects
(``<p>.<filter>``, or ``<p>.>``) for every layout, and a Go tool rewriting the entry loses nothing.

A source added to a work queue that already exists always carries its start sequence: nats-server
starts a source added to an emptied work queue at the origin's end otherwise (its backlog skipped).

A stream may live in another JetStream than the work queue: another domain, across a leaf node
connection (``$JS.<domain>.API``), or another account's API imported under a prefix. Its source then
names that API (``external: {"api": <prefix>}``, nats-server's ``StreamSource.External``), and the
group's own requests about the stream (its info, where a replay starts) go to that API too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from ..config import PartitioningFilter
from ..errors import ConfigError
from ..jetstream._api import JetStreamApi
from ..jetstream._connection import domain_of, prefix_of
from ..partitions import subjects_intersect, transform_destination

T = TypeVar("T")

_PARTITION_DEST = re.compile(r"^(\d+)\.>$")


@dataclass(frozen=True)
class Start:
    """Where sourcing a stream begins: ``all`` (its first message, the default), ``new`` (what is
    published after the group is created), ``seq:N`` or ``time:RFC3339``."""

    kind: str = "all"
    seq: int = 0
    time: datetime | None = None

    @classmethod
    def parse(cls, text: str | Start) -> Start:
        if isinstance(text, Start):
            return text
        value = str(text).strip()
        head, _, rest = value.partition(":")
        if value in ("all", "new"):
            return cls(value)
        if head == "seq" and rest.isdigit() and int(rest) >= 1:
            return cls("seq", seq=int(rest))
        if head == "time" and rest:
            try:
                when = datetime.fromisoformat(rest.replace("Z", "+00:00"))
            except ValueError:
                when = None
            if when is not None and when.tzinfo is not None:
                return cls("time", time=when)
        raise ConfigError(
            f"invalid start {value!r}: use all, new, seq:N (N >= 1) or time:RFC3339 with a zone "
            "(e.g. time:2026-11-25T08:00:00Z)"
        )

    def __str__(self) -> str:
        if self.kind == "seq":
            return f"seq:{self.seq}"
        if self.kind == "time" and self.time is not None:
            return "time:" + _rfc3339(self.time)
        return self.kind


def _rfc3339(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class SourceStream:
    """One stream of a group's work queue: its name, the partitioning filters of its subjects
    (empty: the whole subject is hashed), the partition it is (partition-stream layout), its start, and
    the API prefix of the JetStream it is in when that is not the work queue's ("": the same)."""

    name: str
    filters: tuple[PartitioningFilter, ...] = ()
    partition: int | None = None
    start_seq: int = 0
    start_time: str = ""
    external_api: str = ""

    @property
    def domain(self) -> str | None:
        """The JetStream domain the stream is in, when it is another one than the work queue's."""
        return domain_of(self.external_api)

    @property
    def start(self) -> str:
        if self.start_seq:
            return f"seq:{self.start_seq}"
        return f"time:{self.start_time}" if self.start_time else "all"

    def describe(self) -> str:
        """``ORDERS (orders.* by 1)``, ``LOGS_3 (partition 3)``, ``ORDERS (whole subjects)``."""
        if self.partition is not None:
            what = f"partition {self.partition}"
        elif self.filters:
            what = ", ".join(
                f.filter + (f" by {','.join(map(str, f.partitioning_wildcards))}" if f.partitioning_wildcards else "")
                for f in self.filters
            )
        else:
            what = "whole subjects"
        return f"{self.name}{self.where} ({what})" + (f" from {self.start}" if self.start != "all" else "")

    @property
    def where(self) -> str:
        """`` in domain leaf`` or `` via <API prefix>`` for a stream in another JetStream; "" for one in the
        work queue's."""
        if not self.external_api:
            return ""
        return f" in domain {self.domain}" if self.domain else f" via {self.external_api}"


@dataclass(frozen=True)
class Layout:
    """The streams of an elastic group, in the work queue's order."""

    streams: tuple[SourceStream, ...] = field(default_factory=tuple)

    @property
    def kind(self) -> str:
        """``stream``, ``aggregate`` or ``partition-streams``."""
        if any(s.partition is not None for s in self.streams):
            return "partition-streams"
        return "aggregate" if len(self.streams) > 1 else "stream"

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.streams]

    def stream(self, name: str) -> SourceStream | None:
        return next((s for s in self.streams if s.name == name), None)

    def shape(self) -> tuple[Any, ...]:
        """What must be equal for two creates to mean the same group (start positions are history)."""
        return tuple((s.name, s.filters, s.partition, s.external_api) for s in self.streams)

    @property
    def external(self) -> bool:
        """Some stream is in another JetStream (domain or account) than the work queue."""
        return any(s.external_api for s in self.streams)


def source_config(src: SourceStream, max_members: int) -> dict[str, Any]:
    """The work queue's source entry for ``src``; a plain one-stream source is byte-identical to the reference's."""
    if src.partition is not None:
        transforms = [{"src": ">", "dest": f"{src.partition}.>"}]
    elif src.filters:
        transforms = [
            {"src": f.filter, "dest": transform_destination(f.filter, f.partitioning_wildcards, max_members)}
            for f in src.filters
        ]
    else:
        transforms = [{"src": ">", "dest": transform_destination(">", None, max_members)}]
    out: dict[str, Any] = {"name": src.name}
    if src.start_seq:
        out["opt_start_seq"] = src.start_seq
    if src.start_time:
        out["opt_start_time"] = src.start_time
    out["subject_transforms"] = transforms
    if src.external_api:
        out["external"] = {"api": src.external_api, "deliver": ""}
    return out


def layout_of(stream_config: dict[str, Any], filters: list[PartitioningFilter] | None) -> Layout:
    """The layout recorded in a work queue's config; ``filters`` (the group's partitioning filters)
    give each transform its wildcard indexes back."""
    by_filter = {f.filter: f for f in filters or []}
    streams = []
    for source in stream_config.get("sources") or []:
        transforms = source.get("subject_transforms") or []
        partition = None
        picked: list[PartitioningFilter] = []
        for t in transforms:
            m = _PARTITION_DEST.match(t.get("dest", ""))
            if t.get("src") == ">" and m:
                partition = int(m.group(1))
            elif t.get("src") != ">":
                picked.append(by_filter.get(t.get("src", ""), PartitioningFilter(t.get("src", ""), None)))
        streams.append(
            SourceStream(
                source.get("name", ""),
                tuple(picked),
                partition,
                int(source.get("opt_start_seq") or 0),
                _start_time(source),
                (source.get("external") or {}).get("api") or "",
            )
        )
    return Layout(tuple(streams))


def _start_time(source: dict[str, Any]) -> str:
    value = source.get("opt_start_time") or ""
    return "" if not value or value.startswith("0001-01-01") else value


def assign_filters(
    filters: list[PartitioningFilter], stream_configs: dict[str, dict[str, Any]], *, every_stream: bool = True
) -> dict[str, list[PartitioningFilter]]:
    """Each partitioning filter to the one stream whose subjects it matches, in the streams' order.

    One stream takes every filter. With several, a filter must match subjects of exactly one of them;
    a stream without configured subjects takes the filters no other stream matches when it is the only
    such stream. With ``every_stream``, each stream must get at least one filter (or none may have any).
    """
    names = list(stream_configs)
    out: dict[str, list[PartitioningFilter]] = {n: [] for n in names}
    if len(names) == 1:
        out[names[0]] = list(filters)
        return out
    unknown = [n for n in names if not stream_configs[n].get("subjects")]
    for f in filters:
        hits = [
            n for n in names if any(subjects_intersect(f.filter, s) for s in stream_configs[n].get("subjects") or [])
        ]
        if not hits and len(unknown) == 1:
            hits = unknown
        if len(hits) != 1:
            listing = "; ".join(
                f"{n}: {', '.join(stream_configs[n].get('subjects') or ['(no subjects)'])}" for n in names
            )
            what = (
                "matches no subject of" if not hits else f"matches subjects of {' and '.join(hits)}, more than one of"
            )
            raise ConfigError(
                f"partitioning filter {f.filter} {what} the group's streams ({listing}); each filter "
                "must match subjects of exactly one stream"
            )
        out[hits[0]].append(f)
    if filters and every_stream:
        empty = [n for n in names if not out[n]]
        if empty:
            raise ConfigError(
                f"no partitioning filter matches the subjects of stream {empty[0]}: give each stream "
                "of the group at least one --filter"
            )
    return out


def resolve_start(start: Start, stream_info: dict[str, Any]) -> tuple[int, str]:
    """(opt_start_seq, opt_start_time) for a source starting at ``start``; (0, "") for the default."""
    state = stream_info.get("state") or {}
    if start.kind == "new":
        return int(state.get("last_seq", 0)) + 1, ""
    if start.kind == "seq":
        return start.seq, ""
    if start.kind == "time" and start.time is not None:
        return 0, _rfc3339(start.time)
    return 0, ""


def explicit_start(start: Start, stream_info: dict[str, Any]) -> tuple[int, str]:
    """Like :func:`resolve_start`, but ``all`` is the stream's first sequence: for a source added to an
    existing work queue (see the module docs)."""
    seq, when = resolve_start(start, stream_info)
    if not seq and not when:
        seq = max(int((stream_info.get("state") or {}).get("first_seq", 1)), 1)
    return seq, when


def by_stream(what: str, value: T | dict[str, T] | None, names: list[str]) -> dict[str, T]:
    """``value`` by stream name: one value for every stream, or a dict naming some of ``names`` (None: none)."""
    if value is None:
        return {}
    if isinstance(value, dict):
        unknown = [n for n in value if n not in names]
        if unknown:
            raise ConfigError(f"{what} given for {unknown[0]}, which is not a stream of the group ({', '.join(names)})")
        return dict(value)
    return dict.fromkeys(names, value)


def starts_by_stream(start: str | Start | dict[str, str | Start] | None, names: list[str]) -> dict[str, Start]:
    """``start`` for every stream: one value for all, or a dict by stream name (others: ``all``)."""
    given: dict[str, str | Start] = by_stream("start position", start, names)
    return {n: Start.parse(given.get(n, "all")) for n in names}


def externals_by_stream(
    domain: str | dict[str, str] | None, api: str | dict[str, str] | None, names: list[str]
) -> dict[str, str]:
    """The API prefix of the JetStream of every stream given one: from a JetStream ``domain`` or an ``api``
    prefix, each one value for every stream or a dict by stream name."""
    domains, apis = by_stream("source domain", domain, names), by_stream("source API prefix", api, names)
    return {n: prefix_of(domains.get(n), apis.get(n)) for n in names if domains.get(n) or apis.get(n)}


async def external_prefixes(given: dict[str, str], api: JetStreamApi) -> dict[str, str]:
    """``given`` without the streams in ``api``'s own JetStream (a source naming its own domain never starts)."""
    if not given:
        return {}
    own = await api.own_prefixes()
    return {n: p for n, p in given.items() if p not in own}

"""A group's dead letters for an operator: list and show them, replay and purge them, count them for ``status``.

Reads and changes the dead-letter stream in the format of ``_names`` (docs/DESIGN.md, *Dead letters and parked
keys*), with JetStream API requests only (no consumer): ``STREAM.INFO`` and ``STREAM.MSG.GET`` to read,
``STREAM.MSG.DELETE`` and ``STREAM.PURGE`` to remove, a JetStream publish to move an entry to lane ``R``.

Invariants:

1. Entries are listed in stream order, oldest first; a key's entries are its messages in their original order.
2. A plan (:func:`plan_replay`, :func:`plan_purge`) changes nothing. :func:`execute_plan` acts on the entries it
   lists and no other, but for a replay of keys (``--key``, ``--all``): the entries that followed those keys into
   lane ``D`` after the plan was made are moved too, after the planned ones, so that none is left behind them.
3. A replay moves each entry from lane ``D`` to lane ``R`` in stream order: its copy is published and
   acknowledged by the stream (with a ``Nats-Msg-Id``, so a retried publish is stored once) before the entry is
   deleted, so nothing is lost; an entry whose copy is already in lane ``R`` (a replay interrupted between the
   two) is only deleted. An instance of the partition's member (the one holding its replay lease, lane ``L``)
   finds lane ``R`` entries, runs each as a message of its key and deletes it.
4. A purge removes exactly the planned entries: a key's, or all, with one purge filtered on the key's subjects
   (or the group's) and bounded by the plan's last sequence; single entries (``--seq``) one by one.
5. A key is parked while the stream holds an entry on its subjects, so it is unparked once the last one is gone:
   at once for a purge; for a replay, when the member's instance has run the last of them.
6. A group without a dead-letter stream (made before dead letters) has no dead letters: listing, counting and
   planning it is not an error, naming one of its dead letters is (:class:`~pcgroups.errors.NotFoundError`).
7. The members' replay leases (lane ``L``) are no dead letters: nothing here lists, counts, purges or moves them.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..config import ElasticConfig, StaticConfig
from ..errors import JetStreamAPIError, NotFoundError, PCGroupsError, PermissionDeniedError
from ..jetstream._api import ERR_NO_MESSAGE_FOUND, ERR_STREAM_NOT_FOUND, JetStreamApi, parse_timestamp
from ..partitions import member_partitions
from ._entries import delete_entry, held_dead_letters, restored_headers, split_subject
from ._names import (
    DLQ_ROOT,
    HEADER_DELIVERIES,
    HEADER_KEY,
    HEADER_MEMBER,
    HEADER_ORIGIN_SEQ,
    HEADER_ORIGIN_STREAM,
    HEADER_PARKED,
    HEADER_PARTITIONED_SUBJECT,
    HEADER_REASON,
    HEADER_SUBJECT,
    HEADER_TIME,
    LANE_DEAD,
    LANE_REPLAY,
    dead_letter_stream,
    entry_subjects,
    key_of_token,
    key_token,
)

if TYPE_CHECKING:
    from nats.aio.client import Client

__all__ = [
    "DeadLetter",
    "DeadLetterPlan",
    "DeadLetterSummary",
    "MemberDeadLetters",
    "dead_letter_summary",
    "delete_dead_letter_stream",
    "execute_plan",
    "get_dead_letter",
    "list_dead_letters",
    "plan_purge",
    "plan_replay",
]

FLAVOURS = ("static", "elastic")
LANES = {LANE_DEAD: "dead", LANE_REPLAY: "replaying"}
HASHED_KEYS_SHOWN = 100  # a summary reads the names of at most this many hashed (long) keys, one request each
Config = StaticConfig | ElasticConfig


@dataclass(frozen=True)
class DeadLetter:
    """One entry of a group's dead-letter stream, its headers parsed (``_names``: the format)."""

    seq: int  # its sequence in the dead-letter stream: what ``show``, ``replay --seq`` and ``purge --seq`` name
    lane: str  # LANE_DEAD ("D"): waiting for an operator; LANE_REPLAY ("R"): a replay was asked for
    partition: int
    key: str
    subject: str  # the subject as the handler saw it (as ``consume`` prints it)
    member: str  # the member whose instance dead-lettered it
    deliveries: int  # attempts made
    reason: str  # the last failure ("" for a message that followed its parked key)
    parked: bool  # it followed its parked key without running
    origin_stream: str  # the stream the member consumed (an elastic group's work queue)
    origin_seq: int
    time: datetime | None  # when it was dead-lettered
    data: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)  # the message's own headers, as published
    dead_letter_subject: str = ""  # its subject in the dead-letter stream
    partitioned_subject: str = ""

    @property
    def lane_name(self) -> str:
        """``dead`` or ``replaying``."""
        return LANES.get(self.lane, self.lane)

    def to_dict(self, *, body: bool = False) -> dict[str, Any]:
        """JSON-ready; ``body``: with the message's headers and data (UTF-8 text as ``data``, else base64 as
        ``data_base64``)."""
        out: dict[str, Any] = {
            "seq": self.seq,
            "lane": self.lane_name,
            "subject": self.subject,
            "key": self.key,
            "partition": self.partition,
            "member": self.member,
            "deliveries": self.deliveries,
            "reason": self.reason,
            "parked": self.parked,
            "origin_stream": self.origin_stream,
            "origin_seq": self.origin_seq,
            "time": self.time.isoformat().replace("+00:00", "Z") if self.time else None,
        }
        if body:
            out["headers"] = dict(self.headers)
            try:
                out["data"] = self.data.decode("utf-8")
            except UnicodeDecodeError:
                out["data_base64"] = base64.b64encode(self.data).decode()
        return out


@dataclass
class DeadLetterPlan:
    """What a replay or a purge does (``action``), entry by entry, and, once executed, what it did."""

    action: str  # "replay" | "purge"
    flavour: str
    stream: str
    group: str
    entries: list[DeadLetter]
    owners: dict[int, str] = field(default_factory=dict)  # partition -> its member now (whose instance replays)
    chosen_keys: list[str] = field(default_factory=list)  # keys chosen (--key): all their entries
    everything: bool = False  # every entry was chosen (--all)
    executed: bool = False
    done: int = 0  # entries moved to lane R (replay) or removed (purge)
    followers: int = 0  # replay: entries that followed the chosen keys since the plan, moved after them
    already: int = 0  # replay: entries whose copy was in lane R already (an interrupted replay): only deleted

    @property
    def dead_letter_stream(self) -> str:
        return dead_letter_stream(self.flavour, self.stream, self.group)

    @property
    def keys(self) -> list[str]:
        """The keys of the entries, in order of their first entry."""
        return list(dict.fromkeys(e.key for e in self.entries))

    @property
    def by_key(self) -> bool:
        """Whole keys were chosen (``--key``, ``--all``): a replay takes what followed them too (invariant 2)."""
        return self.everything or bool(self.chosen_keys)

    def members(self) -> list[str]:
        """The members whose partitions the entries are in (their current owners), in order."""
        return list(dict.fromkeys(self.owners.get(e.partition, "") for e in self.entries if e.partition in self.owners))

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "flavour": self.flavour,
            "stream": self.stream,
            "group": self.group,
            "dead_letter_stream": self.dead_letter_stream,
            "executed": self.executed,
            "done": self.done,
            "followers": self.followers,
            "already": self.already,
            "entries": [{**e.to_dict(), "owner": self.owners.get(e.partition)} for e in self.entries],
        }


@dataclass
class MemberDeadLetters:
    """A member's dead letters: those in the partitions it owns now."""

    member: str  # "" for partitions no member owns
    dead: int = 0  # lane D
    replaying: int = 0  # lane R
    parked_keys: list[str] = field(default_factory=list)  # keys with an entry, sorted

    @property
    def total(self) -> int:
        return self.dead + self.replaying


@dataclass
class DeadLetterSummary:
    """A group's dead letters by member (:func:`dead_letter_summary`)."""

    stream: str  # the dead-letter stream
    exists: bool
    members: dict[str, MemberDeadLetters] = field(default_factory=dict)

    @property
    def dead(self) -> int:
        return sum(m.dead for m in self.members.values())

    @property
    def replaying(self) -> int:
        return sum(m.replaying for m in self.members.values())

    @property
    def total(self) -> int:
        return self.dead + self.replaying

    def of(self, member: str) -> MemberDeadLetters:
        return self.members.get(member) or MemberDeadLetters(member)


# ---------------------------------------------------------------- reading


def _check_flavour(flavour: str) -> None:
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown flavour {flavour!r}: static or elastic")


def _api(nc: Client, api: JetStreamApi | None) -> JetStreamApi:
    return api if api is not None else JetStreamApi(nc)


def owners_of(config: Config | None) -> dict[int, str]:
    """Partition -> the member that owns it now (none for a group without a config)."""
    if config is None:
        return {}
    owners: dict[int, str] = {}
    for member in config.membership():
        for p in member_partitions(
            max_members=config.max_members,
            members=config.members,
            member_mappings=config.member_mappings,
            member=member,
        ):
            owners.setdefault(p, member)
    return owners


def parse_headers(raw: bytes) -> dict[str, str]:
    """A NATS header block (``NATS/1.0\\r\\nName: value\\r\\n...``) as a dict (the first value of a repeated
    name)."""
    headers: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep and name and name.strip() not in headers:
            headers[name.strip()] = value.strip()
    return headers


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def _entry(message: dict[str, Any]) -> DeadLetter:
    """A dead letter from a ``STREAM.MSG.GET`` answer's message: where it is from its subject (lane, partition,
    key token), what it is from its headers."""
    subject = str(message.get("subject", ""))
    raw = base64.b64decode(message.get("hdrs") or "")
    stored = parse_headers(raw) if raw else {}
    tokens = subject[len(DLQ_ROOT) + 1 :].split(".") if subject.startswith(DLQ_ROOT + ".") else []
    lane, partition, token = (tokens[-3], tokens[-2], tokens[-1]) if len(tokens) >= 6 else ("", "", "")
    key = stored.get(HEADER_KEY)
    if key is None:
        key = key_of_token(token) if token else ""
        key = key if key is not None else token
    own = restored_headers(stored)
    return DeadLetter(
        seq=int(message.get("seq") or 0),
        lane=lane,
        partition=_int(partition),
        key=key,
        subject=stored.get(HEADER_SUBJECT, ""),
        member=stored.get(HEADER_MEMBER, ""),
        deliveries=_int(stored.get(HEADER_DELIVERIES)),
        reason=stored.get(HEADER_REASON, ""),
        parked=stored.get(HEADER_PARKED) == "1",
        origin_stream=stored.get(HEADER_ORIGIN_STREAM, ""),
        origin_seq=_int(stored.get(HEADER_ORIGIN_SEQ)),
        time=parse_timestamp(stored.get(HEADER_TIME)) or parse_timestamp(message.get("time")),
        data=base64.b64decode(message.get("data") or ""),
        headers=own,
        dead_letter_subject=subject,
        partitioned_subject=stored.get(HEADER_PARTITIONED_SUBJECT, ""),
    )


def _stored_headers(entry_raw: dict[str, Any]) -> dict[str, str]:
    raw = base64.b64decode(entry_raw.get("hdrs") or "")
    return parse_headers(raw) if raw else {}


async def _get(api: JetStreamApi, name: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """One message of the dead-letter stream ``name`` (``STREAM.MSG.GET``), None when there is none."""
    try:
        reply = await api.request(f"STREAM.MSG.GET.{name}", body)
    except JetStreamAPIError as e:
        if e.err_code == ERR_NO_MESSAGE_FOUND:
            return None
        if e.err_code == ERR_STREAM_NOT_FOUND:
            raise NotFoundError(f"stream {name} not found") from None
        raise
    message: dict[str, Any] = reply.get("message") or {}
    return message


async def _scan(api: JetStreamApi, name: str, subjects: str, after: int = 0) -> list[dict[str, Any]]:
    """The raw messages of ``name`` on ``subjects`` with a sequence above ``after``, in order."""
    found: list[dict[str, Any]] = []
    seq = after + 1
    while True:
        message = await _get(api, name, {"seq": seq, "next_by_subj": subjects})
        if message is None:
            return found
        found.append(message)
        seq = int(message["seq"]) + 1


def _key_subjects(flavour: str, stream: str, group: str, key: str, lane: str = "*") -> str:
    """Every subject of ``key``'s entries (any partition) in ``lane`` (``*``: both)."""
    return f"{DLQ_ROOT}.{flavour}.{stream}.{group}.{lane}.*.{key_token(key)}"


async def list_dead_letters(
    nc: Client,
    flavour: str,
    stream: str,
    group: str,
    *,
    keys: Iterable[str] = (),
    lane: str | None = None,
    api: JetStreamApi | None = None,
) -> list[DeadLetter]:
    """The group's dead letters, oldest first (invariant 1): all of them, or those of ``keys``, in ``lane``
    (:data:`~._names.LANE_DEAD`, :data:`~._names.LANE_REPLAY`; None: both). None without a dead-letter stream."""
    _check_flavour(flavour)
    api = _api(nc, api)
    name = dead_letter_stream(flavour, stream, group)
    filters = [_key_subjects(flavour, stream, group, k, lane or "*") for k in dict.fromkeys(keys)]
    if not filters:
        filters = [entry_subjects(flavour, stream, group, lane or "*")]
    try:
        raw = [m for f in filters for m in await _scan(api, name, f)]
    except NotFoundError:
        return []
    return sorted((_entry(m) for m in raw), key=lambda e: e.seq)


async def get_dead_letter(
    nc: Client, flavour: str, stream: str, group: str, seq: int, *, api: JetStreamApi | None = None
) -> DeadLetter:
    """Dead letter ``seq`` of the group (a sequence of its dead-letter stream); NotFoundError naming what is
    missing: the stream, or that entry."""
    _check_flavour(flavour)
    api = _api(nc, api)
    name = dead_letter_stream(flavour, stream, group)
    try:
        message = await _get(api, name, {"seq": seq})
    except NotFoundError:
        message = None  # no dead-letter stream: no dead letter (invariant 6)
    if message is None or split_subject(str(message.get("subject", ""))) is None:  # none, or a lease (invariant 7)
        raise NotFoundError(f"no dead letter {seq} in {flavour} consumer group {group} on stream {stream}")
    return _entry(message)


# ---------------------------------------------------------------- plans


async def _plan(
    action: str,
    nc: Client,
    flavour: str,
    stream: str,
    group: str,
    keys: Sequence[str],
    seqs: Sequence[int],
    everything: bool,
    config: Config | None,
    api: JetStreamApi | None,
    lane: str | None,
) -> DeadLetterPlan:
    _check_flavour(flavour)
    api = _api(nc, api)
    if everything and (keys or seqs):
        raise PCGroupsError("give --all, or keys and sequences, not both")
    if not (everything or keys or seqs):
        raise PCGroupsError("say which dead letters: --all, --key KEY or --seq N")
    chosen: dict[int, DeadLetter] = {}
    if everything or keys:
        for entry in await list_dead_letters(nc, flavour, stream, group, keys=keys, lane=lane, api=api):
            chosen[entry.seq] = entry
        missing = [k for k in dict.fromkeys(keys) if not any(e.key == k for e in chosen.values())]
        if missing:
            what = "dead letter to replay" if action == "replay" else "dead letter"
            raise NotFoundError(
                f"no {what} of key {missing[0]!r} in {flavour} consumer group {group} on stream {stream}"
            )
    for seq in dict.fromkeys(seqs):
        entry = await get_dead_letter(nc, flavour, stream, group, seq, api=api)
        if lane and entry.lane != lane:
            raise PCGroupsError(
                f"dead letter {seq} is being replayed already (lane {entry.lane}): its member's instance runs it"
            )
        chosen[seq] = entry
    return DeadLetterPlan(
        action,
        flavour,
        stream,
        group,
        sorted(chosen.values(), key=lambda e: e.seq),
        owners=owners_of(config),
        chosen_keys=list(dict.fromkeys(keys)),
        everything=everything,
    )


async def plan_replay(
    nc: Client,
    flavour: str,
    stream: str,
    group: str,
    *,
    keys: Sequence[str] = (),
    seqs: Sequence[int] = (),
    everything: bool = False,
    config: Config | None = None,
    api: JetStreamApi | None = None,
) -> DeadLetterPlan:
    """Which dead letters in lane ``D`` a replay moves to lane ``R``: every one (``everything``), those of
    ``keys``, and those numbered ``seqs``; oldest first. ``config``: the group's, to name each partition's member.
    Changes nothing (invariant 2); NotFoundError for a key without dead letters or a sequence that is none."""
    return await _plan("replay", nc, flavour, stream, group, keys, seqs, everything, config, api, LANE_DEAD)


async def plan_purge(
    nc: Client,
    flavour: str,
    stream: str,
    group: str,
    *,
    keys: Sequence[str] = (),
    seqs: Sequence[int] = (),
    everything: bool = False,
    config: Config | None = None,
    api: JetStreamApi | None = None,
) -> DeadLetterPlan:
    """Which dead letters a purge deletes (both lanes), as :func:`plan_replay` chooses them."""
    return await _plan("purge", nc, flavour, stream, group, keys, seqs, everything, config, api, None)


# ---------------------------------------------------------------- executing


async def execute_plan(nc: Client, plan: DeadLetterPlan, *, api: JetStreamApi | None = None) -> DeadLetterPlan:
    """Apply ``plan`` (invariants 2-5) and return it with what was done (``executed``, ``done``, ...)."""
    api = _api(nc, api)
    if plan.action == "replay":
        await _replay(nc, api, plan)
    elif plan.action == "purge":
        await _purge(api, plan)
    else:
        raise ValueError(f"unknown dead-letter plan action {plan.action!r}")
    plan.executed = True
    return plan


async def _replay(nc: Client, api: JetStreamApi, plan: DeadLetterPlan) -> None:
    name = plan.dead_letter_stream
    in_replay = {
        (e.origin_stream, e.origin_seq)
        for e in await list_dead_letters(nc, plan.flavour, plan.stream, plan.group, lane=LANE_REPLAY, api=api)
    }
    for entry in plan.entries:
        if await _move(api, name, entry.seq, in_replay, plan):
            plan.done += 1
    if plan.by_key and plan.entries:
        last = plan.entries[-1].seq
        for key in plan.keys:
            subjects = _key_subjects(plan.flavour, plan.stream, plan.group, key, LANE_DEAD)
            for message in await _scan(api, name, subjects, after=last):
                if await _move(api, name, int(message["seq"]), in_replay, plan):
                    plan.followers += 1


async def _move(api: JetStreamApi, name: str, seq: int, in_replay: set[tuple[str, int]], plan: DeadLetterPlan) -> bool:
    """Entry ``seq`` from lane D to lane R: its copy published and acknowledged, then the entry deleted
    (invariant 3). False for an entry gone meanwhile (purged), or not in lane D."""
    message = await _get(api, name, {"seq": seq})
    if message is None:
        return False
    subject = str(message["subject"])
    prefix, lane, rest = _lane_parts(subject)
    if lane != LANE_DEAD:
        return False
    headers = _stored_headers(message)
    origin = (headers.get(HEADER_ORIGIN_STREAM, ""), _int(headers.get(HEADER_ORIGIN_SEQ)))
    if origin[0] and origin in in_replay:
        plan.already += 1
    else:
        headers["Nats-Msg-Id"] = f"{name}:replay:{seq}"
        await api.publish(f"{prefix}.{LANE_REPLAY}.{rest}", base64.b64decode(message.get("data") or ""), headers)
        in_replay.add(origin)
    await delete_entry(api, name, seq)
    return True


def _lane_parts(subject: str) -> tuple[str, str, str]:
    """``$PCG.DLQ.<f>.<s>.<g>``, the lane, and ``<partition>.<key token>`` of an entry's subject."""
    head, partition, token = subject.rsplit(".", 2)
    prefix, lane = head.rsplit(".", 1)
    return prefix, lane, f"{partition}.{token}"


async def _purge(api: JetStreamApi, plan: DeadLetterPlan) -> None:
    name = plan.dead_letter_stream
    if not plan.entries:
        return
    last = plan.entries[-1].seq
    if plan.everything:
        filters = [entry_subjects(plan.flavour, plan.stream, plan.group)]
    else:
        filters = [_key_subjects(plan.flavour, plan.stream, plan.group, k) for k in plan.chosen_keys]
    for subjects in filters:  # bounded by the plan's last entry: what came after it stays (invariant 4)
        reply = await api.request(f"STREAM.PURGE.{name}", {"filter": subjects, "seq": last + 1})
        plan.done += int(reply.get("purged") or 0)
    chosen = set(plan.chosen_keys)
    for entry in plan.entries:
        if not plan.everything and entry.key not in chosen and await delete_entry(api, name, entry.seq):
            plan.done += 1


# ---------------------------------------------------------------- status


async def dead_letter_summary(
    nc: Client,
    flavour: str,
    stream: str,
    group: str,
    *,
    config: Config | None = None,
    api: JetStreamApi | None = None,
) -> DeadLetterSummary:
    """The group's dead letters counted by member (the owner of their partition now) and lane, with the parked
    keys: one ``STREAM.INFO`` with the per-subject counts, and one read per hashed (long) key named, at most
    :data:`HASHED_KEYS_SHOWN` (a user who may not read entries sees such a key's token, ``~<sha256>``)."""
    _check_flavour(flavour)
    api = _api(nc, api)
    name = dead_letter_stream(flavour, stream, group)
    summary = DeadLetterSummary(name, exists=False)
    try:
        info = await api.stream_info(name, subjects_filter=entry_subjects(flavour, stream, group))
    except NotFoundError:
        return summary
    summary.exists = True
    owners = owners_of(config)
    keys: dict[str, set[str]] = {}
    hashed: dict[str, str] = {}
    for subject, count in sorted((info.get("state") or {}).get("subjects", {}).items()):
        try:
            _, lane, rest = _lane_parts(subject)
        except ValueError:
            continue
        partition, token = rest.split(".", 1)
        member = owners.get(_int(partition), "")
        counts = summary.members.setdefault(member, MemberDeadLetters(member))
        if lane == LANE_REPLAY:
            counts.replaying += int(count)
        else:
            counts.dead += int(count)
        key = key_of_token(token)
        if key is None:
            if token not in hashed and len(hashed) < HASHED_KEYS_SHOWN:
                try:
                    message = await _get(api, name, {"last_by_subj": subject})
                except PermissionDeniedError:  # may count, not read (the observer): the key's hash it is
                    message = None
                hashed[token] = _stored_headers(message).get(HEADER_KEY, token) if message else token
            key = hashed.get(token, token)
        keys.setdefault(member, set()).add(key)
    for member, found in keys.items():
        summary.members[member].parked_keys = sorted(found)
    return summary


async def delete_dead_letter_stream(
    nc: Client,
    flavour: str,
    stream: str,
    group: str,
    *,
    only_if_empty: bool = False,
    api: JetStreamApi | None = None,
) -> tuple[bool, int]:
    """Delete the group's dead-letter stream: (deleted, the dead letters it held). ``only_if_empty``: keep one
    that holds dead letters (and say how many). No stream: (False, 0)."""
    _check_flavour(flavour)
    api = _api(nc, api)
    held = await held_dead_letters(api, flavour, stream, group)
    if held is None:
        return False, 0
    if only_if_empty and held:
        return False, held
    return await api.delete_stream(dead_letter_stream(flavour, stream, group)), held

"""Dead letters written as the documented format says (pcgroups/deadletters/_names.py, docs/DESIGN.md *Dead letters
and parked keys*), without a member instance: a group's dead-letter stream made as a group's creation makes it, and
entries published to it with their headers. The operations (ls, show, replay, purge, status) are tested on these."""

from __future__ import annotations

from datetime import UTC, datetime

from pcgroups.deadletters import (
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
    dead_letter_stream,
    dead_letter_subject,
    dead_letter_subjects,
)
from pcgroups.errors import NotFoundError
from pcgroups.jetstream import JetStreamApi, StreamConfig


async def make_dead_letter_stream(nc, flavour: str, stream: str, group: str) -> str:
    """The group's dead-letter stream (file storage, discard new, no limits), unless it exists (made with its group):
    its name."""
    api = JetStreamApi(nc)
    name = dead_letter_stream(flavour, stream, group)
    try:
        await api.stream_info(name)
        return name
    except NotFoundError:
        pass
    config = StreamConfig(
        name=name,
        subjects=[dead_letter_subjects(flavour, stream, group)],
        discard="new",
        allow_direct=True,
        duplicate_window=120_000_000_000,
    )
    await api.create_stream(config)
    return name


async def write_dead_letter(
    nc,
    flavour: str,
    stream: str,
    group: str,
    *,
    partition: int,
    key: str,
    subject: str,
    origin_seq: int,
    member: str = "m1",
    deliveries: int = 3,
    reason: str = "RuntimeError: boom",
    parked: bool = False,
    lane: str = LANE_DEAD,
    data: bytes = b"",
    headers: dict[str, str] | None = None,
    origin_stream: str | None = None,
) -> int:
    """One dead letter (the stream must exist): its sequence in the dead-letter stream."""
    api = JetStreamApi(nc)
    origin = origin_stream or (stream if flavour == "static" else f"{stream}-{group}")
    written = {
        **(headers or {}),
        HEADER_ORIGIN_STREAM: origin,
        HEADER_ORIGIN_SEQ: str(origin_seq),
        HEADER_SUBJECT: subject,
        HEADER_PARTITIONED_SUBJECT: f"{partition}.{subject}",
        HEADER_MEMBER: member,
        HEADER_KEY: key,
        HEADER_DELIVERIES: str(deliveries),
        HEADER_REASON: "" if parked else reason,
        HEADER_TIME: datetime.now(UTC).isoformat().replace("+00:00", "Z"),
    }
    if parked:
        written[HEADER_PARKED] = "1"
    ack = await api.publish(dead_letter_subject(flavour, stream, group, lane, partition, key), data, written)
    return int(ack["seq"])

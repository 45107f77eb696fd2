"""A dead letter as stored, and the reads and deletes of one: what a member instance and an operator ask of the
group's dead-letter stream (the format is ``_names``).

Invariants:

1. :func:`letter_headers` is the one place a dead letter's headers are made: the message's own headers copied
   (:func:`copied_headers`: the pin dropped, each ``Nats-*`` header kept as ``Pcg-Orig-<name>``), then the
   ``Pcg-*`` headers of ``_names``, the reason on one line of at most ``REASON_LIMIT`` bytes.
2. :func:`restored_headers` undoes :func:`copied_headers`: a replayed message reaches its handler with the headers
   it was published with (and ``Pcg-Replayed``), none of the dead letter's own.
3. The reads ask the stream's leader (``STREAM.MSG.GET``, not a direct get that a replica may answer late): a key
   parked a moment ago is seen as parked. A missing message is None, a missing stream a ``NotFoundError``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..errors import JetStreamAPIError, NotFoundError
from ..jetstream._api import ERR_NO_MESSAGE_FOUND, ERR_STREAM_NOT_FOUND, JetStreamApi
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
    HEADER_REPLAYED,
    HEADER_SUBJECT,
    HEADER_TIME,
    REASON_LIMIT,
    dead_letter_stream,
    key_of_token,
    lease_subject,
)

ORIG = "Pcg-Orig-"  # a Nats-* header of the message, kept under this prefix
PIN_HEADER = "Nats-Pin-Id"
MSG_ID = "Nats-Msg-Id"
ERR_NO_MESSAGE_DELETED = 10057  # a delete of a message that is not there (any more)
OWN = {
    h.lower()
    for h in (
        HEADER_ORIGIN_STREAM,
        HEADER_ORIGIN_SEQ,
        HEADER_SUBJECT,
        HEADER_PARTITIONED_SUBJECT,
        HEADER_MEMBER,
        HEADER_KEY,
        HEADER_DELIVERIES,
        HEADER_REASON,
        HEADER_TIME,
        HEADER_PARKED,
        HEADER_REPLAYED,
        MSG_ID,
    )
}


def copied_headers(headers: dict[str, str] | None) -> dict[str, str]:
    """A message's headers as a dead letter keeps them: the pin gone, each ``Nats-*`` header (JetStream acts on
    them: a copy with ``Nats-Stream-Source`` is refused, ``Nats-Msg-Id`` dedupes, ``Nats-Expected-*`` checks)
    renamed ``Pcg-Orig-<name>``."""
    out: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if name.lower() == PIN_HEADER.lower():
            continue
        out[f"{ORIG}{name}" if name.lower().startswith("nats-") else name] = value
    return out


def restored_headers(headers: dict[str, str] | None) -> dict[str, str]:
    """The headers a dead letter's message was published with (invariant 2)."""
    out: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if name.lower() in OWN:
            continue
        out[name[len(ORIG) :] if name.startswith(ORIG) else name] = value
    return out


def one_line(reason: str, limit: int = REASON_LIMIT) -> str:
    """``reason`` as a header value: on one line, at most ``limit`` bytes (cut on a character)."""
    flat = " ".join(reason.split())
    raw = flat.encode("utf-8", "replace")
    return flat if len(raw) <= limit else raw[: limit - 3].decode("utf-8", "ignore") + "..."


def letter_headers(
    headers: dict[str, str] | None,
    *,
    origin_stream: str,
    origin_seq: int,
    subject: str,
    partitioned_subject: str,
    member: str,
    key: str,
    deliveries: int,
    reason: str,
    parked: bool = False,
    now: datetime | None = None,
) -> dict[str, str]:
    """A dead letter's headers (invariant 1)."""
    out = copied_headers(headers)
    out.update(
        {
            HEADER_ORIGIN_STREAM: origin_stream,
            HEADER_ORIGIN_SEQ: str(origin_seq),
            HEADER_SUBJECT: subject,
            HEADER_PARTITIONED_SUBJECT: partitioned_subject,
            HEADER_MEMBER: member,
            HEADER_KEY: one_line(key),
            HEADER_DELIVERIES: str(deliveries),
            HEADER_REASON: one_line(reason),
            HEADER_TIME: rfc3339(now or datetime.now(UTC)),
        }
    )
    if parked:
        out[HEADER_PARKED] = "1"
    return out


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Entry:
    """One message of a dead-letter stream: its sequence, subject (lane, partition, key token), data and headers."""

    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    time: str = ""

    @property
    def lane(self) -> str:
        return self._tokens[0]

    @property
    def partition(self) -> int:
        token = self._tokens[1]
        return int(token) if token.isdigit() else -1

    @property
    def token(self) -> str:
        """The key's subject token (``_names.key_token``)."""
        return self._tokens[2]

    @property
    def _tokens(self) -> list[str]:
        parts = self.subject.split(".")  # $PCG.DLQ.<flavour>.<stream>.<group>.<lane>.<partition>.<token>
        return parts[5:8] if len(parts) >= 8 else ["", "", ""]

    @property
    def key(self) -> str | None:
        """The key: the token's, or the ``Pcg-Key`` header for a hashed token."""
        return key_of_token(self.token) if not self.token.startswith("~") else self.headers.get(HEADER_KEY)

    @property
    def origin_stream(self) -> str:
        return self.headers.get(HEADER_ORIGIN_STREAM, "")

    @property
    def origin_seq(self) -> int:
        value = self.headers.get(HEADER_ORIGIN_SEQ, "")
        return int(value) if value.isdigit() else 0

    @property
    def partitioned_subject(self) -> str:
        return self.headers.get(HEADER_PARTITIONED_SUBJECT, "")


def _entry(reply: dict[str, Any]) -> Entry:
    m = reply["message"]
    raw = base64.b64decode(m["hdrs"]) if m.get("hdrs") else b""
    return Entry(
        seq=int(m["seq"]),
        subject=m["subject"],
        data=base64.b64decode(m["data"]) if m.get("data") else b"",
        headers=parse_headers(raw),
        time=m.get("time", ""),
    )


def parse_headers(raw: bytes) -> dict[str, str]:
    """A ``NATS/1.0`` header block as a dict (the first value of a repeated name)."""
    out: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep and name and name not in out:
            out[name] = value.strip()
    return out


async def _get(api: JetStreamApi, stream: str, body: dict[str, Any]) -> Entry | None:
    try:
        return _entry(await api.request(f"STREAM.MSG.GET.{stream}", body))
    except JetStreamAPIError as e:
        if e.err_code == ERR_NO_MESSAGE_FOUND:
            return None
        if e.err_code == ERR_STREAM_NOT_FOUND:
            raise NotFoundError(f"stream {stream} not found") from None
        raise


async def get_entry(api: JetStreamApi, stream: str, seq: int) -> Entry | None:
    """The entry at ``seq`` (None: there is none)."""
    return await _get(api, stream, {"seq": seq})


async def next_entry(api: JetStreamApi, stream: str, subject: str, seq: int = 1) -> Entry | None:
    """The first entry at or after ``seq`` whose subject matches ``subject`` (wildcards allowed)."""
    return await _get(api, stream, {"seq": max(seq, 1), "next_by_subj": subject})


async def last_entry(api: JetStreamApi, stream: str, subject: str) -> Entry | None:
    """The last entry whose subject matches ``subject`` (wildcards allowed)."""
    return await _get(api, stream, {"last_by_subj": subject})


async def delete_entry(api: JetStreamApi, stream: str, seq: int) -> bool:
    """Delete the entry at ``seq``; False when it was not there (deleted already)."""
    try:
        await api.request(f"STREAM.MSG.DELETE.{stream}", {"seq": seq, "no_erase": True})
        return True
    except JetStreamAPIError as e:
        if e.err_code in (ERR_NO_MESSAGE_FOUND, ERR_NO_MESSAGE_DELETED):
            return False
        if e.err_code == ERR_STREAM_NOT_FOUND:
            raise NotFoundError(f"stream {stream} not found") from None
        raise


async def subject_counts(api: JetStreamApi, stream: str, subjects: str) -> dict[str, int]:
    """How many entries each subject matching ``subjects`` holds (every page; empty for a stream that is missing)."""
    try:
        info = await api.stream_info(stream, subjects_filter=subjects)
    except NotFoundError:
        return {}
    return dict(info.get("state", {}).get("subjects") or {})


async def held_dead_letters(api: JetStreamApi, flavour: str, stream: str, group: str) -> int | None:
    """How many dead letters the group's dead-letter stream holds, its members' replay leases aside (``_names``
    invariant 4); None without the stream."""
    try:
        info = await api.stream_info(
            dead_letter_stream(flavour, stream, group), subjects_filter=lease_subject(flavour, stream, group, "*")
        )
    except NotFoundError:
        return None
    state = info.get("state") or {}
    return int(state.get("messages") or 0) - sum(int(n) for n in (state.get("subjects") or {}).values())


def split_subject(subject: str) -> tuple[str, int, str] | None:
    """(lane, partition, key token) of a dead-letter subject, None for another subject."""
    parts = subject.split(".")
    if len(parts) != 8 or ".".join(parts[:2]) != DLQ_ROOT or not parts[6].isdigit():
        return None
    return parts[5], int(parts[6]), parts[7]

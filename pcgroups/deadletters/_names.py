"""The dead-letter stream's names, subjects and headers: the stored format every part reads and writes.

Invariants:

1. One stream per group: ``<stream>~<group>~<flavour>~dlq`` (:func:`dead_letter_stream`). No name a group makes
   can be it: a work queue is ``<stream>-<group>`` with a group name of letters, digits, ``-`` and ``_`` after its
   last ``-``, and this name has a ``~`` after its last ``-`` (or no ``-`` at all); a KV bucket's stream is
   ``KV_<bucket>`` with no ``~`` in the bucket; consumers have names of their own, apart from streams. Past the
   server's 255 bytes for a stream name, the name keeps its first bytes and ends ``~<hash>~<flavour>~dlq`` (the
   SHA-256 of flavour, stream and group): the same rule holds, and two groups still have two streams.
2. Its subjects are ``$PCG.DLQ.<flavour>.<stream>.<group>.<lane>.<partition>.<key token>``
   (:func:`dead_letter_subject`): lane ``D`` (dead, waiting for an operator) or ``R`` (a replay asked for), the
   message's partition, and its key as one subject token (:func:`key_token`). So a key's entries are the messages
   on its subjects, in stream order, and a partition's are found by a filter.
3. A key is parked while the stream holds an entry on its subjects (either lane).
4. Lane ``L`` is no entry: ``$PCG.DLQ.<flavour>.<stream>.<group>.L.<member>`` (:func:`lease_subject`, one token
   fewer than an entry's) holds the member's replay lease, which names the instance that runs its lane ``R``
   (``pcgroups.consume._lease``). What reads entries reads :func:`entry_subjects`, which it never matches.
5. A dead letter holds the message's data and headers as published (JetStream's own ``Nats-*`` headers kept as
   ``Pcg-Orig-<name>``: JetStream would act on them), plus the ``HEADER_*`` headers below.
"""

from __future__ import annotations

import base64
import hashlib

DLQ_ROOT = "$PCG.DLQ"
LANE_DEAD = "D"  # dead: waiting for an operator (replay or purge)
LANE_REPLAY = "R"  # a replay was asked for: the instance of the member that holds its lease runs it
LANE_LEASE = "L"  # the replay lease of a member (invariant 4): not an entry
KEY_TOKEN_LIMIT = 128  # longer keys are named by their SHA-256 (``~<hex>``)
REASON_LIMIT = 1024  # bytes of the last failure's reason kept in a dead letter
NAME_LIMIT = 255  # the server's limit for a stream name, in bytes

HEADER_ORIGIN_STREAM = "Pcg-Origin-Stream"  # the stream the member consumed (a work queue for elastic groups)
HEADER_ORIGIN_SEQ = "Pcg-Origin-Seq"  # its sequence there
HEADER_SUBJECT = "Pcg-Subject"  # the subject as the handler saw it (as ``consume`` prints it)
HEADER_PARTITIONED_SUBJECT = "Pcg-Partitioned-Subject"  # with the partition token first
HEADER_MEMBER = "Pcg-Member"
HEADER_KEY = "Pcg-Key"
HEADER_DELIVERIES = "Pcg-Deliveries"  # attempts made
HEADER_REASON = "Pcg-Reason"  # the last failure: the exception's type and message (at most REASON_LIMIT bytes)
HEADER_TIME = "Pcg-Time"  # when it was dead-lettered (RFC 3339, UTC)
HEADER_PARKED = "Pcg-Parked"  # "1": it followed its parked key without running
HEADER_REPLAYED = "Pcg-Replayed"  # on a replayed message as its handler gets it: the dead letter's sequence


def dead_letter_stream(flavour: str, stream: str, group: str) -> str:
    """The group's dead-letter stream (invariant 1)."""
    name = f"{stream}~{group}~{flavour}~dlq"
    if len(name.encode()) <= NAME_LIMIT:
        return name
    digest = hashlib.sha256(f"{flavour}\0{stream}\0{group}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
    tail = f"~{digest}~{flavour}~dlq"
    head = f"{stream}~{group}".encode()[: NAME_LIMIT - len(tail)].decode("utf-8", "ignore")
    return head + tail


def dead_letter_subjects(flavour: str, stream: str, group: str) -> str:
    """Every subject of the group's dead-letter stream (its one subject filter)."""
    return f"{DLQ_ROOT}.{flavour}.{stream}.{group}.>"


def entry_subjects(flavour: str, stream: str, group: str, lane: str = "*") -> str:
    """The subjects of the group's entries in ``lane`` (``*``: both), the leases aside (invariant 4)."""
    return f"{DLQ_ROOT}.{flavour}.{stream}.{group}.{lane}.*.*"


def lease_subject(flavour: str, stream: str, group: str, member: str) -> str:
    """Where ``member``'s replay lease is kept (invariant 4); ``*`` for every member's."""
    return f"{DLQ_ROOT}.{flavour}.{stream}.{group}.{LANE_LEASE}.{member}"


def dead_letter_subject(flavour: str, stream: str, group: str, lane: str, partition: int, key: str) -> str:
    """Where a dead letter of ``key`` in ``partition`` goes (invariant 2)."""
    return f"{DLQ_ROOT}.{flavour}.{stream}.{group}.{lane}.{partition}.{key_token(key)}"


def key_token(key: str) -> str:
    """``key`` as one subject token: base64url without padding, or ``~`` and its SHA-256 when long."""
    raw = key.encode("utf-8", "surrogatepass")
    token = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    if len(token) <= KEY_TOKEN_LIMIT:
        return token or "="  # the empty key
    return "~" + hashlib.sha256(raw).hexdigest()


def key_of_token(token: str) -> str | None:
    """The key a token names (None for a hashed one: its dead letters' ``Pcg-Key`` header says it)."""
    if token.startswith("~"):
        return None
    if token == "=":
        return ""
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("utf-8", "surrogatepass")

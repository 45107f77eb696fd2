"""Dead letters: where a message that keeps failing goes, and what an operator does with it.

Each group has one dead-letter stream (``_names``: its name, subjects and headers, the documented format;
``_stream``: the stream itself, made with the group; ``_entries``: a dead letter as stored, its reads and deletes).
A member instance writes to it (``pcgroups.consume``), an operator lists, shows, replays and purges it
(``cg static|elastic dead-letters``). docs/DESIGN.md, *Dead letters and parked keys*, is the contract.
"""

from ._entries import (
    Entry,
    copied_headers,
    delete_entry,
    get_entry,
    last_entry,
    letter_headers,
    next_entry,
    restored_headers,
    split_subject,
    subject_counts,
)
from ._names import (
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
    LANE_DEAD,
    LANE_REPLAY,
    REASON_LIMIT,
    dead_letter_stream,
    dead_letter_subject,
    dead_letter_subjects,
    key_of_token,
    key_token,
)
from ._stream import delete_stream, ensure_stream, publish, stream_config

__all__ = [
    "HEADER_DELIVERIES",
    "HEADER_KEY",
    "HEADER_MEMBER",
    "HEADER_ORIGIN_SEQ",
    "HEADER_ORIGIN_STREAM",
    "HEADER_PARKED",
    "HEADER_PARTITIONED_SUBJECT",
    "HEADER_REASON",
    "HEADER_REPLAYED",
    "HEADER_SUBJECT",
    "HEADER_TIME",
    "LANE_DEAD",
    "LANE_REPLAY",
    "REASON_LIMIT",
    "Entry",
    "copied_headers",
    "dead_letter_stream",
    "dead_letter_subject",
    "dead_letter_subjects",
    "delete_entry",
    "delete_stream",
    "ensure_stream",
    "get_entry",
    "key_of_token",
    "key_token",
    "last_entry",
    "letter_headers",
    "next_entry",
    "publish",
    "restored_headers",
    "split_subject",
    "stream_config",
    "subject_counts",
]

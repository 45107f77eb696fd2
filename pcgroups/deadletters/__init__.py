"""Dead letters: where a message that keeps failing goes, and what an operator does with it.

Each group has one dead-letter stream (``_names``: its name, subjects and headers, the documented format).
A member instance writes to it (``pcgroups.consume``), an operator lists, shows, replays and purges it
(``cg static|elastic dead-letters``). docs/DESIGN.md, *Dead letters and parked keys*, is the contract.
"""

from ._names import (
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
    REASON_LIMIT,
    dead_letter_stream,
    dead_letter_subject,
    dead_letter_subjects,
    key_of_token,
    key_token,
)

__all__ = [
    "HEADER_DELIVERIES",
    "HEADER_KEY",
    "HEADER_MEMBER",
    "HEADER_ORIGIN_SEQ",
    "HEADER_ORIGIN_STREAM",
    "HEADER_PARKED",
    "HEADER_PARTITIONED_SUBJECT",
    "HEADER_REASON",
    "HEADER_SUBJECT",
    "HEADER_TIME",
    "LANE_DEAD",
    "LANE_REPLAY",
    "REASON_LIMIT",
    "dead_letter_stream",
    "dead_letter_subject",
    "dead_letter_subjects",
    "key_of_token",
    "key_token",
]

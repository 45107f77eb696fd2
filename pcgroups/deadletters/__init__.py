"""Dead letters: where a message that keeps failing goes, and what an operator does with it.

Each group has one dead-letter stream (``_names``: its name, subjects and headers, the documented format).
A member instance writes to it (``pcgroups.consume``), an operator lists, shows, replays and purges it
(``_admin``; ``cg static|elastic dead-letters``), and ``status`` and the exporter count it per member.
docs/DESIGN.md, *Dead letters and parked keys*, is the contract.
"""

from ._admin import (
    DeadLetter,
    DeadLetterPlan,
    DeadLetterSummary,
    MemberDeadLetters,
    dead_letter_summary,
    delete_dead_letter_stream,
    execute_plan,
    get_dead_letter,
    list_dead_letters,
    plan_purge,
    plan_replay,
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
    "DeadLetter",
    "DeadLetterPlan",
    "DeadLetterSummary",
    "MemberDeadLetters",
    "dead_letter_stream",
    "dead_letter_subject",
    "dead_letter_subjects",
    "dead_letter_summary",
    "delete_dead_letter_stream",
    "execute_plan",
    "get_dead_letter",
    "key_of_token",
    "key_token",
    "list_dead_letters",
    "plan_purge",
    "plan_replay",
]

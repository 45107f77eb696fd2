"""What a message's key is: the unit of order under key-level concurrency (at most one message of a key is
handled at a time, in stream order). The default is the subject without its partition token; elastic
instances default to their partitioning filters' wildcard tokens."""

from __future__ import annotations

from collections.abc import Callable

from ..partitions import tokens_match
from ._msg import Msg

KeyFunc = Callable[[Msg], str]


def key_by_subject(msg: Msg) -> str:
    """The default key: the subject with the partition token stripped."""
    return msg.subject


def key_by_tokens(indexes: list[int]) -> KeyFunc:
    """Key by subject tokens (1-based, of the stripped subject), joined with '.'."""

    def key(msg: Msg) -> str:
        tokens = msg.subject.split(".")
        return ".".join(tokens[i - 1] for i in indexes if 0 < i <= len(tokens))

    return key


def key_by_header(name: str) -> KeyFunc:
    """Key by a header's value (messages without it share the empty key)."""

    def key(msg: Msg) -> str:
        return (msg.headers or {}).get(name, "")

    return key


def key_by_partitioning(filters: list[tuple[str, list[int] | None]]) -> KeyFunc:
    """Key by the tokens an elastic group partitions on: the first matching filter's wildcard
    tokens (the whole subject when it has no indexes, or no filter matches)."""
    parsed = [(f.split("."), [i for i, t in enumerate(f.split(".")) if t == "*"], idx) for f, idx in filters]

    def key(msg: Msg) -> str:
        tokens = msg.subject.split(".")
        for ftoks, stars, idx in parsed:
            if tokens_match(ftoks, tokens):
                return ".".join(tokens[stars[k - 1]] for k in idx) if idx else msg.subject
        return msg.subject

    return key

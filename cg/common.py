"""What the ``cg`` commands share besides their runtime (cg/runtime.py) and errors (cg/errors.py):
the version, argument checks that need no server, and logging.

Nothing here imports Typer, nats-py or rich; the library (``pcgroups``) only inside the checks that
use it, so building the command tree, ``cg --help`` and ``cg --fisk-introspect`` stay fast.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from . import VERSION  # noqa: F401 - re-exported; it lives in cg/__init__.py (cg --version imports only that)
from .errors import CLIError, debugging

if TYPE_CHECKING:
    from pcgroups.config import ElasticConfig, MemberMapping, PartitioningFilter, StaticConfig
    from pcgroups.consume import KeyFunc
    from pcgroups.elastic import Start

APP_HELP = "Partitioned Consumer Group CLI tool"


# ---------------------------------------------------------------- argument checks (no network)


def check_names(*, stream: str | None = None, group: str | None = None, members: Iterable[str] = ()) -> None:
    """Validate names before connecting (the library's rules and messages)."""
    from pcgroups.config import validate_name

    if stream is not None:
        validate_name("stream", stream)
    if group is not None:
        validate_name("group", group)
    for m in members:
        validate_name("member", m)


async def group_exists(config: Awaitable[object]) -> bool:
    """Whether the group whose config ``config`` reads exists (one whose stored config is broken does)."""
    from pcgroups.errors import ConfigError, NotFoundError

    try:
        await config
    except NotFoundError:
        return False
    except ConfigError:
        return True
    return True


def parse_mappings(texts: Iterable[str]) -> list[MemberMapping]:
    """``member:p1,p2,...`` arguments; the first bad one is an error naming it."""
    from pcgroups.config import parse_mapping

    mappings = [parse_mapping(t) for t in texts]
    if not mappings:
        raise CLIError("no valid member mappings provided")
    return mappings


def parse_duration_option(flag: str, text: str, *, minimum: float = 0.0, positive: bool = False) -> float:
    """A duration option's value: a Go duration (``20ms``, ``1.5s``), at least ``minimum`` seconds
    (``positive``: more than zero)."""
    from pcgroups.connect import parse_duration
    from pcgroups.errors import PCGroupsError

    try:
        seconds = parse_duration(text)
    except PCGroupsError as e:
        raise CLIError(f"invalid {flag}: {e}") from None
    if positive and seconds <= 0:
        raise CLIError(f"invalid {flag} {text!r}: must be positive")
    if seconds < minimum:
        allowed = "must not be negative" if minimum == 0 else f"must be at least {minimum:g}s"
        raise CLIError(f"invalid {flag} {text!r}: {allowed}")
    return seconds


def given(ctx: Any, name: str) -> bool:
    """Whether the command's parameter ``name`` was given (on the command line or by its environment
    variable), not left at its default."""
    from typer._click.core import ParameterSource

    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def parse_sleep(text: str) -> float:
    """A ``--sleep`` value: a Go duration, not negative."""
    return parse_duration_option("--sleep", text)


def check_config(kind: str, cfg: StaticConfig | ElasticConfig) -> None:
    """The reference's validation of a ``kind`` (static, elastic) group's config, before connecting."""
    from pcgroups.config import validate_partition_count
    from pcgroups.errors import ConfigError

    try:
        validate_partition_count(cfg.max_members)
        cfg.validate()
    except ConfigError as e:
        raise ConfigError(f"invalid {kind} consumer group config: {e}") from None


_WILDCARD_SPLIT = re.compile(r"[,\s]+")


def star_count(filter: str) -> int:
    return sum(1 for token in filter.split(".") if token == "*")


def parse_wildcards(text: str | None, filter: str) -> list[int]:
    """Partitioning wildcard indexes for ``filter`` (``"1,2"`` or ``"1 2"``).

    None (no ``--wildcards`` for this filter) means every ``*`` token of the filter, in order.
    An empty string is an explicit empty list: the whole subject is hashed.
    """
    if text is None:
        return list(range(1, star_count(filter) + 1))
    parts = [p for p in _WILDCARD_SPLIT.split(text.strip()) if p]
    out: list[int] = []
    for p in parts:
        if not re.fullmatch(r"[+-]?\d+", p):
            raise CLIError(
                f"can't parse partition {p}: wildcard indexes are integers (for example 1,2) (filter {filter})"
            )
        out.append(int(p))
    return out


def partitioning_filters(filters: list[str], wildcards: list[str]) -> list[PartitioningFilter]:
    """``--filter`` values paired in order with ``--wildcards`` values."""
    if len(wildcards) > len(filters):
        raise CLIError(
            f"{len(wildcards)} --wildcards given for {len(filters)} --filter: "
            "each --wildcards pairs with one --filter, in order"
        )
    from pcgroups.config import PartitioningFilter

    out = []
    for i, f in enumerate(filters):
        if not f:
            raise CLIError("a --filter can't be empty")
        out.append(PartitioningFilter(f, parse_wildcards(wildcards[i] if i < len(wildcards) else None, f)))
    return out


def split_list(values: Iterable[str]) -> list[str]:
    """Repeated option values, each of which may also be a comma-separated list (empty items dropped)."""
    return [item.strip() for v in values for item in v.split(",") if item.strip()]


def parse_by_stream(
    option: str, texts: list[str], streams: list[str], check: Callable[[str], object]
) -> dict[str, str]:
    """``OPTION VALUE`` (every stream) and ``OPTION STREAM=VALUE`` (one stream), each value checked by ``check``
    (a ConfigError is this option's error): the value of each stream given one."""
    from pcgroups.errors import ConfigError

    default: str | None = None
    by_stream: dict[str, str] = {}
    for text in texts:
        name, eq, value = text.partition("=")
        if not eq:
            name, value = "", text
        try:
            check(value)
        except ConfigError as e:
            raise CLIError(f"{option} {text}: {e}") from None
        if not name:
            default = value
        elif name not in streams:
            raise CLIError(f"{option} {text}: {name} is not one of the group's streams ({', '.join(streams)})")
        else:
            by_stream[name] = value
    return by_stream if default is None else {n: by_stream.get(n, default) for n in streams}


def parse_starts(texts: list[str], streams: list[str]) -> dict[str, str | Start] | None:
    """``--start SPEC`` (every stream) and ``--start STREAM=SPEC`` (one stream) as a start per stream."""
    if not texts:
        return None
    from pcgroups.elastic import Start

    given = parse_by_stream("--start", texts, streams, Start.parse)
    starts: dict[str, str | Start] = {n: given.get(n, "all") for n in streams}
    return starts


def parse_source_apis(
    domains: list[str], apis: list[str], streams: list[str]
) -> tuple[dict[str, str] | None, dict[str, str] | None]:
    """``--source-domain [STREAM=]DOMAIN`` and ``--source-api [STREAM=]PREFIX``: the JetStream each stream is in
    when it is not the group's, as ``(source_domain, source_api)`` for the library."""
    from pcgroups.jetstream import prefix_of

    by_domain = parse_by_stream("--source-domain", domains, streams, prefix_of)
    by_api = parse_by_stream("--source-api", apis, streams, lambda p: prefix_of(None, p))
    both = [n for n in streams if n in by_domain and n in by_api]
    if both:
        raise CLIError(f"--source-domain and --source-api both say where stream {both[0]} is: give one of them")
    return by_domain or None, by_api or None


class ConsumeConcurrency(NamedTuple):
    """``consume``'s ``--concurrency K``, ``--key-header H`` / ``--key-tokens 1,2`` and ``--max-ack-pending N``.

    ``handlers`` 1 is the reference's strict path (one message at a time, ``max_ack_pending`` 1); more
    runs up to that many handlers at once, one message per key at a time (pcgroups/scheduler.py). No key
    option keeps the library's default key: the partitioning wildcard tokens (elastic), the subject
    with the partition token stripped (static). A named tuple: ``cg --version`` imports this module, and
    a dataclass would cost it the import of ``dataclasses`` (and ``inspect``)."""

    handlers: int = 1
    max_ack_pending: int = 1
    key_header: str | None = None
    key_tokens: tuple[int, ...] = ()

    def key(self) -> KeyFunc | None:
        """The key function for the library (None: its default)."""
        from pcgroups.consume import key_by_header, key_by_tokens

        if self.key_header is not None:
            return key_by_header(self.key_header)
        if self.key_tokens:
            return key_by_tokens(list(self.key_tokens))
        return None


class Failures(NamedTuple):
    """``consume``'s ``--fail PATTERN`` (the simulated handler raises on a message whose subject, as printed, matches
    one), ``--max-deliver N`` and ``--park-keys``: what fails, and how the dispatching member handles it."""

    patterns: tuple[str, ...] = ()
    max_deliver: int | None = None
    park_keys: bool = False

    def policy(self, base: Any = None, on_dead_letter: Callable[..., None] | None = None) -> Any:
        """The library's ``RetryPolicy``: ``base`` (the metrics' one, or the library's default) with these options,
        and ``on_dead_letter`` told too; None when nothing differs from the library's default."""
        if base is None and self.max_deliver is None and not self.park_keys and on_dead_letter is None:
            return None
        import dataclasses

        from pcgroups.consume import RetryPolicy

        policy = base if base is not None else RetryPolicy()
        changes: dict[str, Any] = {"park_keys": self.park_keys or policy.park_keys}
        if self.max_deliver is not None:
            changes["max_deliver"] = self.max_deliver
        if on_dead_letter is not None:
            told = policy.on_dead_letter

            def both(msg: Any, reason: str) -> None:
                on_dead_letter(msg, reason)
                if told is not None:
                    told(msg, reason)

            changes["on_dead_letter"] = both
        return dataclasses.replace(policy, **changes)


#: A NATS subject pattern: tokens of anything but whitespace and ``.``; ``*`` and ``>`` whole tokens, ``>`` last.
_TOKEN = re.compile(r"[^\s.]+")


def parse_fail(texts: Iterable[str]) -> tuple[str, ...]:
    """``--fail PATTERN`` values: NATS subject patterns (``orders.7``, ``orders.*``, ``>``)."""
    patterns = []
    for text in texts:
        tokens = text.split(".")
        wild = [t for t in tokens if ("*" in t or ">" in t) and t not in ("*", ">")]
        if not text or not all(_TOKEN.fullmatch(t) for t in tokens) or wild or ">" in tokens[:-1]:
            raise CLIError(
                f"invalid --fail {text!r}: give a NATS subject pattern, tokens separated by '.', '*' for one "
                "token, '>' for the rest (e.g. orders.7, orders.*, >)"
            )
        patterns.append(text)
    return tuple(patterns)


def fails(patterns: tuple[str, ...], subject: str) -> str | None:
    """The first of ``patterns`` that ``subject`` matches, or None."""
    from pcgroups.partitions import tokens_match

    tokens = subject.split(".")
    return next((p for p in patterns if tokens_match(p.split("."), tokens)), None)


def parse_failures(fail: list[str], max_deliver: int | None, park_keys: bool, dispatch: bool, worker: str) -> Failures:
    """Check ``consume``'s failure options (before connecting)."""
    if fail and dispatch:
        raise CLIError(
            f"--fail needs a handler: with --dispatch the workers run it ({worker} STREAM GROUP --fail PATTERN)"
        )
    if max_deliver is not None and max_deliver < 0:
        raise CLIError(
            f"invalid --max-deliver {max_deliver}: give the attempts before a failing message is dead-lettered "
            "(1 or more), or 0 to retry for ever"
        )
    return Failures(parse_fail(fail), max_deliver, park_keys)


class ConsumeRequest(NamedTuple):
    """What ``cg static|elastic consume`` was asked, checked, as one value (cg/flavour.py's ``join`` makes it,
    cg/consume.py's ``consume`` runs it). ``keyed``: the concurrency options; ``dispatch``: the group's workers
    run the handler; ``auto``, ``lease_ttl``, ``create``: elastic automatic membership; ``metrics_listen``:
    serve metrics and probes there; ``otel``: export spans; ``failures``: ``--fail``, ``--max-deliver``,
    ``--park-keys``."""

    kind: str
    stream: str
    group: str
    member: str
    sleep: float
    keyed: ConsumeConcurrency = ConsumeConcurrency()
    dispatch: bool = False
    auto: bool = False
    lease_ttl: float = 5.0
    create: Any = None
    metrics_listen: str | None = None
    otel: bool = False
    failures: Failures = Failures()


#: ``consume``'s caps (README, *Key-level concurrency from the CLI*): handlers at once, and the consumer's window.
#: A static member's consumer keeps the window it was made with, so a slip of the finger would stay.
MAX_CONCURRENCY = 1000
MAX_WINDOW = 100_000
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP/NATS header name (an RFC 7230 token)


def parse_concurrency(
    concurrency: int, key_header: str | None, key_tokens: str | None, max_ack_pending: int | None
) -> ConsumeConcurrency:
    """Check and combine ``consume``'s concurrency options (before connecting)."""
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise CLIError(
            f"invalid --concurrency {concurrency}: must be between 1 and {MAX_CONCURRENCY} (1 handles one "
            "message at a time)"
        )
    if key_header is not None and key_tokens is not None:
        raise CLIError("--key-header and --key-tokens can't be combined: key messages by a header or by subject tokens")
    given = "--key-header" if key_header is not None else "--key-tokens" if key_tokens is not None else None
    if given and concurrency == 1:
        raise CLIError(
            f"{given} needs --concurrency greater than 1 (with one handler every message waits for the "
            "one before it anyway)"
        )
    if key_header is not None and not _HEADER_NAME.fullmatch(key_header):
        raise CLIError(
            f"invalid --key-header {key_header!r}: give a header name (letters, digits, '-', no spaces or ':')"
        )
    tokens = _key_tokens(key_tokens) if key_tokens is not None else ()
    if max_ack_pending is None:
        from pcgroups.consume import FAIR_WINDOW  # the library's keyed window: fair by default

        max_ack_pending = 1 if concurrency == 1 else max(FAIR_WINDOW, concurrency)
    elif not 1 <= max_ack_pending <= MAX_WINDOW:
        raise CLIError(f"invalid --max-ack-pending {max_ack_pending}: must be between 1 and {MAX_WINDOW}")
    elif max_ack_pending < concurrency:
        many = f"{max_ack_pending} message{'' if max_ack_pending == 1 else 's'}"
        raise CLIError(
            f"--max-ack-pending {max_ack_pending} is less than --concurrency {concurrency}: at most {many} "
            f"would be handled at once; give --max-ack-pending {concurrency} or more"
        )
    return ConsumeConcurrency(concurrency, max_ack_pending, key_header, tokens)


def parse_dispatch(
    concurrency: int | None, key_header: str | None, key_tokens: str | None, max_ack_pending: int | None
) -> ConsumeConcurrency:
    """``consume --dispatch``'s options: ``--concurrency K`` caps the messages at the workers at once
    (``handlers``; 0 when not given: the workers' capacities); the key options need no ``--concurrency``."""
    if concurrency is not None and not 1 <= concurrency <= MAX_CONCURRENCY:
        raise CLIError(
            f"invalid --concurrency {concurrency}: must be between 1 and {MAX_CONCURRENCY} (with --dispatch: "
            "the most messages at the workers at once)"
        )
    keyed = parse_concurrency(max(concurrency or 2, 2), key_header, key_tokens, max_ack_pending)
    return keyed._replace(handlers=concurrency or 0)


def _key_tokens(text: str) -> tuple[int, ...]:
    """``--key-tokens 1,2``: subject token positions counted from 1 (of the subject the handler sees)."""
    parts = [p.strip() for p in text.split(",")]
    if not all(re.fullmatch(r"[0-9]+", p) and int(p) >= 1 for p in parts):
        raise CLIError(
            f"invalid --key-tokens {text!r}: give subject token positions counted from 1, comma-separated (e.g. 1,2)"
        )
    return tuple(int(p) for p in parts)


def key_tokens_beyond(positions: tuple[int, ...], subjects: list[str]) -> str | None:
    """The warning for ``--key-tokens`` positions past every subject the handler can get (``subjects``: the
    group's filters, or its streams' subjects; the key leaves a missing token out), or None: no such
    position, or nothing to tell by (no subject, or a ``>``)."""
    if not positions or not subjects or any(">" in f.split(".") for f in subjects):
        return None
    longest = max(len(f.split(".")) for f in subjects)
    beyond = [p for p in positions if p > longest]
    if not beyond:
        return None
    shown = ", ".join(subjects)
    return (
        f"--key-tokens {','.join(map(str, beyond))}: the group's subjects ({shown}) have at most {longest} "
        f"token{'' if longest == 1 else 's'}, so the key has nothing from "
        f"{'that position' if len(beyond) == 1 else 'those positions'}"
    )


# ---------------------------------------------------------------- logging


class _LogFormatter(logging.Formatter):
    """The library's lines as cg's own notes: ``cg: warning: message`` (``cg: error: ...`` for errors);
    with ``CG_DEBUG`` every level, a Go-like timestamp (``2006/01/02 15:04:05``) and tracebacks."""

    def __init__(self, debug: bool):
        super().__init__(
            "%(asctime)s %(message)s" if debug else "cg: %(levelname)s: %(message)s", datefmt="%Y/%m/%d %H:%M:%S"
        )
        self.debug = debug

    def format(self, record: logging.LogRecord) -> str:
        if not self.debug:
            exc = record.exc_info[1] if record.exc_info else None
            record = logging.makeLogRecord(record.__dict__)
            record.msg = f"{record.getMessage()}: {exc}" if exc else record.getMessage()
            record.args = None
            record.exc_info = None
            record.exc_text = None
            record.levelname = "error" if record.levelno >= logging.ERROR else record.levelname.lower()
        return super().format(record)


def setup_logging() -> None:
    """Library warnings on stderr as ``cg: warning: ...``; ``CG_DEBUG=1`` shows debug, timestamps and
    tracebacks."""
    debug = debugging()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LogFormatter(debug))
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_cg", False):
            root.removeHandler(h)
    handler._cg = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.WARNING)

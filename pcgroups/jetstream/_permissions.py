"""Permission violations reported at once, naming the subject and the missing permission.

A NATS server refuses a publish or a subscription the user's permissions do not allow by sending
``-ERR 'Permissions Violation for Publish to "<subject>"'`` (or ``for Subscription to``). nats-py
hands that only to the connection's error callback: the request that caused it waits for its
timeout, and a refused pull or ack is never answered at all. One :class:`PermissionWatch` per
connection takes those reports:

- :meth:`PermissionWatch.call` runs one request (or a nats-py call made of requests) and fails it
  with a :class:`PermissionDeniedError` as soon as a violation for one of its subjects arrives, or
  for the inbox its replies come to (a refused ``_INBOX`` subscription makes every later request on
  the connection fail at once too: nats-py subscribes its reply inbox only once);
- :meth:`PermissionWatch.listen` lets a running consumer instance (or a worker of a pool) end with the
  error on any other violation of a JetStream, KV, pool (``$PCG.``) or inbox subject of its connection: its
  pulls, acks, watches and pool subscriptions have no request to fail. A refused publish that a guarded call claimed is that call's error only; a
  refused inbox subscription is everyone's.

nats-py lower-cases the error text, subject included; the error names the subject as the caller
wrote it when it matches one of the subjects (or patterns) guarded, otherwise with its well-known
prefix (``$JS.API.``, ``$JS.<domain>.API.``, ``$KV.``, ``_INBOX.``) in capitals.

The watch attaches itself to a client by wrapping the client's error callback (``_compat``: nats-py
keeps no list of listeners); the callback it wraps still gets every error. A client has one watch, its
``Connection``'s.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterable, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import PermissionDeniedError
from ..partitions import tokens_match
from ._compat import wrap_error_callback

if TYPE_CHECKING:
    from nats.aio.client import Client

__all__ = ["PermissionWatch", "Violation", "kv_subjects"]

T = TypeVar("T")

_VIOLATION = re.compile(
    r'permissions violation for (publish|subscription) (?:to|with reply of) "([^"]*)"', re.IGNORECASE
)
# Prefixes written in capitals when a violation's subject is not one the caller guarded.
_PREFIXES = ("$JS.API.", "$JS.ACK.", "$JS.FC.", "$JS.EVENT.", "$KV.", "_INBOX.")
_DOMAIN_API = re.compile(r"\$js\.([^.]+)\.api\.")
# A running instance ends on violations of these subjects (and of its inbox), not on its user's own subjects.
_RELEVANT = ("$js.", "$kv.", "$pcg.")


@dataclass(frozen=True)
class Violation:
    """One refused operation: ``operation`` is ``publish`` or ``subscribe``; ``subject`` as reported
    (lower-cased by nats-py)."""

    operation: str
    subject: str

    @classmethod
    def parse(cls, error: BaseException | str) -> Violation | None:
        m = _VIOLATION.search(str(error))
        if m is None:
            return None
        return cls("publish" if m.group(1).lower() == "publish" else "subscribe", m.group(2).lower())

    def error(self, candidates: Iterable[str] = ()) -> PermissionDeniedError:
        """The error, naming the subject by the first matching candidate (the caller's spelling)."""
        subject = next((c for c in candidates if _matches(c, self.subject)), None) or _capitalised(self.subject)
        hint = "; replies come to the inbox: allow _INBOX.> or the inbox prefix" if subject.startswith("_INBOX") else ""
        return PermissionDeniedError(
            f"permission denied: {self.operation} to {subject} is not allowed for this user "
            f"(missing {self.operation} permission{hint})",
            operation=self.operation,
            subject=subject,
        )


def _matches(pattern: str, subject: str) -> bool:
    """``subject`` (lower-cased, as reported) matches ``pattern``, ignoring case. A ``*`` or ``>`` token of the
    subject itself (a refused subscription) matches only itself or a wildcard."""
    return tokens_match(pattern.lower().split("."), subject.split("."))


def _capitalised(subject: str) -> str:
    for prefix in _PREFIXES:
        if subject.startswith(prefix.lower()):
            return prefix + subject[len(prefix) :]
    m = _DOMAIN_API.match(subject)
    if m:  # $js.<domain>.api.: the domain as reported (its case is lost)
        return f"$JS.{m.group(1)}.API." + _capitalised(subject[m.end() :])
    return subject


def kv_subjects(bucket: str, key: str = ">", prefix: str = "$JS.API") -> list[str]:
    """The subjects nats-py's KV calls on ``bucket`` (and ``key``) send to through the JetStream API ``prefix``:
    the key itself (its writes, under a domain's or account's prefix: ``<prefix>.$KV.<bucket>.<key>``), the
    bucket's stream API, direct gets, its consumers (watches) and flow control."""
    stream, key_subject = f"KV_{bucket}", f"$KV.{bucket}.{key}"
    writes = [key_subject] if prefix == "$JS.API" else [f"{prefix}.{key_subject}", key_subject]
    return [
        *writes,
        f"{prefix}.DIRECT.GET.{stream}.{key_subject}",
        f"{prefix}.STREAM.INFO.{stream}",
        f"{prefix}.CONSUMER.CREATE.{stream}",
        f"{prefix}.STREAM.MSG.GET.{stream}",
        f"{prefix}.*.*.{stream}",
        f"{prefix}.*.*.{stream}.>",
        f"$JS.FC.{stream}.>",
        f"{prefix}.INFO",
    ]


@dataclass(eq=False)
class _Guard:
    subjects: Sequence[str]
    replies: bool
    failed: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def claims(self, v: Violation, inbox: str) -> bool:
        if v.operation == "subscribe":
            return self.replies and v.subject.startswith(inbox)
        return any(_matches(s, v.subject) for s in self.subjects)


class PermissionWatch:
    """The permission violations of one connection (see the module doc): its ``Connection``'s
    (``Connection.of(nc).permissions``)."""

    def __init__(self, nc: Client):
        wrap_error_callback(nc, self._on_error)
        self._inbox = nc.new_inbox().rsplit(".", 1)[0].lower() + "."
        self._guards: list[_Guard] = []
        self._listeners: list[Callable[[Violation], None]] = []
        self.inbox_denied: Violation | None = None  # the reply inbox subscription was refused

    async def _on_error(self, error: Exception) -> None:
        v = Violation.parse(error)
        if v is not None:
            self.report(v)

    def report(self, v: Violation) -> None:
        """Fail the guarded calls it concerns; tell the listeners when none did (always for a subscription)."""
        if v.operation == "subscribe" and v.subject.startswith(self._inbox):
            self.inbox_denied = v
        claimed = False
        for g in self._guards:
            if g.claims(v, self._inbox):
                claimed = True
                if not g.failed.done():
                    g.failed.set_result(v)
        # a refused inbox subscription concerns every user of the connection, claimed or not
        if (not claimed or v.operation == "subscribe") and (
            v.subject.startswith(_RELEVANT) or v.subject.startswith(self._inbox)
        ):
            for listener in list(self._listeners):
                listener(v)

    def listen(self, callback: Callable[[Violation], None]) -> Callable[[], None]:
        """Call ``callback`` on every JetStream, KV, pool or inbox violation no guarded call claimed (at once if the
        reply inbox was refused already); returns the function that stops it."""
        self._listeners.append(callback)
        if self.inbox_denied is not None:
            callback(self.inbox_denied)
        return lambda: self._listeners.remove(callback) if callback in self._listeners else None

    async def call(self, aw: Awaitable[T], subjects: Iterable[str], *, replies: bool = True) -> T:
        """Await ``aw``; a violation for one of ``subjects`` (patterns allowed), or of the reply inbox when
        ``replies``, raises :class:`PermissionDeniedError` at once instead. A mutable sequence of subjects (a
        list, a deque) is kept as given: the caller may change it while ``aw`` runs (a sink keeping the
        subjects it published last)."""
        guard = _Guard(subjects if isinstance(subjects, MutableSequence) else tuple(subjects), replies)
        if replies and self.inbox_denied is not None:
            if asyncio.iscoroutine(aw):
                aw.close()
            raise self.inbox_denied.error()
        task = asyncio.ensure_future(aw)
        self._guards.append(guard)
        try:
            await asyncio.wait({task, guard.failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._guards.remove(guard)
            if not task.done():
                task.cancel()
        answered = task.done() and not task.cancelled() and task.exception() is None
        if guard.failed.done() and not answered:
            raise guard.failed.result().error(guard.subjects)
        return await task

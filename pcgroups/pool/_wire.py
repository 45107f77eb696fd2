"""The wire contract between a dispatching member and its workers (docs/DESIGN.md, *The worker pool*).

A member instance started with ``dispatch=True`` runs no handler: while it holds the member's pin it hands
each message to a **worker**, a process that enrolled with the group (:mod:`pcgroups.pool._dispatcher` is the
dispatcher's side, :mod:`pcgroups.pool._worker` the worker's). Everything here is plain NATS core messaging
under one prefix per group, ``$PCG.POOL.<flavour>.<stream>.<group>`` (``P`` below); bodies are JSON
objects with ``"v": 1``:

====================================  ==============================  =========================================
subject                               who publishes                   what
====================================  ==============================  =========================================
``P.HB``                              each worker, every              ``{"v","name","id","capacity","busy",
                                      :data:`HEARTBEAT`, and at once  "stopping","held":{dispatcher: [seq]}}``,
                                      on ``P.HELLO``                  reply subject ``P.W.<name>.<id>.hb``
``P.W.<name>.<id>.hb``                every dispatching instance       ``{"v","d","member","upto","held":[seq]}``:
                                      (pinned or standby), in reply   what it believes the worker holds for it,
                                      to a heartbeat                  among its offers numbered up to ``upto``
``P.HELLO``                           a dispatching instance that     ``{"v","d","member"}``: workers answer
                                      gains the pin                   with a heartbeat at once
``P.LEAVE``                           a worker that stops, once its   ``{"v","name","id"}``
                                      calls ended
``P.W.<name>.<id>.work``              the dispatching instance        an **offer**: the message's headers and
                                                                      body, plus the ``Pcg-*`` headers below,
                                                                      reply subject ``P.D.<d>.R.<token>``
                                                                      (``<n>-<16 hex>``: numbered, not to be
                                                                      guessed by another worker)
``P.D.<d>.R.<token>``                 the worker, when the call       ``{"v","outcome","delay","reason"}`` or
                                      ended, or at once when busy     ``{"v","outcome":"busy"}``
``P.STATUS``, ``$PCG.POOL.STATUS``    ``cg status``, ``cg metrics``   a request (one group, every group); each
                                                                      dispatching instance answers with its
                                                                      pool (``dispatch.Roster.status``)
====================================  ==============================  =========================================

An offer carries ``Pcg-Ack`` (the JetStream ack subject), ``Pcg-Partitioned-Subject`` (the message's subject,
partition token first), ``Pcg-Pin`` (the dispatcher's pin id) and ``Pcg-Dispatcher`` (``d``, the dispatching instance's
id) next to the message's own headers. The worker acks, naks-in-place and sends ``+WPI`` itself on
``Pcg-Ack``: ``+ACK`` and ``+TERM`` go to JetStream, and the outcome to the dispatcher; a failed call
(``retry``) goes only to the dispatcher, which retries it in place (the key waits) and dead-letters it after
``RetryPolicy.max_deliver``. Outcomes: ``ack``, ``term``, ``retry`` (with ``delay`` and ``reason``), ``none``
(the handler left it unsettled: redelivered after AckWait), ``dropped`` (not handled: the worker is stopping,
or the message was taken back), ``busy`` (no free slot: offer it elsewhere).

Invariants (tests/test_pool.py checks them against real processes):

1. A dispatcher offers a message to one worker at a time and never two messages of one key at once
   (it is a :class:`~pcgroups.consume._dispatchers.KeyedDispatcher`); a worker runs at most ``capacity`` calls.
2. A worker silent for :data:`REVOKE_AFTER` is gone: its dispatchers take back what they offered it and
   offer it again (so a killed worker's message runs elsewhere within about ``REVOKE_AFTER`` +
   :data:`HEARTBEAT`); an offer that two of the worker's heartbeats, half a :data:`HEARTBEAT` apart or
   more, do not list :data:`OFFER_GRACE` after it was sent is taken back too (lost on the way). One is not
   enough: the outcome of a call that has just ended is sent before the heartbeat that no longer lists it,
   but on another subscription, and the dispatcher may read it after that heartbeat.
3. A worker's call is **superseded** (``msg.superseded``) when its dispatcher's answer to a heartbeat no
   longer lists it (taken back), or when no answer came for :data:`DOUBT` (the worker was paused or cut
   off, and may have been declared gone). It sends ``+WPI`` while the call runs, so a message whose
   dispatcher died stays with it: the next dispatcher takes over only once it is settled.
4. A stopping worker takes no new offer (``busy``), finishes its calls, says ``LEAVE`` and ends.
5. A dispatcher publishes only to subjects it makes itself: a worker's own subjects, from a heartbeat's name and
   id (a heartbeat whose name or id is not a subject token is ignored), never the reply subject a heartbeat
   names; and it answers no status request whose reply subject starts with ``$`` (JetStream, KV, the pools).
   Whoever may send a heartbeat or a status request cannot make it publish where only its user may
   (docs/SECURITY.md).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..config import validate_name

VERSION = 1
HEARTBEAT = 0.5      # s between a worker's heartbeats
REVOKE_AFTER = 2.0   # s of silence after which a dispatcher takes a worker's messages back
DOUBT = 1.5          # s without an answer after which a worker's calls are superseded
OFFER_GRACE = 1.0    # s after an offer within which a heartbeat may not list it yet
STATUS_SUBJECT = "$PCG.POOL.STATUS"

# offer headers
ACK = "Pcg-Ack"
SUBJECT = "Pcg-Partitioned-Subject"
PIN = "Pcg-Pin"
DISPATCHER = "Pcg-Dispatcher"

OUTCOMES = ("ack", "term", "retry", "none", "dropped", "busy")
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,255}")   # a worker's name or id (invariant 5)


def prefix(flavour: str, stream: str, group: str) -> str:
    """``$PCG.POOL.<flavour>.<stream>.<group>``: every subject of one group's pool starts with it."""
    return f"$PCG.POOL.{flavour}.{stream}.{group}"


def worker_subject(pool: str, name: str, worker_id: str, kind: str) -> str:
    """A worker's own subjects: ``kind`` ``work`` (offers) or ``hb`` (answers to its heartbeats)."""
    return f"{pool}.W.{name}.{worker_id}.{kind}"


def dispatcher_subjects(pool: str) -> list[str]:
    """What a dispatching instance subscribes to and publishes to (its permissions name them, and its errors)."""
    return [f"{pool}.HB", f"{pool}.LEAVE", f"{pool}.D.*.R.*", f"{pool}.STATUS", STATUS_SUBJECT, f"{pool}.HELLO",
            worker_subject(pool, "*", "*", "work"), worker_subject(pool, "*", "*", "hb")]


def worker_subjects(pool: str, name: str, worker_id: str) -> list[str]:
    """What a worker subscribes to and publishes to, besides its acks."""
    return [worker_subject(pool, name, worker_id, "work"), worker_subject(pool, name, worker_id, "hb"),
            f"{pool}.HELLO", f"{pool}.HB", f"{pool}.LEAVE", f"{pool}.D.*.R.*"]


def check_worker_name(name: str) -> None:
    """Worker names are subject tokens (a role's permissions name them): letters, digits, '-' and '_'."""
    validate_name("worker", name)


def encode(obj: dict[str, Any]) -> bytes:
    return json.dumps({"v": VERSION, **obj}, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, Any] | None:
    """A pool message's JSON object, or None when it is not one of ours (another version, garbage)."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return obj if isinstance(obj, dict) and obj.get("v") == VERSION else None


@dataclass
class Heartbeat:
    """A worker's heartbeat, as a dispatcher reads it."""

    name: str
    id: str
    capacity: int
    busy: int = 0
    stopping: bool = False
    held: dict[str, list[int]] = field(default_factory=dict)   # dispatcher id -> stream sequences

    @classmethod
    def parse(cls, data: bytes) -> Heartbeat | None:
        obj = decode(data)
        if obj is None:
            return None
        try:
            held = {str(d): [int(s) for s in seqs] for d, seqs in (obj.get("held") or {}).items()}
            hb = cls(name=str(obj["name"]), id=str(obj["id"]), capacity=int(obj["capacity"]),
                     busy=int(obj.get("busy", 0)), stopping=bool(obj.get("stopping", False)), held=held)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return hb if hb.capacity >= 1 and _TOKEN.fullmatch(hb.name) and _TOKEN.fullmatch(hb.id) else None

    def encode(self) -> bytes:
        return encode({"name": self.name, "id": self.id, "capacity": self.capacity, "busy": self.busy,
                       "stopping": self.stopping, "held": self.held})


@dataclass(frozen=True)
class Outcome:
    """How a worker's call ended (its reply to an offer)."""

    outcome: str
    delay: float = 0.0
    reason: str = ""

    @classmethod
    def parse(cls, data: bytes) -> Outcome | None:
        obj = decode(data)
        if obj is None or obj.get("outcome") not in OUTCOMES:
            return None
        try:
            return cls(str(obj["outcome"]), float(obj.get("delay") or 0.0), str(obj.get("reason") or ""))
        except (TypeError, ValueError):
            return None

    def encode(self) -> bytes:
        body: dict[str, Any] = {"outcome": self.outcome}
        if self.delay:
            body["delay"] = self.delay
        if self.reason:
            body["reason"] = self.reason[:512]
        return encode(body)

"""The wire contract between a dispatching member and its workers (docs/DESIGN.md, *The worker pool*).

A member instance started with ``dispatch=True`` runs no handler: while it holds the member's pin it hands
each message to a **worker**, a process that enrolled with the group (:mod:`pcgroups.pool._dispatcher` is the
dispatcher's side, :mod:`pcgroups.pool._worker` the worker's). Everything here is plain NATS core messaging
under one prefix per group, ``$PCG.POOL.<flavour>.<stream>.<group>`` (``P`` below); bodies are JSON
objects with ``"v": 2`` (a process ignores what it can not read: other versions, garbage):

====================================  ==============================  =========================================
subject                               who publishes                   what
====================================  ==============================  =========================================
``P.HB``                              each worker, every              a **heartbeat** (:class:`Heartbeat`),
                                      :data:`HEARTBEAT`, and at once  numbered ``n``; reply subject
                                      on ``P.HELLO``                  ``P.W.<name>.<id>.hb``
``P.W.<name>.<id>.hb``                every dispatching instance       an **answer** ``{"v","d","member","n",
                                      (pinned or standby), in reply   "upto","held","kept"}`` (:class:`Answer`),
                                      to a heartbeat; and the         or the answer to a synchronous ack
                                      dispatcher of a synchronous     ``{"v","d","token","sync","error"}``
                                      ack
``P.HELLO``                           a dispatching instance that     ``{"v","d","member"}``: workers answer
                                      gains the pin, or that ends     with a heartbeat at once, listing every
                                      because its group was deleted   outcome not confirmed; with
                                                                      ``"end":"deleted"`` they end
``P.LEAVE``                           a worker that stops, once its   ``{"v","name","id"}``
                                      calls ended
``P.W.<name>.<id>.work``              the dispatching instance        an **offer**: the message's headers and
                                                                      body, plus the ``Pcg-*`` headers below,
                                                                      reply subject ``P.D.<d>.R.<token>``
                                                                      (``<n>-<16 hex>``: numbered, not to be
                                                                      guessed by another worker)
``P.D.<d>.R.<token>``                 the worker given the offer      its **acks** ``{"v","ack","sync",
                                                                      "reason"}`` and the call's **outcome**
                                                                      ``{"v","outcome","delay","reason"}``
``P.STATUS``, ``$PCG.POOL.STATUS``    ``cg status``, ``cg metrics``   a request (one group, every group); each
                                                                      dispatching instance answers with its
                                                                      pool (``dispatch.Roster.status``)
====================================  ==============================  =========================================

An offer carries ``Pcg-Partitioned-Subject`` (the message's subject, partition token first), ``Pcg-Delivery``
(``<stream>.<consumer>.<deliveries>.<stream seq>.<consumer seq>.<timestamp>.<pending>``: the message's
metadata, as an ack subject names it) and ``Pcg-Offer`` (``<d> <member> <n>``: the dispatching instance, its
member, and the heartbeat ``n`` of the worker it last answered) next to the message's own headers; never the
ack subject nor the pin. A worker acks through its dispatcher: ``ack`` and ``term`` go to the offer's reply
subject (with ``sync``: the dispatcher answers with what JetStream answered), the dispatcher sends them to
JetStream itself; ``progress`` asks it for a ``+WPI`` (it sends those for every message it holds anyway).
Outcomes: ``ack``, ``term`` (acked or terminated, through the dispatcher), ``retry`` (with ``delay`` and
``reason``: the dispatcher retries in place and dead-letters after ``RetryPolicy.max_deliver``), ``none`` (left
unsettled: redelivered after AckWait), ``dropped`` (not handled: the worker is stopping, the call was
superseded), ``busy`` (no free slot: offer it elsewhere).

Invariants (tests/test_pool.py checks them against real processes):

1. A dispatcher offers a message to one worker at a time and never two messages of one key at once
   (it is a :class:`~pcgroups.consume._dispatchers.KeyedDispatcher`); a worker runs at most ``capacity`` calls, besides the
   calls it **adopts**: an offer of a stream sequence the worker is running already takes that call over (its
   acks and outcome go to the new offer's reply subject), whatever its capacity, and an offer of a delivery
   after the first (``deliveries`` > 1) of a call that ended with ``ack`` or ``term`` not yet confirmed by its
   dispatcher (or of the same delivery again) gets that outcome at once, the handler not run again. A worker's
   heartbeats list a call from its offer until its dispatcher confirmed the outcome (running in ``held``, then
   ended in ``done``), without a gap, and a dispatcher routes an offer of a stream sequence a worker's last
   heartbeat lists (for any dispatcher) to that worker.
2. A worker silent for :data:`REVOKE_AFTER` is gone: its dispatchers take back what they offered it and
   offer it again (so a killed worker's message runs elsewhere within about ``REVOKE_AFTER`` +
   :data:`HEARTBEAT`); an offer that two of the worker's heartbeats, half a :data:`HEARTBEAT` apart or
   more, do not list :data:`OFFER_GRACE` after it was sent is taken back too (lost on the way). One is not
   enough: the outcome of a call that has just ended is sent before the heartbeat that no longer lists it,
   but on another subscription, and the dispatcher may read it after that heartbeat.
3. A worker's call is **superseded** (``msg.superseded``) when its dispatcher's answer no longer lists it
   (taken back: its number is at most ``upto`` and its sequence in neither ``held`` nor ``kept``), or when the
   worker lost contact: no heartbeat it sent in the last :data:`DOUBT` was answered by any instance of the
   call's member. The latter sticks: only an answer of the call's own dispatcher that lists it in ``held``, or
   an offer that adopts it, made from a heartbeat sent less than :data:`OFFER_GRACE` ago, lifts it (a worker
   paused past AckWait reads answers and offers sent before its pause: those prove nothing). ``kept`` lists
   offers the dispatcher gave up without taking them back (its pin was lost: the next pin holder adopts them).
4. A stopping worker takes no new offer (``busy``), finishes its calls, says ``LEAVE`` and ends. A worker ends
   when a dispatcher says the group was deleted.
5. A dispatcher publishes only to subjects it makes itself: a worker's own subjects, from a heartbeat's name and
   id (a heartbeat whose name or id is not a subject token is ignored), never the reply subject a heartbeat or
   an ack names; it answers no status request whose reply subject starts with ``$`` (JetStream, KV, the pools);
   and it takes nothing from a worker but ``ack``, ``term`` and ``progress`` of that worker's own offers.
   Whoever may send a heartbeat, an ack or a status request cannot make it publish where only its user may, nor
   pull or ack anything else (docs/SECURITY.md).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..config import validate_name

VERSION = 2
HEARTBEAT = 0.5  # s between a worker's heartbeats
REVOKE_AFTER = 2.0  # s of silence after which a dispatcher takes a worker's messages back
DOUBT = 1.5  # s without an answered heartbeat after which a worker's calls are superseded
OFFER_GRACE = 1.0  # s after an offer within which a heartbeat may not list it yet
STATUS_SUBJECT = "$PCG.POOL.STATUS"

# offer headers
SUBJECT = "Pcg-Partitioned-Subject"
DELIVERY = "Pcg-Delivery"
OFFER = "Pcg-Offer"

OUTCOMES = ("ack", "term", "retry", "none", "dropped", "busy")
ACKS = ("ack", "term", "progress")  # what a worker may ask its dispatcher to send to JetStream (invariant 5)
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,255}")  # a worker's name or id (invariant 5)


def prefix(flavour: str, stream: str, group: str) -> str:
    """``$PCG.POOL.<flavour>.<stream>.<group>``: every subject of one group's pool starts with it."""
    return f"$PCG.POOL.{flavour}.{stream}.{group}"


def worker_subject(pool: str, name: str, worker_id: str, kind: str) -> str:
    """A worker's own subjects: ``kind`` ``work`` (offers) or ``hb`` (answers to its heartbeats and acks)."""
    return f"{pool}.W.{name}.{worker_id}.{kind}"


def dispatcher_subjects(pool: str) -> list[str]:
    """What a dispatching instance subscribes to and publishes to (its permissions name them, and its errors)."""
    return [
        f"{pool}.HB",
        f"{pool}.LEAVE",
        f"{pool}.D.*.R.*",
        f"{pool}.STATUS",
        STATUS_SUBJECT,
        f"{pool}.HELLO",
        worker_subject(pool, "*", "*", "work"),
        worker_subject(pool, "*", "*", "hb"),
    ]


def worker_subjects(pool: str, name: str, worker_id: str) -> list[str]:
    """What a worker subscribes to and publishes to: nothing of JetStream's."""
    return [
        worker_subject(pool, name, worker_id, "work"),
        worker_subject(pool, name, worker_id, "hb"),
        f"{pool}.HELLO",
        f"{pool}.HB",
        f"{pool}.LEAVE",
        f"{pool}.D.*.R.*",
    ]


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


def _seqs(value: Any) -> list[int]:
    return [int(s) for s in value or ()]


@dataclass
class Heartbeat:
    """A worker's heartbeat, as a dispatcher reads it: ``held`` its calls running (not taken back) by dispatcher
    id, ``fenced`` those of them superseded for lost contact (invariant 3), ``done`` the calls that ended with
    ``ack`` or ``term`` whose dispatcher has not confirmed the outcome yet (stream sequence -> outcome)."""

    name: str
    id: str
    capacity: int
    busy: int = 0
    stopping: bool = False
    n: int = 0
    held: dict[str, list[int]] = field(default_factory=dict)  # dispatcher id -> stream sequences
    fenced: list[int] = field(default_factory=list)
    done: dict[int, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: bytes) -> Heartbeat | None:
        obj = decode(data)
        if obj is None:
            return None
        try:
            held = {str(d): _seqs(seqs) for d, seqs in (obj.get("held") or {}).items()}
            done = {int(s): str(o) for s, o in (obj.get("done") or {}).items() if o in ("ack", "term")}
            hb = cls(
                name=str(obj["name"]),
                id=str(obj["id"]),
                capacity=int(obj["capacity"]),
                busy=int(obj.get("busy", 0)),
                stopping=bool(obj.get("stopping", False)),
                n=int(obj.get("n", 0)),
                held=held,
                fenced=_seqs(obj.get("fenced")),
                done=done,
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return hb if hb.capacity >= 1 and _TOKEN.fullmatch(hb.name) and _TOKEN.fullmatch(hb.id) else None

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "name": self.name,
            "id": self.id,
            "capacity": self.capacity,
            "busy": self.busy,
            "stopping": self.stopping,
            "n": self.n,
            "held": self.held,
        }
        if self.fenced:
            body["fenced"] = self.fenced
        if self.done:
            body["done"] = {str(s): o for s, o in self.done.items()}
        return encode(body)

    def listed(self) -> set[int]:
        """Every stream sequence it names: running (for any dispatcher) or ended with an unconfirmed outcome."""
        return {s for seqs in self.held.values() for s in seqs} | set(self.done)


@dataclass(frozen=True)
class Answer:
    """A dispatching instance's answer to heartbeat ``n``: of its offers numbered up to ``upto``, those the worker
    holds for it (``held``, under a pin it holds for sure) and those it gave up without taking them back
    (``kept``); any other is taken back (invariant 3)."""

    d: str
    member: str
    n: int
    upto: int
    held: frozenset[int]
    kept: frozenset[int]

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Answer | None:
        try:
            return cls(
                str(obj["d"]),
                str(obj.get("member", "")),
                int(obj.get("n") or 0),
                int(obj.get("upto") or 0),
                frozenset(_seqs(obj.get("held"))),
                frozenset(_seqs(obj.get("kept"))),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def encode(self) -> bytes:
        return encode(
            {
                "d": self.d,
                "member": self.member,
                "n": self.n,
                "upto": self.upto,
                "held": sorted(self.held),
                "kept": sorted(self.kept),
            }
        )


@dataclass(frozen=True)
class Outcome:
    """How a worker's call ended (its reply to an offer)."""

    outcome: str
    delay: float = 0.0
    reason: str = ""

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Outcome | None:
        if obj.get("outcome") not in OUTCOMES:
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


def offer_header(d: str, member: str, beat: int) -> str:
    return f"{d} {member} {beat}"


def parse_offer_header(value: str) -> tuple[str, str, int] | None:
    """(dispatcher id, member, heartbeat number) of a ``Pcg-Offer`` header, None when it is not one."""
    parts = value.split(" ")
    if len(parts) != 3 or not parts[0] or not parts[2].isdigit():
        return None
    return parts[0], parts[1], int(parts[2])


def delivery_header(ack_subject: str) -> str:
    """``Pcg-Delivery``: a JetStream ack subject's metadata (v1 or v2 form), without the domain, account, or
    anything else (the worker can not ack with it: it has no JetStream permission, and acks through the
    dispatcher)."""
    tokens = ack_subject.split(".")
    if len(tokens) == 9:
        return ".".join(tokens[2:])
    return ".".join(tokens[4:11])  # v2: $JS.ACK.<domain>.<account hash>.<stream>...<pending>[.<token>]


def delivery_reply(delivery: str) -> str:
    """The v1 ack subject a worker's :class:`~pcgroups.delivery.Msg` reads its metadata from (never sent to)."""
    return f"$JS.ACK.{delivery}"

"""The demo's scenario: its streams, groups and instances, its phases and when each step happens
(:class:`Plan`), and what a run found (:class:`DemoResult`: the checker's reports, each :class:`Takeover`
after a kill and each partition a membership change moved, :class:`Move`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pcgroups.testing import Report

DEFAULT_DURATION = 36.0
CLUSTER_DURATION = 60.0  # the default with --cluster: a leader election takes 4-9 s
ELECTION = 9.0  # nats-server's longest raft election timeout
MIN_DURATION = 8.0
DEFAULT_RATE = 150.0  # messages per second, both streams together
MIN_RATE, MAX_RATE = 10.0, 2000.0

STATIC_STREAM, STATIC_GROUP, STATIC_PARTITIONS = "orders", "sg", 4
STATIC_MEMBERS = ["m1", "m2"]
ELASTIC_STREAM, ELASTIC_GROUP, ELASTIC_PARTITIONS = "events", "eg", 6
ELASTIC_FIRST = ["e1", "e2"]
ELASTIC_ADDED, ELASTIC_DROPPED = "e3", "e1"
KEYS = 24  # distinct keys per stream (customers, devices)

# (flavour, member, instance): m1 and e2 run a standby each; e3 runs before it is a member
INSTANCES = [
    ("static", "m1", "m1-a"),
    ("static", "m1", "m1-b"),
    ("static", "m2", "m2-a"),
    ("elastic", "e1", "e1-a"),
    ("elastic", "e2", "e2-a"),
    ("elastic", "e2", "e2-b"),
    ("elastic", "e3", "e3-a"),
]
KILL_STATIC_MEMBER, KILL_ELASTIC_MEMBER = "m1", "e2"

PHASES = ["setup", "traffic", "kill m1's pinned", "kill e2's pinned", "add e3", "drop e1", "catch up", "summary"]
CLUSTER_PHASES = [*PHASES[:-2], "kill a node", *PHASES[-2:]]


@dataclass
class Plan:
    """When each step happens, in seconds after the traffic starts."""

    span: float  # the traffic and change phases; the drain follows until ``span``
    ack_wait: float
    rate: float
    work: float
    kill_static: float = 0.0
    kill_elastic: float = 0.0
    add_member: float = 0.0
    drop_member: float = 0.0
    stop_traffic: float = 0.0
    kill_node: float | None = None  # --cluster: SIGKILL the orders stream's leader node

    @classmethod
    def make(cls, span: float, *, rate: float, ack_wait: float | None, work: float, cluster: bool = False) -> Plan:
        span = max(span, MIN_DURATION - 1)
        aw = ack_wait if ack_wait else min(3.0, max(1.0, round(span / 12 * 2) / 2))
        if cluster:  # the changes first, then the node kill with an election's time left before the traffic stops
            aw = ack_wait if ack_wait else 2.0
            return cls(
                span=span,
                ack_wait=aw,
                rate=rate,
                work=work,
                kill_static=0.10 * span,
                kill_elastic=0.20 * span,
                add_member=0.30 * span,
                drop_member=0.40 * span,
                kill_node=0.52 * span,
                stop_traffic=max(0.86 * span, 0.52 * span + ELECTION + 2),
            )
        return cls(
            span=span,
            ack_wait=aw,
            rate=rate,
            work=work,
            kill_static=0.18 * span,
            kill_elastic=0.34 * span,
            add_member=0.50 * span,
            drop_member=0.64 * span,
            stop_traffic=0.86 * span,
        )

    @property
    def grace(self) -> float:
        """How long the catch-up may run past the span (failover and hand-over bounds)."""
        return 2 * self.ack_wait + 3 + (2 * ELECTION if self.kill_node is not None else 0)


@dataclass
class Move:
    """A partition that changed owner in a membership change, and when its new owner first handled it."""

    partition: int
    src: str | None  # the owner before (None: nobody)
    dst: str | None  # the owner after
    after: float | None = None  # seconds from the change to the new owner's first call on it
    by: str = ""  # the instance that made that call


@dataclass
class Takeover:
    what: str  # "static m1", "elastic e2", "add e3", "drop e1"
    at: float  # wall time of the kill or change
    victim: str = ""
    by: str = ""
    after: float | None = None  # seconds until the successor started a message (a change: every moved partition)
    moves: list[Move] = field(default_factory=list)  # a membership change: every partition that moved
    partitions: list[int] = field(default_factory=list)  # a kill: the member's partitions


@dataclass
class DemoResult:
    """What the demo found (``exit_code`` 0 when every check passed)."""

    exit_code: int
    reports: dict[str, Report] = field(default_factory=dict)
    published: dict[str, int] = field(default_factory=dict)
    takeovers: list[Takeover] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    elapsed: float = 0.0


def flavour_of(member: str) -> str:
    """static or elastic: the group ``member`` belongs to."""
    return next(f for f, m, _ in INSTANCES if m == member)

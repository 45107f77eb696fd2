"""What a running instance tells its owner: state changes and rebalance hooks.

A consume entry point (``static_consume``, ``elastic_consume``, automatic membership) takes

- ``on_event``: called with an :class:`InstanceEvent` each time the instance's state changes
  (a plain callable, called on the event loop; it must not block); ``pinned`` is said before the
  first handler of the pin starts (handlers of a new pin wait for the control loop to say it);
- ``on_assigned(partitions)``: called, and awaited if it returns an awaitable, before the first
  message of newly owned partitions is handed to the handler;
- ``on_revoked(partitions)``: called, and awaited, after the in-flight handlers of those partitions
  finished and before they are released to another member.

An exception raised by a hook is logged and ends the instance with that error (``done()`` gives it).

Event kinds (``InstanceEvent.kind``), one of :data:`KINDS`:

``pinned``        this instance holds the member's pin and handles ``partitions``;
``standby``       another instance of the member holds the pin; ``partitions`` are the member's;
``lost-pin``      this instance held the pin and another instance of the member holds it now;
``not-a-member``  elastic: the member is not in the group (yet); the instance waits to be added;
``added``         elastic: the member was added; ``partitions`` are its partitions;
``partitions``    the member's partitions changed (a rebalance); ``partitions`` are the new ones;
``dropped``       elastic: the member was dropped; the instance idles until it is added again (not
                  said of an automatic-membership instance's own leave when it stops);
``disconnected``  the connection to ``detail`` (a server URL, credentials removed) was lost;
``reconnected``   the connection is back, to ``detail``;
``unavailable``   at start: the server or JetStream does not answer (``detail`` says how); the start is
                  tried again until it does (``*_consume`` returns then) or is cancelled.

What happens to a message whose handler fails (every path, :mod:`pcgroups.consume._dispatchers`; ``partitions`` is
the message's partition, ``detail`` names the message):

``failed``        an attempt failed (the handler raised, or called ``nak()``): ``detail`` says which attempt of how
                  many, the reason (the exception's type and message) and when it is tried again (or ``given up``:
                  the last one). Said at each one;
``dead-lettered`` a message was given up and is in a dead-letter stream (the group's, or ``dead_letter_subject``'s):
                  its PubAck came, and the message was terminated; also a message that followed its parked key;
``terminated``    a message was given up with ``RetryPolicy(drop=True)``: terminated, kept nowhere;
``dead-letter-refused``  a message's dead letter was refused (``detail`` names the message, the stream or subject
                  and the server's reason); the message is held and its dead letter tried again. Said at each
                  refusal;
``parked``        ``park_keys``: a key was parked (``detail`` names it): its later messages follow it into the
                  group's dead-letter stream, without running, until a replay frees it;
``unparked``      a key is free again (its dead letters replayed, or purged): its messages run.

A dispatching instance (``dispatch=True``, :mod:`pcgroups.pool._dispatcher`) also says:

``worker-joined`` a worker enrolled with the group's pool: ``detail`` is its name and capacity;
``worker-left``   a worker left (stopped) or went silent: ``detail`` is its name and why.

A worker (:mod:`pcgroups.pool._worker`; ``member`` is the worker's name) says ``enrolled`` (a dispatching member
answered it: ``detail`` names the member), ``no-dispatcher`` (none answered yet: ``detail`` names the group),
``disconnected`` and ``reconnected``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

KINDS = (
    "pinned",
    "standby",
    "lost-pin",
    "not-a-member",
    "added",
    "partitions",
    "dropped",
    "disconnected",
    "reconnected",
    "unavailable",
    "worker-joined",
    "worker-left",
    "enrolled",
    "no-dispatcher",
    "dead-letter-refused",
    "failed",
    "dead-lettered",
    "terminated",
    "parked",
    "unparked",
)


@dataclass(frozen=True)
class InstanceEvent:
    """One change of an instance's state; ``partitions`` sorted, ``detail`` free text (a URL)."""

    kind: str
    member: str
    partitions: tuple[int, ...] = ()
    detail: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown instance event kind {self.kind!r}; known: {', '.join(KINDS)}")


EventCallback = Callable[[InstanceEvent], None]
PartitionsHook = Callable[[set[int]], Awaitable[None] | None]

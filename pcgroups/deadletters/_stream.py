"""The group's dead-letter stream itself: made with the group (or by a member instance on first need), deleted
only when asked, and written to with a stream's acknowledgement.

Invariants:

1. The stream (:func:`stream_config`) holds every subject of ``_names.dead_letter_subjects``, on file, with the
   replicas of the group's stream, no limits and ``discard: new``: a full stream (limits an operator set) refuses
   a dead letter, it never drops one. Its duplicate window (2 minutes) makes a dead letter published again after a
   lost acknowledgement, or by the next pin holder after a crash, one entry (``Nats-Msg-Id``).
2. :func:`ensure_stream` is idempotent: a stream that exists is left as it is (an operator may have set limits).
3. :func:`publish` returns only once the stream acknowledged the dead letter (its PubAck); anything else raises.
"""

from __future__ import annotations

from typing import Any

from ..errors import JetStreamAPIError, NotFoundError
from ..jetstream._api import ERR_STREAM_NAME_IN_USE, JetStreamApi, StreamConfig
from ._names import dead_letter_stream, dead_letter_subjects

DUPLICATE_WINDOW = 120.0  # seconds: a dead letter published again within it is stored once (invariant 1)


def stream_config(flavour: str, stream: str, group: str, replicas: int = 1) -> StreamConfig:
    """The dead-letter stream of ``group`` (invariant 1)."""
    return StreamConfig(
        name=dead_letter_stream(flavour, stream, group),
        subjects=[dead_letter_subjects(flavour, stream, group)],
        max_consumers=-1,
        max_msgs=-1,
        max_bytes=-1,
        discard="new",
        max_msgs_per_subject=-1,
        max_msg_size=-1,
        storage="file",
        num_replicas=max(replicas, 1),
        duplicate_window=int(DUPLICATE_WINDOW * 1e9),
        allow_direct=True,
    )


async def ensure_stream(api: JetStreamApi, flavour: str, stream: str, group: str, replicas: int = 1) -> bool:
    """Create the group's dead-letter stream unless it exists (invariant 2); True when this call created it."""
    config = stream_config(flavour, stream, group, replicas)
    try:
        await api.stream_info(config.name)
        return False
    except NotFoundError:
        pass
    try:
        await api.create_stream(config)
        return True
    except JetStreamAPIError as e:
        if e.err_code == ERR_STREAM_NAME_IN_USE:
            return False  # made meanwhile (another instance, the group's create)
        raise


async def delete_stream(api: JetStreamApi, flavour: str, stream: str, group: str) -> bool:
    """Delete the group's dead-letter stream (every dead letter in it); False when there was none."""
    return await api.delete_stream(dead_letter_stream(flavour, stream, group))


async def publish(
    api: JetStreamApi, subject: str, data: bytes, headers: dict[str, str], *, msg_id: str
) -> dict[str, Any]:
    """Store a dead letter (invariant 3): its PubAck (``duplicate`` when the stream had it already)."""
    return await api.publish(subject, data, {**headers, "Nats-Msg-Id": msg_id})

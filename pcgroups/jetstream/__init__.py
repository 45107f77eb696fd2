"""Talking to JetStream: the API requests nats-py lacks, the config KV buckets, refused permissions.

Every request pcgroups sends to JetStream goes through :class:`JetStreamApi` (priority groups, pinned
pulls, unpin, reset, to a domain's API prefix); the group configs live in KV buckets read and written by
``_store``; ``_permissions`` turns a refused publish or subscription into one
:class:`~pcgroups.errors.PermissionDeniedError`. A client's :class:`Connection` owns what pcgroups keeps of
it (its JetStream, its listeners) and ``_compat`` every patch of nats-py. The JetStream error codes pcgroups branches on are named
once here (``ERR_*``).
"""

from ._api import (
    ERR_CONSUMER_NOT_FOUND,
    ERR_NO_MESSAGE_FOUND,
    ERR_NO_STREAM_MATCHES,
    ERR_STREAM_NOT_FOUND,
    PINNED_CLIENT,
    PRIORITY_GROUP,
    ConsumerConfig,
    JetStreamApi,
    StreamConfig,
)
from ._connection import Connection, domain_of, prefix_of
from ._permissions import PermissionWatch, Violation
from ._store import ELASTIC_BUCKET, STATIC_BUCKET, snapshot

__all__ = [
    "ELASTIC_BUCKET",
    "ERR_CONSUMER_NOT_FOUND",
    "ERR_NO_MESSAGE_FOUND",
    "ERR_NO_STREAM_MATCHES",
    "ERR_STREAM_NOT_FOUND",
    "PINNED_CLIENT",
    "PRIORITY_GROUP",
    "STATIC_BUCKET",
    "Connection",
    "ConsumerConfig",
    "JetStreamApi",
    "PermissionWatch",
    "StreamConfig",
    "Violation",
    "domain_of",
    "prefix_of",
    "snapshot",
]

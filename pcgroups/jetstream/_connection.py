"""One nats-py client as pcgroups uses it: the JetStream it talks to, its listeners, nats-py's patches.

A :class:`Connection` is made once per client (:meth:`Connection.of`) and owns everything pcgroups keeps
about that client: the JetStream API prefix calls without ``api=`` go to (``$JS.API``, or a domain's bound
with :meth:`Connection.bind`, as ``pcgroups.connect.connect`` does for a context's domain), the listeners of
its disconnections and reconnections (:class:`~pcgroups.jetstream._compat.ConnectionWatch`) and of refused
permissions (:class:`~pcgroups.jetstream._permissions.PermissionWatch`), and the patches ``_compat`` applies.

Invariants:

1. One ``Connection`` per client, made on first use, after the client connected (nats-py's ``connect()``
   sets the callbacks the watches wrap); the client's own callbacks still run, after the listeners.
2. Nothing else keeps state on the client: a second ``Connection.of(nc)`` is the first one.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ._compat import ConnectionWatch, tolerate_undecodable
from ._permissions import PermissionWatch

if TYPE_CHECKING:
    from nats.aio.client import Client

DEFAULT_API_PREFIX = "$JS.API"


def prefix_of(domain: str | None = None, prefix: str | None = None) -> str:
    """The JetStream API prefix of ``domain`` (``$JS.<domain>.API``), or ``prefix`` itself (a trailing ``.``
    dropped), or ``$JS.API``; a ConfigError for a name the server would not take, or for both."""
    if domain and prefix:
        raise ConfigError(
            f"give a JetStream domain or an API prefix, not both (domain {domain!r}, API prefix {prefix!r})"
        )
    if domain:
        if any(c in ".*>" or c.isspace() for c in domain):
            raise ConfigError(
                f"invalid JetStream domain {domain!r}: a domain may not contain '.', '*', '>' or whitespace"
            )
        return f"$JS.{domain}.API"
    if prefix:
        subject = prefix.removesuffix(".")
        tokens = subject.split(".")
        if any(not t or t in ("*", ">") or any(c.isspace() for c in t) for t in tokens):
            raise ConfigError(
                f"invalid JetStream API prefix {prefix!r}: it must be a subject without wildcards "
                "(e.g. $JS.hub.API or JS.acme.API)"
            )
        return subject
    return DEFAULT_API_PREFIX


def domain_of(prefix: str) -> str | None:
    """The domain of an API prefix ``$JS.<domain>.API``; None for any other prefix."""
    parts = prefix.split(".")
    return parts[1] if len(parts) == 3 and parts[0] == "$JS" and parts[2] == "API" else None


class Connection:
    """What pcgroups keeps of one nats-py client (see the module docstring)."""

    def __init__(self, nc: Client):
        self.nc = nc
        #: the JetStream API prefix of calls made without ``api=``
        self.prefix = DEFAULT_API_PREFIX
        tolerate_undecodable(nc)  # a subject that is not UTF-8 must not stop the client's reader
        self.watch = ConnectionWatch(nc)
        self.permissions = PermissionWatch(nc)

    @classmethod
    def of(cls, nc: Client) -> Connection:
        """The client's ``Connection``, made on first use."""
        connection = _connections.get(nc)
        if connection is None:
            connection = _connections[nc] = cls(nc)
        return connection

    def bind(self, *, domain: str | None = None, api_prefix: str | None = None) -> None:
        """Make ``domain``'s JetStream (or ``api_prefix``'s; neither: ``$JS.API``) the one calls on this client
        go to when they name none."""
        self.prefix = prefix_of(domain, api_prefix)

    @property
    def domain(self) -> str | None:
        """The JetStream domain bound (None: the client's own, or an API prefix)."""
        return domain_of(self.prefix)


_connections: weakref.WeakKeyDictionary[Any, Connection] = weakref.WeakKeyDictionary()

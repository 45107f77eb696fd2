"""Everything pcgroups changes on a nats-py client, in one place (nats-py 2.x has no listener lists).

nats-py keeps one ``disconnected_cb``, one ``reconnected_cb`` and one ``error_cb`` per client and decodes
subjects as strict UTF-8 in ``Client._build_message``. pcgroups needs several listeners of each and must
survive a subject that is not UTF-8, so it wraps these private attributes of the client (never nats-py's
classes), each once per client: :class:`ConnectionWatch` (disconnections, reconnections),
``_permissions.PermissionWatch`` (refused permissions, through :func:`wrap_error_callback`) and
:func:`tolerate_undecodable`. :data:`PATCHED` names every attribute touched; tests/test_connect.py checks
that nats-py still has each, so an upgrade that changes them fails loudly.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nats.aio.client import Client

log = logging.getLogger("pcgroups")

#: the private attributes of nats-py's ``Client`` that pcgroups wraps
PATCHED = ("_disconnected_cb", "_reconnected_cb", "_error_cb", "_build_message")

_tolerant: weakref.WeakSet[Client] = weakref.WeakSet()  # the clients tolerate_undecodable has wrapped


class ConnectionWatch:
    """The disconnections and reconnections of one client, for several listeners: its ``Connection``'s
    (``Connection.of(nc).watch``).

    It attaches itself by wrapping the client's ``disconnected`` and ``reconnected`` callbacks (nats-py
    keeps one of each, no list of listeners); the callbacks it wraps still run, after the listeners.
    A listener gets ``("disconnected" | "reconnected", url)``, the server's URL without credentials.
    """

    def __init__(self, nc: Client):
        self._nc = nc
        self._listeners: list[Callable[[str, str], None]] = []
        self._url = _plain_url(nc.connected_url)
        self._forward_disconnected = nc._disconnected_cb
        self._forward_reconnected = nc._reconnected_cb
        nc._disconnected_cb = self._disconnected
        nc._reconnected_cb = self._reconnected

    def listen(self, listener: Callable[[str, str], None]) -> Callable[[], None]:
        """Call ``listener(kind, url)`` on each change; returns the function that stops it."""
        self._listeners.append(listener)

        def unlisten() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unlisten

    def _tell(self, kind: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(kind, self._url)
            except Exception as e:
                log.warning("connection listener failed on %s: %r", kind, e)

    async def _disconnected(self) -> None:
        if not self._nc.is_closed:  # nats-py calls it on close() too: that is no disconnection
            self._tell("disconnected")
        if self._forward_disconnected is not None:
            await self._forward_disconnected()

    async def _reconnected(self) -> None:
        self._url = _plain_url(self._nc.connected_url) or self._url
        self._tell("reconnected")
        if self._forward_reconnected is not None:
            await self._forward_reconnected()


def tolerate_undecodable(nc: Client) -> None:
    """Let the client take messages whose subject (or reply subject) is not valid UTF-8 (idempotent).

    The server accepts any byte in a subject but ``\\r``, ``\\n``, space and tab; nats-py decodes subjects
    as strict UTF-8 in ``Client._build_message``, called by its reader task, and the ``UnicodeDecodeError``
    ends that task for good: the connection stays up and reads nothing more, so a member instance stops,
    and after its reconnect the same message comes again. This wraps that one method of this client (not
    nats-py's class): a message that decodes is built as before; one that does not is built with U+FFFD in
    place of the invalid bytes (as nats-py decodes header values) and logged once, with its stream and
    sequence when it is a JetStream message. The handler gets it like any other.
    """
    if nc in _tolerant:
        return
    build = nc._build_message

    def build_tolerantly(sid: int, subject: bytes, reply: bytes, data: bytes, headers: Any) -> Any:
        try:
            return build(sid, subject, reply, data, headers)
        except UnicodeDecodeError:
            pass
        fixed, fixed_reply = (b.decode("utf-8", "replace").encode() for b in (subject, reply))
        log.warning(
            "%s is not valid UTF-8 (%s): delivered with U+FFFD in place of the invalid bytes",
            _undecodable_what(subject, reply),
            subject.decode("utf-8", "backslashreplace"),
        )
        return build(sid, fixed, fixed_reply, data, headers)

    nc._build_message = build_tolerantly  # type: ignore[method-assign]  # this client's only
    _tolerant.add(nc)


def _undecodable_what(subject: bytes, reply: bytes) -> str:
    """Names a message that does not decode: for a JetStream delivery, its stream, sequence and consumer (from
    the ack subject ``$JS.ACK.[<domain>.<account>.]<stream>.<consumer>.<delivered>.<seq>...``)."""
    try:
        subject.decode()
        part = "the reply subject"
    except UnicodeDecodeError:
        part = "the subject"
    t = [token.decode("utf-8", "replace") for token in reply.split(b".")]
    if reply.startswith(b"$JS.ACK.") and len(t) >= 9:
        stream, consumer, seq = (t[2], t[3], t[5]) if len(t) == 9 else (t[4], t[5], t[7])
        return f"{part} of message {seq} of stream {stream} (consumer {consumer})"
    return f"{part} of a message"


def _plain_url(url: Any) -> str:
    """``scheme://host:port`` of a parsed server URL (credentials left out); "" for None."""
    if url is None:
        return ""
    host = url.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{url.scheme}://{host}:{url.port}" if url.port else f"{url.scheme}://{host}"


def wrap_error_callback(nc: Client, on_error: Callable[[Exception], Awaitable[None]]) -> None:
    """Call ``on_error`` for each error nats-py reports on ``nc``, before the callback the user gave (which
    still runs: ``on_error`` forwards to it)."""
    forward = nc._error_cb

    async def both(error: Exception) -> None:
        try:
            await on_error(error)
        finally:
            await forward(error)

    nc._error_cb = both

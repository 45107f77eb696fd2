"""A TCP proxy on 127.0.0.1 that the tests put between a NATS client (or a cluster route) and a server,
and whose faults they control: a network partition, a slow link, connections closed by the other end.

Modes (:meth:`FaultProxy.pass_through`, :meth:`blackhole`, :meth:`delay`, :meth:`close_connections`):

- **pass**: bytes are forwarded as they come;
- **blackhole**: nothing is forwarded in either direction, the sockets stay open (a partition: neither
  side learns anything). What was sent meanwhile is held and forwarded, in order, once the proxy passes
  again, as TCP delivers what it retransmitted after a short partition heals;
- **delay** N ms: each chunk is forwarded N ms after it arrived, in order, both directions (a round trip
  takes 2 N ms more);
- **close**: every connection open now is closed at both ends (new ones are accepted, as a server that
  closes its clients would accept them again).

Everything runs in the caller's event loop; only 127.0.0.1 is ever bound or dialled.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

HOST = "127.0.0.1"
CHUNK = 65536


class _Link:
    """One proxied connection: two directions, each a reader task and a writer task with a queue between."""

    def __init__(
        self,
        proxy: FaultProxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ):
        self.proxy = proxy
        self.writers = (client[1], upstream[1])
        self.closed = False
        self.tasks = [
            asyncio.create_task(self._pipe(client[0], upstream[1])),
            asyncio.create_task(self._pipe(upstream[0], client[1])),
        ]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: deque[tuple[float, bytes]] = deque()
        arrived = asyncio.Event()
        forward = asyncio.create_task(self._forward(queue, arrived, writer))
        self.tasks.append(forward)
        try:
            while data := await reader.read(CHUNK):
                queue.append((time.monotonic(), data))
                arrived.set()
        except (ConnectionError, OSError):
            pass
        if not self.closed:
            queue.append((time.monotonic(), b""))  # end of stream: close once everything before it went out
            arrived.set()
            await asyncio.gather(forward, return_exceptions=True)
            self.close()

    async def _forward(
        self, queue: deque[tuple[float, bytes]], arrived: asyncio.Event, writer: asyncio.StreamWriter
    ) -> None:
        proxy = self.proxy
        while True:
            while not queue:
                arrived.clear()
                await arrived.wait()
            await proxy._passing.wait()  # blackhole: hold everything
            t, data = queue[0]
            due = t + proxy.delay_s - time.monotonic()
            if due > 0:
                await asyncio.sleep(due)
                continue  # the mode may have changed meanwhile
            queue.popleft()
            if not data:
                return
            try:
                writer.write(data)
                await writer.drain()
            except (ConnectionError, OSError):
                return

    def close(self) -> None:
        self.closed = True
        for w in self.writers:
            w.close()
        for t in self.tasks:
            if t is not asyncio.current_task():
                t.cancel()
        self.proxy._links.discard(self)


class FaultProxy:
    """Listens on 127.0.0.1:``port`` (0: a free one) and forwards every connection to 127.0.0.1:``upstream``."""

    def __init__(self, upstream: int, *, port: int = 0, name: str = ""):
        self.upstream = upstream
        self.port = port
        self.name = name or f"proxy->{upstream}"
        self.delay_s = 0.0
        self.accepted = 0  # connections accepted so far (a reconnect shows as one more)
        self._passing = asyncio.Event()
        self._passing.set()
        self._links: set[_Link] = set()
        self._server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    @property
    def mode(self) -> str:
        if not self._passing.is_set():
            return "blackhole"
        return f"delay {self.delay_s * 1000:g} ms" if self.delay_s else "pass"

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, HOST, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            upstream = await asyncio.open_connection(HOST, self.upstream)
        except OSError:
            writer.close()
            return
        self._links.add(_Link(self, (reader, writer), upstream))

    # --- faults -----------------------------------------------------------------------------
    def pass_through(self) -> None:
        """Forward everything again (a partition heals: what was held goes out first, in order)."""
        self.delay_s = 0.0
        self._passing.set()

    def blackhole(self) -> None:
        """Forward nothing, keep every socket open."""
        self._passing.clear()

    def delay(self, ms: float) -> None:
        """Forward each chunk ``ms`` milliseconds after it arrived (each direction)."""
        self.delay_s = ms / 1000
        self._passing.set()

    def close_connections(self) -> int:
        """Close every open connection at both ends; how many there were."""
        links = list(self._links)
        for link in links:
            link.close()
        return len(links)

    async def close(self) -> None:
        self.close_connections()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

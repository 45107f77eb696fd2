"""tests/helpers/faultproxy.py between a nats-py client and a real server: each mode does what the partition scenarios
rely on (tests/chaos.py)."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest

from .helpers.faultproxy import FaultProxy
from .helpers.support import wait_for


@pytest.fixture
async def proxied(nats_server):
    async with FaultProxy(nats_server.port) as proxy:
        reconnects: list[float] = []

        async def reconnected() -> None:
            reconnects.append(time.monotonic())

        nc = await nats.connect(
            proxy.url, reconnect_time_wait=0.05, max_reconnect_attempts=-1, reconnected_cb=reconnected
        )
        direct = await nats.connect(nats_server.url)
        yield proxy, nc, direct, reconnects
        await nc.close()
        await direct.close()


async def test_blackhole_holds_both_directions_and_heal_delivers_in_order(proxied, uniq):
    proxy, nc, direct, _ = proxied
    got: list[bytes] = []

    async def collect(m) -> None:
        got.append(m.data)

    await direct.subscribe(f"{uniq}.out", cb=collect)
    await direct.flush()
    proxy.blackhole()
    assert proxy.mode == "blackhole"
    for i in range(5):
        await nc.publish(f"{uniq}.out", str(i).encode())
    with pytest.raises(nats.errors.TimeoutError):  # no PONG either: the link delivers nothing
        await nc.flush(timeout=0.5)
    assert got == [] and nc.is_connected  # the socket stays open: the client does not know
    proxy.pass_through()
    await wait_for(lambda: len(got) == 5, 5, what="the held messages")
    assert got == [b"0", b"1", b"2", b"3", b"4"]


async def test_delay_adds_latency_each_way(proxied, uniq):
    """Each direction is delayed on its own (measured one way), and pass-through adds nothing: the best of a
    few round trips, after a first one that sets up the client's reply subscription, is under one delay
    (a single round trip on a loaded machine may take longer, which says nothing about the proxy)."""
    proxy, nc, direct, _ = proxied
    loop = asyncio.get_running_loop()
    arrived: dict[str, asyncio.Future[float]] = {}

    async def echo(m) -> None:
        await direct.publish(m.reply, m.data)

    async def seen(m) -> None:
        arrived[m.subject].set_result(time.monotonic())

    await direct.subscribe(f"{uniq}.echo", cb=echo)
    await direct.subscribe(f"{uniq}.up", cb=seen)  # client -> proxy -> server
    await nc.subscribe(f"{uniq}.down", cb=seen)  # server -> proxy -> client
    await direct.flush()
    await nc.flush()

    async def round_trip() -> float:
        t0 = time.monotonic()
        await nc.request(f"{uniq}.echo", b"x", timeout=2)
        return time.monotonic() - t0

    async def one_way(sender, subject: str) -> float:
        arrived[subject] = loop.create_future()
        t0 = time.monotonic()
        await sender.publish(subject, b"x")
        return await asyncio.wait_for(arrived[subject], 2) - t0

    await round_trip()
    fast = min([await round_trip() for _ in range(5)])
    proxy.delay(150)
    up, down = await one_way(nc, f"{uniq}.up"), await one_way(direct, f"{uniq}.down")
    slow = await round_trip()
    assert fast < 0.15 <= min(up, down) and slow >= 0.3, (fast, up, down, slow)


async def test_close_ends_the_connection_and_the_client_reconnects(proxied):
    proxy, nc, _, reconnects = proxied
    assert proxy.accepted == 1
    assert proxy.close_connections() == 1
    await wait_for(lambda: reconnects, 5, what="a reconnect")
    assert proxy.accepted == 2
    await nc.flush(timeout=2)

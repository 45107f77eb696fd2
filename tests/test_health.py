"""Health probes (pcgroups.ops._health): /healthz and /readyz of ``consume --metrics-listen`` and ``cg metrics``,
asked over real HTTP while the event loop blocks, the server goes down and comes back, the member is
dropped and added again, and the process is stopped."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest
from nats.js.api import StreamConfig

from pcgroups import PartitioningFilter, add_members, create_elastic
from pcgroups.ops._health import Health, serve
from pcgroups.testing._server import free_port
from tests.support import wait_for
from tests.test_cli_common import procs, run_cg

pytestmark = pytest.mark.timeout(90)


def probe(port: int, path: str) -> tuple[int, dict]:
    """(status, JSON body) of GET http://127.0.0.1:port/path; (0, {}) when nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except (ConnectionError, urllib.error.URLError):
        return 0, {}


async def aprobe(port: int, path: str) -> tuple[int, dict]:
    return await asyncio.to_thread(probe, port, path)


async def until(port: int, path: str, code: int, reason: str = "", timeout: float = 15) -> dict:
    """Wait until ``path`` answers ``code`` (and a reason containing ``reason``); its body."""
    seen: list[tuple[int, dict]] = []

    async def answered() -> bool:
        seen[:] = [await aprobe(port, path)]
        got, body = seen[0]
        return got == code and reason in body.get("reason", "")

    try:
        await wait_for(answered, timeout=timeout, interval=0.1, what=f"{path} {code} {reason}")
    except AssertionError as e:
        raise AssertionError(f"{e}; last answer: {seen}") from None
    return seen[0][1]


async def test_liveness_is_the_event_loops_and_readiness_needs_it():
    """A blocked event loop fails /healthz (and /readyz) while the probe thread still answers; a stop fails
    /readyz only; a path that is no probe is a 404 that names the probes."""
    ready = [True]
    health = Health(lambda: (ready[0], {"role": "test"} if ready[0] else {"reason": "told so"}), stale=0.3, beat=0.05)
    port = free_port()
    server = serve("127.0.0.1", port, health=health)
    try:
        code, body = await aprobe(port, "/healthz")
        assert (code, body) == (503, {"status": "fail", "reason": "not started"})
        health.start()
        assert await aprobe(port, "/readyz") == (200, {"status": "ok", "role": "test"})
        answers: list[tuple[int, dict]] = []
        poller = threading.Thread(target=lambda: [answers.append(probe(port, p)) or time.sleep(0.05)
                                                  for _ in range(20) for p in ("/healthz", "/readyz")])
        poller.start()
        time.sleep(1.2)   # the event loop blocked, as by a handler that never yields
        await asyncio.to_thread(poller.join)
        stalled = [body for code, body in answers if code == 503]
        assert stalled and all("the event loop has not turned for" in b["reason"] for b in stalled), answers
        await until(port, "/healthz", 200)
        ready[0] = False
        await until(port, "/readyz", 503, "told so")
        ready[0] = True
        await until(port, "/readyz", 200)
        health.stopping()
        assert await aprobe(port, "/readyz") == (503, {"status": "fail", "reason": "stopping"})
        assert (await aprobe(port, "/healthz"))[0] == 200
        code, body = await aprobe(port, "/metrics")
        assert code == 404 and "/healthz or /readyz" in body["reason"]
    finally:
        health.stop()
        server.shutdown()
    assert await aprobe(port, "/healthz") == (0, {})   # shut down: nothing listens


async def test_consume_probes_follow_the_server_the_membership_and_ctrl_c(fresh_server, uniq):
    """``cg elastic consume --metrics-listen``: ready as a standby, then pinned; not ready once dropped from
    the group, ready again once added; not ready while the server is down, ready again after; not ready
    (alive) while Ctrl-C drains the handler in flight; then the process exits 0."""
    import nats

    url = fresh_server.url
    nc = await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.*"]))
        await create_elastic(nc, uniq, "g", 2, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])
        await add_members(nc, uniq, "g", ["m1"])
        port = free_port()
        async with procs() as start:
            p = await start("elastic", "consume", uniq, "g", "m1", "--sleep", "1s", "--metrics-listen",
                            f"127.0.0.1:{port}", url=url)
            await p.wait_text("consuming...")
            body = await until(port, "/readyz", 200)
            assert body == {"status": "ok", "role": "standby", "member": "m1", "connected": True, "partitions": [0, 1]}
            await js.publish(f"{uniq}.a", b"1")
            await p.wait_text("acked")
            await wait_for(lambda: probe(port, "/readyz") == (200, {**body, "role": "pinned"}), what="pinned")

            (await run_cg("elastic", "drop", uniq, "g", "m1", url=url)).ok()
            await until(port, "/readyz", 503, "dropped from the group")
            (await run_cg("elastic", "add", uniq, "g", "m1", url=url)).ok()
            await until(port, "/readyz", 200)

            fresh_server.stop()
            body = await until(port, "/readyz", 503, "disconnected from the server")
            assert body["connected"] is False and (await aprobe(port, "/healthz"))[0] == 200
            fresh_server.restart()
            await until(port, "/readyz", 200, timeout=30)

            await wait_for(lambda: nc.is_connected, timeout=20, what="the test's connection back")
            await js.publish(f"{uniq}.b", b"2")
            await p.wait_output(lambda o: o.count("Processing for 1s") == 2, what="the second message in hand")
            p.signal(signal.SIGINT)
            await until(port, "/readyz", 503, "stopping", timeout=2)
            assert (await aprobe(port, "/healthz"))[0] == 200
            r = await p.wait(20)
        assert r.code == 0, r.err
        assert r.out.count("acked") == 2
        assert await aprobe(port, "/healthz") == (0, {})
    finally:
        await nc.close()

"""Health probes (pcgroups.ops._health): /healthz and /readyz of ``consume --metrics-listen`` and ``cg metrics``,
asked over real HTTP while the event loop blocks, the server goes down and comes back, the member is
dropped and added again, and the process is stopped."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time

import pytest
from nats.js.api import StreamConfig

from pcgroups import PartitioningFilter, add_members, create_elastic
from pcgroups.ops._health import Health, serve
from pcgroups.testing._server import free_port
from tests.helpers.cli import procs, run_cg
from tests.helpers.http import aprobe, probe, until
from tests.helpers.support import wait_for

pytestmark = pytest.mark.timeout(90)


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
        poller = threading.Thread(
            target=lambda: [
                answers.append(probe(port, p)) or time.sleep(0.05) for _ in range(20) for p in ("/healthz", "/readyz")
            ]
        )
        poller.start()
        time.sleep(1.2)  # the event loop blocked, as by a handler that never yields
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
    assert await aprobe(port, "/healthz") == (0, {})  # shut down: nothing listens


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
            p = await start(
                "elastic", "consume", uniq, "g", "m1", "--sleep", "1s", "--metrics-listen", f"127.0.0.1:{port}", url=url
            )
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


def _threads_and_cpu(pid: int) -> tuple[int, float]:
    """A process's threads and the CPU seconds it used so far (Linux /proc)."""
    with open(f"/proc/{pid}/status") as f:
        threads = int(next(line.split()[1] for line in f if line.startswith("Threads:")))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return threads, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _hold(port: int, n: int) -> list[socket.socket]:
    """``n`` connections to the port, each with the start of a request that never ends (a slow client); a connect
    that does not get through in 2 s is left out, and none is tried after 10 s."""
    held: list[socket.socket] = []
    deadline = time.monotonic() + 10
    while len(held) < n and time.monotonic() < deadline:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            continue
        held.append(s)
    return held


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
async def test_held_connections_cost_neither_the_probes_nor_the_reconnect(fresh_server, uniq, tmp_path):
    """A member limited to 128 descriptors: 300 connections opened to its --metrics-listen and held (nothing sent)
    keep its threads and descriptors bounded, it does not spin, /readyz answers, and after the server restarts the
    member reconnects (a descriptor for its connection is left)."""
    import resource

    import nats

    from tests.helpers.cli import cg_argv, cg_env

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    url = fresh_server.url
    async with await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.2) as nc:
        await nc.jetstream().add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.*"]))
        await create_elastic(nc, uniq, "g", 2, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])
        await add_members(nc, uniq, "g", ["m1"])
    port = free_port()
    with open(tmp_path / "err", "wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *cg_argv("elastic", "consume", uniq, "g", "m1", "--metrics-listen", f"127.0.0.1:{port}"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=err,
            env=cg_env(url),
            preexec_fn=limit,
        )
    held: list[socket.socket] = []
    try:
        await until(port, "/readyz", 200)
        held = await asyncio.to_thread(_hold, port, 300)
        await until(port, "/readyz", 200, timeout=20)
        threads, cpu = _threads_and_cpu(proc.pid)
        await asyncio.sleep(1.0)  # a window to measure the CPU the process uses while the connections are held
        threads2, cpu2 = _threads_and_cpu(proc.pid)
        assert max(threads, threads2) < 40 and cpu2 - cpu < 0.5, (threads, threads2, cpu2 - cpu)
        assert len(os.listdir(f"/proc/{proc.pid}/fd")) < 100
        fresh_server.stop()
        await until(port, "/readyz", 503, "disconnected from the server", timeout=20)
        fresh_server.restart()
        await until(port, "/readyz", 200, timeout=30)
    finally:
        for s in held:
            s.close()
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    assert proc.returncode is not None, (tmp_path / "err").read_text()


async def test_a_client_that_never_ends_its_request_holds_no_place_for_long(monkeypatch):
    """Two places, both taken by clients that never end their request: a probe closes the older one after GRACE and
    is answered; the other is closed after TIMEOUT; 50 probes at once are all answered, two at a time."""
    from pcgroups.ops import _health as module

    monkeypatch.setattr(module, "TIMEOUT", 1.0)
    h = Health(lambda: (True, {}))
    h.start()
    server = module.Listener("127.0.0.1", 0, module._app(h, None), max_connections=2)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_port
    try:
        slow = await asyncio.to_thread(_hold, port, 2)
        assert len(slow) == 2
        code, body = await aprobe(port, "/healthz")
        assert code == 200 and body["status"] == "ok"
        for s in slow:  # both closed by the listener: one for the probe, the other after TIMEOUT
            s.settimeout(3)
            assert await asyncio.to_thread(s.recv, 100) == b""
        answers = await asyncio.gather(*[aprobe(port, "/healthz") for _ in range(50)])
        assert [code for code, _ in answers] == [200] * 50
    finally:
        for s in slow:
            s.close()
        server.shutdown()
        h.stop()
    assert await aprobe(port, "/healthz") == (0, {})

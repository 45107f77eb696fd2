import nats

from pcgroups.server import EmbeddedServer


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

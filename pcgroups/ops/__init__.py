"""Operating groups: their live status, replay and skip, Prometheus metrics and health probes.

``_status`` is a group's state per partition (``cg ... status``); ``_offsets`` plans and applies a move of
a group's position (``cg ... reset``); ``_exporter`` turns the status into Prometheus metrics
(``cg metrics``); ``_metrics`` is a running instance's own; ``_health`` its ``/healthz`` and ``/readyz``.
``prometheus_client`` (the ``metrics`` extra) is imported only when metrics are made.
"""

from ._exporter import GroupsExporter
from ._health import Health, InstanceReadiness
from ._health import serve as serve_http
from ._metrics import InstanceMetrics
from ._offsets import MemberMove, ResetPlan, SourceMove, Target, execute_reset, plan_elastic_reset, plan_static_reset
from ._status import GroupStatus, MemberStatus, PartitionStatus, elastic_status, static_status

__all__ = [
    "GroupStatus",
    "GroupsExporter",
    "Health",
    "InstanceMetrics",
    "InstanceReadiness",
    "MemberMove",
    "MemberStatus",
    "PartitionStatus",
    "ResetPlan",
    "SourceMove",
    "Target",
    "elastic_status",
    "execute_reset",
    "plan_elastic_reset",
    "plan_static_reset",
    "serve_http",
    "static_status",
]

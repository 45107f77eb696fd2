"""Partitioned consumer groups on NATS JetStream, wire-compatible with orbit.go pcgroups v0.2.1."""

from .config import (ElasticConfig, MemberMapping, PartitioningFilter, StaticConfig, parse_elastic_config,
                     parse_mapping, parse_static_config, validate_name)
from .elastic import (ElasticSpec, add_members, add_source, create_elastic, delete_elastic, delete_member_mappings,
                      delete_members, elastic_consume, elastic_is_in_membership_and_active, elastic_member_step_down,
                      get_elastic_config, get_elastic_layout, list_elastic_active_members, list_elastic_groups,
                      remove_source, set_member_mappings, work_queue_name)
from .errors import (ConfigChangedError, ConfigError, ConsumerGoneError, GroupExistsError, JetStreamAPIError,
                     NotAMemberError, NotFoundError, PCGroupsError, PermissionDeniedError)
from .instance import ConsumerInstance
from .jsapi import ConsumerConfig, JetStreamApi
from .partitions import (balanced_assignment, elastic_member_filters, member_partitions, partition_filters,
                         partition_of_subject, static_member_filters, transform_destination)
from .scheduler import RetryPolicy, key_by_header, key_by_partitioning, key_by_subject, key_by_tokens
from .membership import AutoInstance, Lease, elastic_consume_auto, list_leases
from .delivery import Msg
from .sources import Layout, SourceStream, Start
from .sticky import sticky_assignment, sticky_change, sticky_mappings
from .static import (create_static, delete_static, get_static_config, list_static_active_members,
                     list_static_groups, static_consume, static_member_step_down)

__version__ = "0.1.0"

_MODULES = {"config", "elastic", "errors", "instance", "jsapi", "partitions", "session", "static", "store", "scheduler",
            "membership", "sticky", "sources", "permissions", "delivery"}
__all__ = [name for name in list(globals()) if not name.startswith("_") and name not in _MODULES]

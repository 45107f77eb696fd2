"""Partitioned consumer groups on NATS JetStream, wire-compatible with orbit.go pcgroups v0.2.1.

The public API is :data:`__all__`, written out (tests/test_public_api.py pins it). The package
imports nats-py and the library's own modules only: never Typer, rich, prompt-toolkit or ``cg``.
"""

from .config import (ElasticConfig, MemberMapping, PartitioningFilter, StaticConfig, parse_elastic_config,
                     parse_mapping, parse_static_config, validate_name)
from .delivery import Msg
from .elastic import (ElasticSpec, add_members, add_source, create_elastic, delete_elastic, delete_member_mappings,
                      delete_members, elastic_consume, elastic_is_in_membership_and_active, elastic_member_step_down,
                      get_elastic_config, get_elastic_layout, list_elastic_active_members, list_elastic_groups,
                      remove_source, set_member_mappings, work_queue_name)
from .errors import (ConfigChangedError, ConfigError, ConsumerGoneError, GroupExistsError, JetStreamAPIError,
                     NotAMemberError, NotFoundError, PCGroupsError, PermissionDeniedError)
from .events import InstanceEvent
from .instance import ConsumerInstance
from .jsapi import ConsumerConfig, JetStreamApi
from .membership import AutoInstance, Lease, elastic_consume_auto, list_leases
from .partitions import (balanced_assignment, elastic_member_filters, member_partitions, partition_filters,
                         partition_of_subject, static_member_filters, transform_destination)
from .scheduler import RetryPolicy, key_by_header, key_by_partitioning, key_by_subject, key_by_tokens
from .sources import Layout, SourceStream, Start
from .static import (create_static, delete_static, get_static_config, list_static_active_members,
                     list_static_groups, static_consume, static_member_step_down)
from .sticky import sticky_assignment, sticky_change, sticky_mappings

__version__ = "0.1.0"

__all__ = [
    "AutoInstance",
    "ConfigChangedError",
    "ConfigError",
    "ConsumerConfig",
    "ConsumerGoneError",
    "ConsumerInstance",
    "ElasticConfig",
    "ElasticSpec",
    "GroupExistsError",
    "InstanceEvent",
    "JetStreamAPIError",
    "JetStreamApi",
    "Layout",
    "Lease",
    "MemberMapping",
    "Msg",
    "NotAMemberError",
    "NotFoundError",
    "PCGroupsError",
    "PartitioningFilter",
    "PermissionDeniedError",
    "RetryPolicy",
    "SourceStream",
    "Start",
    "StaticConfig",
    "add_members",
    "add_source",
    "balanced_assignment",
    "create_elastic",
    "create_static",
    "delete_elastic",
    "delete_member_mappings",
    "delete_members",
    "delete_static",
    "elastic_consume",
    "elastic_consume_auto",
    "elastic_is_in_membership_and_active",
    "elastic_member_filters",
    "elastic_member_step_down",
    "get_elastic_config",
    "get_elastic_layout",
    "get_static_config",
    "key_by_header",
    "key_by_partitioning",
    "key_by_subject",
    "key_by_tokens",
    "list_elastic_active_members",
    "list_elastic_groups",
    "list_leases",
    "list_static_active_members",
    "list_static_groups",
    "member_partitions",
    "parse_elastic_config",
    "parse_mapping",
    "parse_static_config",
    "partition_filters",
    "partition_of_subject",
    "remove_source",
    "set_member_mappings",
    "static_consume",
    "static_member_filters",
    "static_member_step_down",
    "sticky_assignment",
    "sticky_change",
    "sticky_mappings",
    "transform_destination",
    "validate_name",
    "work_queue_name",
]

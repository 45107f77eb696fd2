"""Partitioned consumer groups on NATS JetStream, wire-compatible with orbit.go pcgroups v0.2.1.

The public API is :data:`__all__`, grouped below by task: entry points first, then what they return and
what a handler gets, each kind of group's admin functions, configs and partition helpers, errors. Each name
lives in a subpackage named by its job (docs/DESIGN.md, *Modules*): ``consume`` (running a member),
``static`` and ``elastic`` (the two kinds of group), ``pool`` (workers), ``jetstream`` (talking to
JetStream), ``ops`` (status, replay and skip, metrics, probes) and ``testing`` (embedded servers).
The package imports nats-py and its own modules only: never Typer, rich, prompt-toolkit or ``cg``.
"""

from . import _moved
from ._version import __version__ as __version__
from .config import (
    ElasticConfig,
    MemberMapping,
    PartitioningFilter,
    StaticConfig,
    parse_elastic_config,
    parse_mapping,
    parse_static_config,
    validate_name,
)
from .consume import (
    ConsumeContext,
    ConsumerInstance,
    Msg,
    RetryPolicy,
    key_by_header,
    key_by_partitioning,
    key_by_subject,
    key_by_tokens,
)
from .elastic import (
    AutoInstance,
    ElasticSpec,
    Layout,
    Lease,
    SourceStream,
    Start,
    add_members,
    add_source,
    create_elastic,
    delete_elastic,
    delete_member_mappings,
    delete_members,
    elastic_consume,
    elastic_is_in_membership_and_active,
    elastic_member_step_down,
    get_elastic_config,
    get_elastic_layout,
    list_elastic_active_members,
    list_elastic_groups,
    list_leases,
    remove_source,
    set_member_mappings,
    sticky_assignment,
    sticky_change,
    sticky_mappings,
    work_queue_name,
)
from .errors import (
    ConfigChangedError,
    ConfigError,
    ConsumerGoneError,
    GroupExistsError,
    JetStreamAPIError,
    NotAMemberError,
    NotFoundError,
    PCGroupsError,
    PermissionDeniedError,
    SupersededError,
)
from .events import InstanceEvent
from .jetstream import ConsumerConfig, JetStreamApi
from .partitions import (
    balanced_assignment,
    elastic_member_filters,
    member_partitions,
    partition_filters,
    partition_of_subject,
    static_member_filters,
    transform_destination,
)
from .pool import WorkerInstance, serve_worker
from .static import (
    create_static,
    delete_static,
    get_static_config,
    list_static_active_members,
    list_static_groups,
    static_consume,
    static_member_step_down,
)

_moved.install()

__all__ = [  # noqa: RUF022 - grouped by task, entry points first
    # Entry points: run a member instance, or a worker of a member that dispatches
    "static_consume",
    "elastic_consume",
    "serve_worker",
    # What they return, what they take, and what a handler gets
    "ConsumeContext",
    "ConsumerInstance",
    "AutoInstance",
    "WorkerInstance",
    "ConsumerConfig",
    "RetryPolicy",
    "key_by_subject",
    "key_by_tokens",
    "key_by_header",
    "key_by_partitioning",
    "Msg",
    "InstanceEvent",
    # Static groups
    "create_static",
    "delete_static",
    "get_static_config",
    "list_static_groups",
    "list_static_active_members",
    "static_member_step_down",
    # Elastic groups: the group, its members and mappings, its sources, automatic membership
    "create_elastic",
    "delete_elastic",
    "get_elastic_config",
    "get_elastic_layout",
    "list_elastic_groups",
    "list_elastic_active_members",
    "elastic_is_in_membership_and_active",
    "elastic_member_step_down",
    "add_members",
    "delete_members",
    "set_member_mappings",
    "delete_member_mappings",
    "add_source",
    "remove_source",
    "work_queue_name",
    "ElasticSpec",
    "Layout",
    "SourceStream",
    "Start",
    "Lease",
    "list_leases",
    # Configs, and the partition arithmetic on them (pure, no I/O)
    "StaticConfig",
    "ElasticConfig",
    "MemberMapping",
    "PartitioningFilter",
    "parse_static_config",
    "parse_elastic_config",
    "parse_mapping",
    "validate_name",
    "balanced_assignment",
    "member_partitions",
    "partition_filters",
    "partition_of_subject",
    "static_member_filters",
    "elastic_member_filters",
    "transform_destination",
    "sticky_assignment",
    "sticky_change",
    "sticky_mappings",
    # Errors
    "PCGroupsError",
    "ConfigError",
    "ConfigChangedError",
    "ConsumerGoneError",
    "GroupExistsError",
    "NotAMemberError",
    "NotFoundError",
    "PermissionDeniedError",
    "SupersededError",
    "JetStreamAPIError",
    # JetStream requests the library sends (priority groups, pinned pulls), for tools built beside it
    "JetStreamApi",
]

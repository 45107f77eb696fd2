"""Partitioned consumer groups on NATS JetStream, wire-compatible with orbit.go pcgroups v0.2.1.

Every public name is importable from here (``from pcgroups import elastic_consume``); each is imported
from its module on first use (PEP 562), so a program that needs one module (``cg static ls``:
``pcgroups.static``) does not pay for the others (``pcgroups.elastic``, ``membership``, ``sources``...).

The public API is :data:`__all__`, the names of ``_EXPORTS`` (tests/test_public_api.py pins the list);
``dir(pcgroups)`` is that list and ``__version__``, and the module binds no other public name (its own
imports are private). The package imports nats-py and the library's own modules only: never Typer,
rich, prompt-toolkit or ``cg``.
"""

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

#: module -> the public names it gives the package
_EXPORTS: dict[str, tuple[str, ...]] = {
    "config": ("ElasticConfig", "MemberMapping", "PartitioningFilter", "StaticConfig", "parse_elastic_config",
               "parse_mapping", "parse_static_config", "validate_name"),
    "elastic": ("ElasticSpec", "add_members", "add_source", "create_elastic", "delete_elastic",
                "delete_member_mappings", "delete_members", "elastic_is_in_membership_and_active",
                "elastic_member_step_down", "get_elastic_config", "get_elastic_layout", "list_elastic_active_members",
                "list_elastic_groups", "remove_source", "set_member_mappings", "work_queue_name"),
    "elastic_instance": ("elastic_consume",),
    "events": ("InstanceEvent",),
    "errors": ("ConfigChangedError", "ConfigError", "ConsumerGoneError", "GroupExistsError", "JetStreamAPIError",
               "NotAMemberError", "NotFoundError", "PCGroupsError", "PermissionDeniedError", "SupersededError"),
    "instance": ("ConsumerInstance",),
    "loop": ("ConsumeContext",),
    "jsapi": ("ConsumerConfig", "JetStreamApi"),
    "partitions": ("balanced_assignment", "elastic_member_filters", "member_partitions", "partition_filters",
                   "partition_of_subject", "static_member_filters", "transform_destination"),
    "scheduler": ("RetryPolicy", "key_by_header", "key_by_partitioning", "key_by_subject", "key_by_tokens"),
    "membership": ("AutoInstance", "Lease", "list_leases"),
    "delivery": ("Msg",),
    "sources": ("Layout", "SourceStream", "Start"),
    "sticky": ("sticky_assignment", "sticky_change", "sticky_mappings"),
    "worker": ("WorkerInstance", "serve_worker"),
    "static": ("create_static", "delete_static", "get_static_config", "list_static_active_members",
               "list_static_groups", "static_consume", "static_member_step_down"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

#: the public API, written out (the names of _EXPORTS, sorted)
__all__ = [
    "AutoInstance", "ConfigChangedError", "ConfigError", "ConsumeContext", "ConsumerConfig", "ConsumerGoneError",
    "ConsumerInstance", "ElasticConfig", "ElasticSpec", "GroupExistsError", "InstanceEvent", "JetStreamAPIError",
    "JetStreamApi", "Layout", "Lease", "MemberMapping", "Msg", "NotAMemberError", "NotFoundError", "PCGroupsError",
    "PartitioningFilter", "PermissionDeniedError", "RetryPolicy", "SourceStream", "Start", "StaticConfig",
    "SupersededError", "WorkerInstance", "add_members", "add_source", "balanced_assignment", "create_elastic",
    "create_static", "delete_elastic", "delete_member_mappings", "delete_members", "delete_static", "elastic_consume",
    "elastic_is_in_membership_and_active", "elastic_member_filters", "elastic_member_step_down", "get_elastic_config",
    "get_elastic_layout", "get_static_config", "key_by_header", "key_by_partitioning", "key_by_subject",
    "key_by_tokens", "list_elastic_active_members", "list_elastic_groups", "list_leases",
    "list_static_active_members", "list_static_groups", "member_partitions", "parse_elastic_config", "parse_mapping",
    "parse_static_config", "partition_filters", "partition_of_subject", "remove_source", "serve_worker",
    "set_member_mappings", "static_consume", "static_member_filters", "static_member_step_down", "sticky_assignment",
    "sticky_change", "sticky_mappings", "transform_destination", "validate_name", "work_queue_name",
]


def __dir__() -> list[str]:
    """The public names (``__all__``) and ``__version__``."""
    return sorted([*__all__, "__version__"])


if not _typing.TYPE_CHECKING:  # hidden from type checkers: a misspelt name is an error there, not Any
    def __getattr__(name: str) -> object:
        """A public name from its module, or a submodule (``pcgroups.elastic``), imported on first use."""
        module = _MODULE_OF.get(name)
        if module is not None:
            return getattr(_importlib.import_module(f".{module}", __name__), name)
        try:
            return _importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise  # the submodule exists and failed to import
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
else:  # what type checkers and IDEs see: the same names, imported eagerly
    from .config import (ElasticConfig, MemberMapping, PartitioningFilter, StaticConfig, parse_elastic_config,
                         parse_mapping, parse_static_config, validate_name)
    from .delivery import Msg
    from .elastic import (ElasticSpec, add_members, add_source, create_elastic, delete_elastic,
                          delete_member_mappings, delete_members, elastic_is_in_membership_and_active,
                          elastic_member_step_down, get_elastic_config, get_elastic_layout,
                          list_elastic_active_members, list_elastic_groups, remove_source, set_member_mappings)
    from .elastic_instance import elastic_consume
    from .errors import (ConfigChangedError, ConfigError, ConsumerGoneError, GroupExistsError, JetStreamAPIError,
                         NotAMemberError, NotFoundError, PCGroupsError, PermissionDeniedError, SupersededError)
    from .events import InstanceEvent
    from .flavour import work_queue_name
    from .instance import ConsumerInstance
    from .jsapi import ConsumerConfig, JetStreamApi
    from .loop import ConsumeContext
    from .membership import AutoInstance, Lease, list_leases
    from .partitions import (balanced_assignment, elastic_member_filters, member_partitions, partition_filters,
                             partition_of_subject, static_member_filters, transform_destination)
    from .scheduler import RetryPolicy, key_by_header, key_by_partitioning, key_by_subject, key_by_tokens
    from .sources import Layout, SourceStream, Start
    from .static import (create_static, delete_static, get_static_config, list_static_active_members,
                         list_static_groups, static_consume, static_member_step_down)
    from .sticky import sticky_assignment, sticky_change, sticky_mappings
    from .worker import WorkerInstance, serve_worker

"""Elastic groups: any stream, sourced into a work queue ``<stream>-<group>``; members change at will.

``_admin`` creates and changes them (members, mappings, sources: ``_sources``); ``_instance`` runs a
member (:func:`elastic_consume`); ``_membership`` and ``_sticky`` are automatic membership (leases,
sticky assignment); ``_intake`` finds a source stuck on one origin message and steps past it.
"""

from typing import TYPE_CHECKING

from .._moved import fallback
from ..flavour import work_queue_name
from ._admin import (
    ElasticSpec,
    add_members,
    add_source,
    create_elastic,
    delete_elastic,
    delete_member_mappings,
    delete_members,
    elastic_is_in_membership_and_active,
    elastic_member_step_down,
    get_elastic_config,
    get_elastic_layout,
    list_elastic_active_members,
    list_elastic_groups,
    remove_source,
    set_member_mappings,
)
from ._instance import ElasticInstance, elastic_consume
from ._intake import GapWatch, SkipResult, SourceGap, StuckSource, intake_of, skip_stuck, stuck_sources
from ._membership import LEASE_BUCKET, AutoInstance, Lease, auto_member_name, list_leases
from ._sources import Layout, SourceStream, Start
from ._sticky import sticky_assignment, sticky_change, sticky_mappings

__all__ = [
    "LEASE_BUCKET",
    "AutoInstance",
    "ElasticInstance",
    "ElasticSpec",
    "GapWatch",
    "Layout",
    "Lease",
    "SkipResult",
    "SourceGap",
    "SourceStream",
    "Start",
    "StuckSource",
    "add_members",
    "add_source",
    "auto_member_name",
    "create_elastic",
    "delete_elastic",
    "delete_member_mappings",
    "delete_members",
    "elastic_consume",
    "elastic_is_in_membership_and_active",
    "elastic_member_step_down",
    "get_elastic_config",
    "get_elastic_layout",
    "intake_of",
    "list_elastic_active_members",
    "list_elastic_groups",
    "list_leases",
    "remove_source",
    "set_member_mappings",
    "skip_stuck",
    "sticky_assignment",
    "sticky_change",
    "sticky_mappings",
    "stuck_sources",
    "work_queue_name",
]

if not TYPE_CHECKING:  # a misspelt name stays an error for type checkers
    __getattr__ = fallback(__name__, f"{__name__}._admin")

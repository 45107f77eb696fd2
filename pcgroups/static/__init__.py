"""Static groups: the partition is already the stream's first subject token; fixed membership.

``_admin`` creates, reads, lists and deletes them (the reference's functions); ``_instance`` runs a member
(:func:`static_consume`, a :class:`StaticInstance`).
"""

from typing import TYPE_CHECKING

from .._moved import fallback
from ._admin import (
    create_static,
    create_static_consumers,
    delete_static,
    get_static_config,
    list_static_active_members,
    list_static_groups,
    static_member_step_down,
)
from ._instance import StaticInstance, static_consume

__all__ = [
    "StaticInstance",
    "create_static",
    "create_static_consumers",
    "delete_static",
    "get_static_config",
    "list_static_active_members",
    "list_static_groups",
    "static_consume",
    "static_member_step_down",
]

if not TYPE_CHECKING:  # a misspelt name stays an error for type checkers
    __getattr__ = fallback(__name__, f"{__name__}._admin")

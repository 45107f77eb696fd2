"""The worker pool: a dispatching member instance hands its messages to workers in other processes.

``_wire`` is the contract between them (core NATS subjects under ``$PCG.POOL.<flavour>.<stream>.<group>``),
``_dispatcher`` the dispatching side (a keyed dispatcher whose calls run on workers), ``_worker`` the
worker (:func:`serve_worker`). docs/DESIGN.md, *The worker pool*, states what holds.
"""

from typing import TYPE_CHECKING

from .._moved import fallback
from ._dispatcher import PoolDispatcher, PoolSpec, pool_status
from ._wire import check_worker_name
from ._worker import WorkerInstance, default_worker_name, serve_worker

__all__ = [
    "PoolDispatcher",
    "PoolSpec",
    "WorkerInstance",
    "check_worker_name",
    "default_worker_name",
    "pool_status",
    "serve_worker",
]

if not TYPE_CHECKING:  # a misspelt name stays an error for type checkers
    __getattr__ = fallback(__name__, f"{__name__}._wire")

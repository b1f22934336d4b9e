"""Unified resources (Primus §1.1): executor pools, their metrics and the scaling policies.

* :mod:`.pool` -- the :class:`ExecutorPool` contract every backend implements, :class:`Resources`,
  :class:`ExecutorStatus`.

The cluster layer is engine: it imports no Dagster (``dagster_defs`` wraps a pool and its policy
in a resource).
"""

from primus_dagster.cluster.pool import (
    FINISHED_STATES,
    ExecutorPool,
    ExecutorState,
    ExecutorStatus,
    PoolError,
    Resources,
    Role,
    memory_bytes,
    memory_quantity,
)

__all__ = [
    "FINISHED_STATES",
    "ExecutorPool",
    "ExecutorState",
    "ExecutorStatus",
    "PoolError",
    "Resources",
    "Role",
    "memory_bytes",
    "memory_quantity",
]

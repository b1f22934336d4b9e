"""Unified resources (Primus §1.1): executor pools, their metrics and the scaling policies.

* :mod:`.pool` -- the :class:`ExecutorPool` contract every backend implements, :class:`Resources`,
  :class:`ExecutorStatus`.
* :mod:`.metrics` -- executor :class:`Sample` s, bounded per-executor series, pool utilisations.
* :mod:`.policies` -- the scaling policies as pure functions; every decision a :class:`ScalingDecision`.
* :mod:`.controller` -- :class:`ScalingController`: samples and statuses in, one strategy's decisions per tick out.
* :mod:`.simulation` -- simulated pools and load models driven by the same controller (``bench/scaling_sim.py``).
* :mod:`.local` -- :class:`~.local.LocalPool`, executors as local processes; :mod:`.kubernetes` -- as pods.
* :mod:`.supervisor` -- restart policies, OOM memory bumps, the node blacklist.
* :mod:`.pooled_plane` -- :class:`~.pooled_plane.PooledDataPlane`: the driver + a supervised, scaled data pool;
  :mod:`.autoscaler` feeds it the controller's decisions; :mod:`.backends` picks the pool by ``pools.backend``.

The cluster layer is engine: it imports no Dagster (``dagster_defs`` wraps a pool and its policy
in a resource).
"""

from primus_dagster.cluster.controller import ControllerOptions, PoolView, ScalingController, apply_decision
from primus_dagster.cluster.metrics import (
    METRIC_NAMES,
    ExecutorSeries,
    MetricsStore,
    Sample,
    aggregate,
    sample_from_heartbeat,
)
from primus_dagster.cluster.policies import (
    RatioRule,
    ScalingDecision,
    ew_demand,
    ew_update,
    horizontal_decision,
    load_metric,
    oom_memory,
    oom_restart_decision,
    ratio_decision,
    vertical_allocation,
    weighted_load,
)
from primus_dagster.cluster.pool import (
    FINISHED_STATES,
    ExecutorPool,
    ExecutorState,
    ExecutorStatus,
    PoolError,
    ResizeNotApplied,
    Resources,
    Role,
    memory_bytes,
    memory_quantity,
)
from primus_dagster.cluster.simulation import (
    STARTUP_S,
    DiurnalTrace,
    PartitionedLoad,
    PulledLoad,
    RampTrace,
    SimulatedPool,
    Simulation,
    SimulationResult,
    SpikeTrace,
    StepTrace,
)

__all__ = [
    "FINISHED_STATES",
    "METRIC_NAMES",
    "STARTUP_S",
    "ControllerOptions",
    "DiurnalTrace",
    "ExecutorPool",
    "ExecutorSeries",
    "ExecutorState",
    "ExecutorStatus",
    "MetricsStore",
    "PartitionedLoad",
    "PoolError",
    "PoolView",
    "PulledLoad",
    "RampTrace",
    "RatioRule",
    "ResizeNotApplied",
    "Resources",
    "Role",
    "Sample",
    "ScalingController",
    "ScalingDecision",
    "SimulatedPool",
    "Simulation",
    "SimulationResult",
    "SpikeTrace",
    "StepTrace",
    "aggregate",
    "apply_decision",
    "ew_demand",
    "ew_update",
    "horizontal_decision",
    "load_metric",
    "memory_bytes",
    "memory_quantity",
    "oom_memory",
    "oom_restart_decision",
    "ratio_decision",
    "sample_from_heartbeat",
    "vertical_allocation",
    "weighted_load",
]

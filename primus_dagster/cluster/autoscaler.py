"""The live autoscaler of a data plane: heartbeats in, the controller's decisions applied to the pool.

Each control tick of a :class:`~primus_dagster.cluster.pooled_plane.PooledDataPlane`, a
:class:`DataPoolAutoscaler` turns the data executors' heartbeat metrics (``cpu``, ``rss_bytes``,
``buffer_fill``, ``rows_per_s``, see ``DataExecutor.metrics``) into controller samples, gives the
:class:`~primus_dagster.cluster.controller.ScalingController` the pool's statuses, and applies the
decisions it returns (:func:`~primus_dagster.cluster.controller.apply_decision`): scale out, scale in
(a stopped executor's leased tasks are read again elsewhere; the claim ledger keeps delivery exactly
once), resize. OOM restarts are left to the plane's supervisor. Every decision is logged with its
inputs and kept for the run's summary and metrics.

Example::

    scaler = DataPoolAutoscaler(job)
    with PooledDataPlane("job.yaml", "/data", tasks, token=token, controller=scaler) as plane:
        ...
    scaler.summary()          # {"actions": {"scale_out": 1, "scale_in": 1}, "decisions": [...], ...}
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from primus_dagster.cluster.controller import ControllerOptions, ScalingController, apply_decision
from primus_dagster.cluster.metrics import sample_from_heartbeat
from primus_dagster.cluster.policies import ScalingDecision
from primus_dagster.spec import JobSpec

if TYPE_CHECKING:
    from primus_dagster.cluster.pooled_plane import PooledDataPlane

log = logging.getLogger(__name__)


class DataPoolAutoscaler:
    """Scales a plane's data pool with the job's ``scaling`` policies (see the module docstring).

    ``on_decision`` is called with every applied decision (the training asset logs them to the run).
    """

    def __init__(
        self,
        job: JobSpec,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_decision: Callable[[ScalingDecision], None] | None = None,
        options: ControllerOptions | None = None,
    ):
        # The supervisor restarts OOM-killed executors; local CPU is whole cores (affinity).
        options = options or ControllerOptions(oom_restarts=False, cpu_quantum=1.0)
        self.controller = ScalingController(job.scaling, {"data": job.pools.data}, clock, options=options)
        self.on_decision = on_decision
        self.applied: list[ScalingDecision] = []

    def control(self, plane: PooledDataPlane, now: float) -> None:
        """One tick: observe, decide, apply (called by the plane's control thread)."""
        if plane.pool is None:
            return
        statuses = plane.pool.status()
        allocated = {s.executor_id: s.resources for s in statuses if not s.finished}
        for executor_id, report in plane.driver.executors().items():
            if executor_id in allocated and report.metrics:
                sample = sample_from_heartbeat(executor_id, "data", report.metrics, allocated[executor_id], now=now)
                self.controller.observe(sample)
        for decision in self.controller.tick(now, {"data": statuses}):
            log.info("scaling: %s", decision.describe())
            apply_decision({"data": plane.pool}, decision)
            self.applied.append(decision)
            if self.on_decision is not None:
                self.on_decision(decision)

    def summary(self) -> dict[str, Any]:
        """The controller's summary plus the decisions applied here (JSON-able)."""
        return {**self.controller.summary(), "applied": [d.as_dict() for d in self.applied]}

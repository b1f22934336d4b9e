"""Scaling policies (Primus §1.1), pure functions: horizontal, the data/training ratio rule, vertical, OOM.

* **Horizontal** (:func:`horizontal_decision`): load ``L_u = Σ w_k u_k / Σ w_k`` over the pool's
  utilisations (:func:`load_metric`; weights are normalised, so ``[1, 1]`` and ``[0.5, 0.5]`` mean
  the same); above ``scale_up_threshold`` add ``step`` executors, below ``scale_down_threshold``
  remove ``step`` -- unless the load projected onto the smaller pool, ``L_u · n / (n − step)``,
  would reach ``scale_up_threshold`` (that scale-in would be undone next time) -- always within
  ``[min_replicas, max_replicas]``.
* **Ratio** (:func:`ratio_decision`): trainers waiting on an empty reader queue → more data
  executors, unless no task waits for one (``pending_tasks`` 0: a new executor would have nothing
  to read); full data buffers do not stop it (executors then serve slower than the trainers take:
  more executors, more streams); data buffers full while trainers never wait → more
  trainers if the training pool may grow, else fewer data executors. Proportional: trainers
  waiting a fraction ``w`` want ``1 / (1 − w)`` times what the running executors serve (``w`` at
  most 0.5: at most doubling per step); fewer data executors go to the proportional load target.
* **Vertical** (:func:`ew_demand`, :func:`ew_update`, :func:`vertical_allocation`): demand is an
  exponentially weighted history (weight ratio ``history_decay`` between consecutive samples, the
  newest weighs most); the new allocation is ``demand × (1 + headroom)``, skipped when
  ``|new − current| / current < min_change`` (R_Θ).
* **OOM** (:func:`oom_memory`, :func:`oom_restart_decision`): an OOM-killed executor comes back with
  its memory × ``oom_memory_factor``, up to a cap.

Every decision is a :class:`ScalingDecision`: what to do, why, and the inputs that led to it.
``docs/scaling.md`` has the formulas and the reasoning.

Example::

    spec = ScalingSpec().horizontal
    load = load_metric({"cpu": 0.95, "memory": 0.5}, spec.metrics)   # buffer_fill not reported
    decision = horizontal_decision("data", replicas=4, load=load, spec=spec, pool=PoolSpec(max_replicas=8))
    decision.kind, decision.delta                                       # ("scale_out", 1)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from primus_dagster.cluster.pool import ExecutorStatus, Resources, Role
from primus_dagster.spec import MetricSpec, PoolSpec
from primus_dagster.spec.job import HorizontalScalingSpec

DecisionKind = Literal["scale_out", "scale_in", "resize", "oom_restart"]
Strategy = Literal["horizontal", "vertical", "failover"]
_STRATEGY: dict[str, Strategy] = {
    "scale_out": "horizontal",
    "scale_in": "horizontal",
    "resize": "vertical",
    "oom_restart": "failover",
}


@dataclass(frozen=True)
class ScalingDecision:
    """One action on one pool and why. ``scale_out``: launch ``delta`` executors with ``new``
    resources; ``scale_in``: stop ``executor_ids`` (``delta`` is minus their count); ``resize``:
    give ``executor_ids[0]`` ``new`` instead of ``old``; ``oom_restart``: restart the OOM-killed
    ``executor_ids[0]`` with ``new``. ``inputs``: the numbers the rule saw (loads, thresholds, ...).

    Example::

        d = ScalingDecision("scale_out", "data", "L_u 0.91 > 0.8", delta=1, inputs={"load": 0.91})
        d.strategy, d.as_dict()["kind"]       # ("horizontal", "scale_out")
    """

    kind: DecisionKind
    role: Role
    reason: str
    time: float = 0.0
    delta: int = 0
    executor_ids: tuple[str, ...] = ()
    old: Resources | None = None
    new: Resources | None = None
    replicas: int | None = None  # the pool's live executors when decided
    inputs: Mapping[str, float] = field(default_factory=dict)

    @property
    def strategy(self) -> Strategy:
        return _STRATEGY[self.kind]

    @property
    def target(self) -> int | None:
        """Replicas after a horizontal decision."""
        return None if self.replicas is None else self.replicas + self.delta

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able dict (for logs and run metadata)."""
        out: dict[str, Any] = {"time": self.time, "kind": self.kind, "role": self.role, "reason": self.reason}
        if self.delta:
            out["delta"] = self.delta
        if self.replicas is not None:
            out["replicas"] = self.replicas
        if self.executor_ids:
            out["executor_ids"] = list(self.executor_ids)
        for name in ("old", "new"):
            res = getattr(self, name)
            if res is not None:
                out[name] = {"cpu": res.cpu, "memory_bytes": res.memory_bytes}
        out["inputs"] = {k: round(float(v), 6) for k, v in self.inputs.items()}
        return out

    def describe(self) -> str:
        """One log line."""
        who = (
            f" {','.join(self.executor_ids[:3])}{'…' if len(self.executor_ids) > 3 else ''}"
            if self.executor_ids
            else ""
        )
        size = ""
        if self.new is not None:
            size = f" -> {self.new.cpu:g} cpu, {self.new.memory_bytes >> 20} MiB"
        return f"{self.role} pool: {self.kind} {self.delta:+d}{who}{size} ({self.reason})"


# --------------------------------------------------------------------------------------- horizontal
def weighted_load(terms: Iterable[tuple[float, float | None]]) -> float | None:
    """``Σ w_k u_k / Σ w_k`` over ``(w_k, u_k)`` pairs with a value and a positive weight; None when
    there are none (no signal: nothing to decide on).

    >>> weighted_load([(2.0, 0.9), (1.0, 0.3), (5.0, None)])
    0.7
    """
    total = weight = 0.0
    for w, u in terms:
        if u is None or w <= 0:
            continue
        total += w * u
        weight += w
    return None if weight == 0 else round(total / weight, 12)


def load_metric(utilisations: Mapping[str, float | None], metrics: Sequence[MetricSpec]) -> float | None:
    """``L_u`` of :func:`weighted_load` with ``u_k = utilisations[name_k]``: a metric a pool does not
    report (a trainer's ``buffer_fill``) drops out with its weight.

    >>> from primus_dagster.spec import MetricSpec
    >>> load_metric({"cpu": 0.9, "memory": 0.3}, [MetricSpec(name="cpu", weight=2), MetricSpec(name="memory", weight=1)])
    0.7
    """
    return weighted_load((m.weight, utilisations.get(m.name)) for m in metrics)


#: How far below ``scale_up_threshold`` a proportional step aims (so it is not undone next tick).
TARGET_MARGIN = 0.05


def proportional_target(running: int, load: float, scale_up_threshold: float) -> int:
    """Executors that would carry ``load`` (measured on ``running`` executors) at the target
    utilisation ``scale_up_threshold − TARGET_MARGIN``: ``ceil(running · load / target)``.

    >>> proportional_target(10, 0.95, 0.8), proportional_target(10, 0.2, 0.8)
    (13, 3)
    """
    target = max(scale_up_threshold - TARGET_MARGIN, 1e-3)
    return max(0, math.ceil(running * load / target - 1e-9))


def horizontal_decision(
    role: Role,
    replicas: int,
    load: float | None,
    spec: HorizontalScalingSpec,
    pool: PoolSpec,
    *,
    now: float = 0.0,
    inputs: Mapping[str, float] | None = None,
    running: int | None = None,
    allow_scale_in: bool = True,
    allow_scale_out: bool = True,
) -> ScalingDecision | None:
    """The horizontal rule of the module docstring for one pool of ``replicas`` live executors
    (``running`` of them running, default all) with load ``load`` (None: no signal, only the bounds
    are enforced). ``allow_scale_in`` False: never remove (trainers wait on this pool);
    ``allow_scale_out`` False: never add (the pool is ahead: its buffers are full).
    ``scale_in`` decisions carry no executor ids yet: the caller picks which to stop."""
    facts = {**(inputs or {}), "replicas": float(replicas)}
    running = replicas if running is None else running
    if load is not None:
        facts["load"] = load
    if replicas < pool.min_replicas:
        return _scale(
            role, replicas, pool.min_replicas - replicas, f"below min_replicas {pool.min_replicas}", now, facts
        )
    if replicas > pool.max_replicas:
        return _scale(
            role, replicas, pool.max_replicas - replicas, f"above max_replicas {pool.max_replicas}", now, facts
        )
    if load is None:
        return None
    facts |= {"scale_up_threshold": spec.scale_up_threshold, "scale_down_threshold": spec.scale_down_threshold}
    if allow_scale_out and load > spec.scale_up_threshold and replicas < pool.max_replicas:
        delta = spec.step
        if spec.proportional:
            need = proportional_target(running, load, spec.scale_up_threshold) - replicas
            if need <= 0:
                return None  # the executors still starting carry it
            delta = max(spec.step, need)
        delta = min(delta, pool.max_replicas - replicas)
        return _scale(role, replicas, delta, f"L_u {load:.3f} > {spec.scale_up_threshold}", now, facts)
    if allow_scale_in and load < spec.scale_down_threshold and replicas > pool.min_replicas:
        delta = spec.step
        if spec.proportional:
            keep = max(pool.min_replicas, proportional_target(running, load, spec.scale_up_threshold))
            delta = max(spec.step, replicas - keep)
        delta = min(delta, replicas - pool.min_replicas)
        projected = load * replicas / (replicas - delta)
        facts["projected_load"] = projected
        if projected >= spec.scale_up_threshold:
            return None
        return _scale(role, replicas, -delta, f"L_u {load:.3f} < {spec.scale_down_threshold}", now, facts)
    return None


def _scale(role: Role, replicas: int, delta: int, reason: str, now: float, inputs: dict[str, float]) -> ScalingDecision:
    kind: DecisionKind = "scale_out" if delta > 0 else "scale_in"
    return ScalingDecision(kind, role, reason, now, delta=delta, replicas=replicas, inputs=inputs)


@dataclass(frozen=True)
class RatioRule:
    """Thresholds of the data/training ratio rule: trainers "wait" at a mean reader-wait fraction
    of ``wait_high`` or more and "never wait" at ``wait_low`` or less; data buffers are "full" at a
    mean fill of ``fill_full`` or more.

    Example::

        ratio_decision(buffer_fill=1.0, trainer_wait=0.0, data_replicas=10, training_replicas=2,
                       data_pool=job.pools.data, training_pool=job.pools.training, step=1,
                       scale_up_threshold=0.8, rule=RatioRule(fill_full=0.95))
    """

    wait_high: float = 0.10
    wait_low: float = 0.02
    fill_full: float = 0.90
    scale_in_margin: float = 0.05


def ratio_decision(
    *,
    buffer_fill: float | None,
    trainer_wait: float | None,
    data_replicas: int,
    training_replicas: int,
    data_pool: PoolSpec,
    training_pool: PoolSpec,
    step: int,
    scale_up_threshold: float,
    data_load: float | None = None,
    rule: RatioRule = RatioRule(),
    now: float = 0.0,
    proportional: bool = False,
    data_running: int | None = None,
    pending_tasks: int | None = None,
) -> ScalingDecision | None:
    """The data/training ratio rule (module docstring). ``buffer_fill``: the data executors' mean
    buffer fill; ``trainer_wait``: the trainers' mean reader-wait fraction (None: unknown, nothing
    is decided). Removing data executors is skipped when the data pool's load ``data_load``,
    projected onto the smaller pool, would reach ``scale_up_threshold``. ``proportional``: steps
    sized from the measurement (``data_running``: the data executors running, default all).
    ``pending_tasks``: tasks no executor has leased yet (None: unknown or unbounded, a stream)."""
    if buffer_fill is None or trainer_wait is None:
        return None
    running = data_replicas if data_running is None else data_running
    facts = {
        "buffer_fill": buffer_fill,
        "trainer_wait": trainer_wait,
        "data_replicas": float(data_replicas),
        "training_replicas": float(training_replicas),
    }
    if trainer_wait >= rule.wait_high:
        if pending_tasks is not None:
            facts["pending_tasks"] = float(pending_tasks)
        if data_replicas >= data_pool.max_replicas or pending_tasks == 0:
            return None
        delta = step
        if proportional:
            need = math.ceil(running / (1.0 - min(trainer_wait, 0.5)) - 1e-9) - data_replicas
            if need <= 0:
                return None  # the executors still starting carry it
            delta = max(step, need)
        delta = min(delta, data_pool.max_replicas - data_replicas)
        reason = f"trainers wait {trainer_wait:.2f} of the time on data buffers {buffer_fill:.2f} full"
        return _scale("data", data_replicas, delta, reason, now, facts)
    if trainer_wait <= rule.wait_low and buffer_fill >= rule.fill_full:
        reason = f"data buffers {buffer_fill:.2f} full, trainers wait {trainer_wait:.2f}"
        if training_replicas < training_pool.max_replicas:
            delta = min(step, training_pool.max_replicas - training_replicas)
            return _scale("training", training_replicas, delta, reason + ": more trainers", now, facts)
        if data_replicas > data_pool.min_replicas:
            delta = step
            if proportional and data_load is not None:
                keep = max(data_pool.min_replicas, proportional_target(running, data_load, scale_up_threshold))
                if keep >= data_replicas:
                    return None
                delta = data_replicas - keep
            delta = min(delta, data_replicas - data_pool.min_replicas)
            if data_load is not None:
                facts["data_load"] = data_load
                facts["projected_load"] = data_load * data_replicas / (data_replicas - delta)
                if facts["projected_load"] >= scale_up_threshold - rule.scale_in_margin + 1e-9:
                    return None
            return _scale("data", data_replicas, -delta, reason + ": fewer data executors", now, facts)
    return None


# ----------------------------------------------------------------------------------------- vertical
def ew_demand(history: Sequence[float] | np.ndarray, decay: float) -> float:
    """Demand D(N_R) from a history of observed use, oldest first: ``Σ d^(n−1−i) x_i / Σ d^(n−1−i)``
    (``d`` = ``history_decay``: each sample weighs ``d`` times the one after it).

    >>> ew_demand([1.0, 1.0, 4.0], 0.5)   # weights 0.25, 0.5, 1
    2.7142857142857144
    """
    values = np.asarray(history, dtype=float)
    if values.size == 0:
        raise ValueError("no history to predict demand from")
    weights = decay ** np.arange(values.size - 1, -1, -1, dtype=float)
    return float((weights * values).sum() / weights.sum())


def ew_update(
    numerator: np.ndarray, denominator: np.ndarray, value: np.ndarray, decay: float
) -> tuple[np.ndarray, np.ndarray]:
    """One more sample into the running form of :func:`ew_demand` (vectorised over executors):
    ``numerator / denominator`` after the update equals ``ew_demand`` of the whole history."""
    return numerator * decay + value, denominator * decay + 1.0


def vertical_allocation(
    demand: np.ndarray | float,
    current: np.ndarray | float,
    *,
    headroom: float,
    min_change: float,
    floor: np.ndarray | float,
    cap: np.ndarray | float,
    quantum: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``(new, changed)``: ``new = demand × (1 + headroom)`` rounded up to ``quantum`` and clipped to
    ``[floor, cap]``; ``changed`` where ``|new − current| / current >= min_change`` (R_Θ), else
    ``new`` is ``current``. Vectorised over executors (scalars work too).

    >>> new, changed = vertical_allocation(np.array([2.0, 3.5]), np.array([4.0, 4.0]), headroom=0.2,
    ...                                    min_change=0.1, floor=0.1, cap=16.0, quantum=0.1)
    >>> new.tolist(), changed.tolist()
    ([2.4, 4.0], [True, False])
    """
    demand = np.asarray(demand, dtype=float)
    current = np.broadcast_to(np.asarray(current, dtype=float), demand.shape)
    # The small epsilon keeps float noise (2.4000000001 / 0.1) from rounding a whole quantum up.
    target = np.round(np.ceil(demand * (1.0 + headroom) / quantum - 1e-9) * quantum, 9)
    target = np.clip(target, floor, np.maximum(cap, floor))
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = np.abs(target - current) / current
    changed = np.where(current > 0, relative >= min_change, target > 0) & (target != current)
    return np.where(changed, target, current), changed


# ---------------------------------------------------------------------------------------------- OOM
def oom_memory(memory_bytes: int, factor: float, cap: int) -> int:
    """Memory of an OOM-killed executor's next attempt: ``memory × factor``, at most ``cap`` (never
    below what it had).

    >>> oom_memory(2 << 30, 1.5, 8 << 30) >> 20, oom_memory(6 << 30, 1.5, 8 << 30) >> 20
    (3072, 8192)
    """
    return max(memory_bytes, min(cap, int(memory_bytes * factor)))


def oom_restart_decision(
    status: ExecutorStatus, pool: PoolSpec, cap: int, *, now: float = 0.0
) -> ScalingDecision | None:
    """Restart an ``oom_killed`` executor with :func:`oom_memory` (``pool.oom_memory_factor``, up to
    ``cap``) -- unless the pool's ``restart`` policy is ``never`` or the executor has had its
    ``max_restarts`` (then the job fails: the supervisor's call, not this one)."""
    if status.state != "oom_killed" or pool.restart == "never" or status.attempt >= pool.max_restarts:
        return None
    old = status.resources
    grown = oom_memory(old.memory_bytes, pool.oom_memory_factor, cap)
    return ScalingDecision(
        "oom_restart",
        status.role,
        f"OOM-killed at {old.memory_bytes >> 20} MiB: memory x{pool.oom_memory_factor:g} -> {grown >> 20} MiB",
        now,
        executor_ids=(status.executor_id,),
        old=old,
        new=Resources(old.cpu, grown),
        inputs={"attempt": float(status.attempt), "oom_memory_factor": pool.oom_memory_factor, "cap": float(cap)},
    )

"""How much memory a trainer needs, and whether its tables are sharded: :func:`plan_memory` (pure).

A trainer holds its model's embedding tables, their optimiser state (lazy Adam: two moments a row, 3x the
table; ``row_wise_adagrad``: one value a row), the dense parameters and the process itself. With
``training.sharding: row_wise`` every trainer of a group of N holds ``ceil(rows / N)`` rows of each table
and their state; ``replicated`` every row; a resume reads a checkpoint's tables one at a time
(``torch.distributed.checkpoint`` loads a stored table whole, then copies it in), so a trainer also needs
room for twice its largest table; ``auto`` (the default) shards a group's tables once a replicated
trainer would not fit ``pools.training.memory``, or its tables and state would take more than
:data:`AUTO_SHARD_FRACTION` of it. A plan that does
not fit ``pools.training.memory`` is refused before training (:class:`MemoryPlanError`), naming the
sharding and the group size that would fit.

Example::

    plan = plan_memory(job.training, job.pools.training, layout)
    plan.sharding, plan.per_trainer_bytes, plan.line()
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from primus_dagster.spec.job import PoolSpec, TrainingSpec
from primus_dagster.training.features import FeatureLayout

#: Bytes of a trainer process before its model: the interpreter, torch, Arrow, the reader, its batches
#: (a rank of a small model, with room for its buffers; bench/scale.py reports the RSS it measures).
PROCESS_BYTES = 576 << 20
#: ``auto`` shards when the replicated tables and their state would take more than this share of a trainer.
AUTO_SHARD_FRACTION = 0.5

Sharding = Literal["replicated", "row_wise"]


class MemoryPlanError(ValueError):
    """The model does not fit ``pools.training.memory`` as planned; the message names the fix."""


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


@dataclass(frozen=True)
class MemoryPlan:
    """A trainer's memory, planned: the ``sharding`` it trains with, its tables and their optimiser state,
    the rest, and why that sharding."""

    sharding: Sharding
    trainers: int
    table_bytes: int  # per trainer
    state_bytes: int  # per trainer: the tables' optimiser state
    other_bytes: int  # the process, the dense parameters and a restore's read of its largest table
    limit_bytes: int
    why: str

    @property
    def per_trainer_bytes(self) -> int:
        return self.table_bytes + self.state_bytes + self.other_bytes

    def line(self) -> str:
        """One line for the run log and ``validate``."""
        return (
            f"memory per trainer: {_gib(self.per_trainer_bytes)} of pools.training.memory {_gib(self.limit_bytes)} "
            f"(tables {_gib(self.table_bytes)}, their optimiser state {_gib(self.state_bytes)}, the rest "
            f"{_gib(self.other_bytes)}); sharding {self.sharding} over {self.trainers} trainer(s): {self.why}"
        )


def table_rows(layout: FeatureLayout, spec: TrainingSpec) -> list[tuple[int, int]]:
    """``(rows, dim)`` of every built-in table the model holds: the layout's tables, once per tower that
    embeds them (MTRM: its built-in memory and adapt towers; a team's tower or module: its own, not counted)."""
    model = spec.model
    if model.type == "custom":
        return []
    towers = 1 if model.type == "single" else sum(1 for t in (model.memory, model.adapt) if t is None)
    return [shape for shape in layout.tables.values() for _ in range(towers)]


def _state_per_value(spec: TrainingSpec, dim: int) -> float:
    """Optimiser values a table value carries."""
    return 1.0 / dim if spec.embedding_optimizer == "row_wise_adagrad" else 2.0


def _restore_bytes(tables: list[tuple[int, int]], shards: int) -> int:
    """A restore's transient: the largest table a trainer holds, read whole and then copied in."""
    return 2 * 4 * max((math.ceil(rows / shards) * dim for rows, dim in tables), default=0)


def _bytes(spec: TrainingSpec, tables: list[tuple[int, int]], shards: int) -> tuple[int, int]:
    values = [math.ceil(rows / shards) * dim for rows, dim in tables]
    table = 4 * sum(values)
    state = int(4 * sum(v * _state_per_value(spec, dim) for v, (_, dim) in zip(values, tables, strict=True)))
    return table, state


def plan_memory(spec: TrainingSpec, pool: PoolSpec, layout: FeatureLayout, *, limit_bytes: int) -> MemoryPlan:
    """The plan of ``spec``'s model on ``layout`` for ``pool.replicas`` trainers of ``limit_bytes`` each
    (module docstring); :class:`MemoryPlanError` when it does not fit, naming what would."""
    trainers = max(1, pool.replicas)
    tables = table_rows(layout, spec)
    other = PROCESS_BYTES + 8 * layout.n_dense * 1024  # the dense parameters are small next to the tables
    replicated = _bytes(spec, tables, 1)
    asked = spec.sharding
    replicated_need = sum(replicated) + other + _restore_bytes(tables, 1)
    if asked == "auto":
        if trainers > 1 and replicated_need > limit_bytes:
            sharding: Sharding = "row_wise"
            why = f"auto: a replicated trainer would need {_gib(replicated_need)}"
        elif trainers > 1 and sum(replicated) > AUTO_SHARD_FRACTION * limit_bytes:
            sharding = "row_wise"
            why = f"auto: replicated tables and state ({_gib(sum(replicated))}) over half a trainer's memory"
        else:
            sharding = "replicated"
            why = "auto: one trainer" if trainers == 1 else "auto: the tables are small next to a trainer's memory"
    else:
        sharding = "replicated" if trainers == 1 else asked
        why = "training.sharding" if trainers > 1 else "one trainer holds every row"
    shards = trainers if sharding == "row_wise" else 1
    table, state = _bytes(spec, tables, shards)
    plan = MemoryPlan(sharding, trainers, table, state, other + _restore_bytes(tables, shards), limit_bytes, why)
    if plan.per_trainer_bytes > limit_bytes:
        raise MemoryPlanError(f"the model does not fit: {plan.line()}; {_fix(spec, tables, other, limit_bytes)}")
    return plan


def _fix(spec: TrainingSpec, tables: list[tuple[int, int]], other: int, limit_bytes: int) -> str:
    """What would fit: the smallest group that shards the tables into the memory, or more memory."""
    for group in range(2, 1025):
        need = sum(_bytes(spec, tables, group)) + other + _restore_bytes(tables, group)
        if need <= limit_bytes:
            return (
                f"set training.sharding: row_wise (or auto) with pools.training.replicas: {group} (and "
                f"max_replicas >= {group}; {_gib(need)} per trainer), or raise pools.training.memory"
            )
    need = sum(_bytes(spec, tables, 1)) + other + _restore_bytes(tables, 1)
    return f"raise pools.training.memory to at least {_gib(need)}, or shrink the tables"

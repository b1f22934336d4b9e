"""The trainers' memory, planned before training: ``auto`` shards only tables that would crowd a trainer
or not fit it replicated, a
model that does not fit is refused naming the group that would, row-wise Adagrad's state is one value a row."""

from __future__ import annotations

import pytest

from primus_dagster.spec.job import PoolSpec, TrainingSpec
from primus_dagster.training.features import FeatureLayout
from primus_dagster.training.memory_plan import PROCESS_BYTES, MemoryPlanError, plan_memory

GIB = 2**30


def _plan(replicas: int, buckets: int, *, model: str = "single", **training: object):
    spec = TrainingSpec(mode="mixed", model={"type": model, "hash_buckets": buckets, "embedding_dim": 16}, **training)
    layout = FeatureLayout.plain(spec.model, 3, 2)
    pool = PoolSpec(replicas=replicas, max_replicas=max(replicas, 1))
    return plan_memory(spec, pool, layout, limit_bytes=2 * GIB)


def test_auto_keeps_small_tables_whole_and_shards_large_ones() -> None:
    small = _plan(2, 100_000)
    assert (
        small.sharding == "replicated"
        and small.table_bytes == 4 * 100_000 * 16
        and small.state_bytes == 2 * small.table_bytes
    )
    large = _plan(2, 8_000_000)  # 0.48 GiB of table and 0.95 GiB of Adam state: over half a trainer replicated
    assert large.sharding == "row_wise" and large.table_bytes == 4 * 4_000_000 * 16
    assert large.per_trainer_bytes == large.table_bytes * 3 + large.other_bytes and large.other_bytes > PROCESS_BYTES
    assert "sharding row_wise over 2 trainer(s)" in large.line()
    assert _plan(2, 100_000, sharding="row_wise").sharding == "row_wise"  # asked for
    assert _plan(1, 100_000, sharding="row_wise").sharding == "replicated"  # one trainer holds every row


def test_a_model_that_does_not_fit_names_the_group_that_would() -> None:
    with pytest.raises(
        MemoryPlanError, match=r"does not fit: memory per trainer: 2\.95 GiB .*pools\.training\.replicas: 2 "
    ):
        _plan(1, 8_000_000)
    with pytest.raises(MemoryPlanError, match=r"sharding replicated over 2 trainer\(s\): training.sharding"):
        _plan(2, 8_000_000, sharding="replicated")
    assert _plan(2, 8_000_000).sharding == "row_wise"  # auto: fits as row_wise on 2


def test_auto_shards_tables_under_half_a_trainer_when_a_replicated_one_would_not_fit() -> None:
    """Tables and state of 0.89 GiB (under half of 2 GiB) with the process and a restore's read on top do not
    fit a replicated trainer: auto shards them, saying why."""
    plan = _plan(2, 5_000_000)
    assert plan.sharding == "row_wise" and "auto: a replicated trainer would need" in plan.why
    with pytest.raises(MemoryPlanError, match="row_wise"):
        _plan(2, 5_000_000, sharding="replicated")


def test_mtrm_holds_its_tables_once_a_tower_and_row_wise_adagrad_one_value_a_row() -> None:
    assert _plan(1, 100_000, model="mtrm").table_bytes == 2 * 4 * 100_000 * 16
    adagrad = _plan(1, 100_000, embedding_optimizer="row_wise_adagrad")
    assert adagrad.state_bytes == 4 * 100_000

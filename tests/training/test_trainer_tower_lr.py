"""Per-tower learning rates: ``training.model.memory_lr_scale`` speeds up MTRM's memory tower only."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from test_trainer import SMALL, batch

from primus_dagster.spec.job import ModelSpec, TrainingSpec
from primus_dagster.training.models import build_model
from primus_dagster.training.trainer import RecOptimizer, Trainer


def test_memory_lr_scale_is_validated_and_only_for_mtrm() -> None:
    assert ModelSpec(type="mtrm").memory_lr_scale == 1.0
    single = ModelSpec(type="single")  # the default is harmless: single has no memory tower
    assert ModelSpec.model_validate_json(single.model_dump_json()) == single  # specs travel as JSON (DDP ranks)
    with pytest.raises(ValidationError, match="memory_lr_scale applies to the MTRM"):
        ModelSpec(type="single", memory_lr_scale=3.0)
    for bad in (0.0, -1.0, 101.0):
        with pytest.raises(ValidationError, match="memory_lr_scale"):
            ModelSpec(type="mtrm", memory_lr_scale=bad)


def step_deltas(kind: str, **model: float) -> dict[str, torch.Tensor]:
    """Parameter changes of one Adam step on a ``kind`` batch of a small MTRM with the ``model`` keys."""
    spec = TrainingSpec(mode="mixed", batch_size=64, learning_rate=1e-3, model=ModelSpec(**model, **SMALL))
    trainer = Trainer(build_model(spec.model, 3, 2, seed=4), spec)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train_step(batch(kind))
    return {n: p.detach() - before[n] for n, p in trainer.model.named_parameters()}


def test_the_memory_tower_steps_scale_times_further_and_the_adapt_tower_not_at_all() -> None:
    # the paper's split (adapt_batch_weight 0): a batch step trains the memory tower alone
    one = step_deltas("batch", memory_lr_scale=1.0, adapt_batch_weight=0.0)
    three = step_deltas("batch", memory_lr_scale=3.0, adapt_batch_weight=0.0)
    memory = [n for n in one if n.startswith("memory.")]
    assert memory and all(bool(one[n].abs().sum() > 0) for n in memory)
    for name in memory:  # Adam's first step is lr x g / (|g| + eps): linear in the rate
        torch.testing.assert_close(three[name], 3.0 * one[name], rtol=1e-4, atol=1e-9)
    assert all(not bool(d.any()) for n, d in three.items() if n.startswith("adapt."))
    # a stream step trains the adapt tower alone, at the base rate whatever the memory scale
    one, three = step_deltas("stream", memory_lr_scale=1.0), step_deltas("stream", memory_lr_scale=3.0)
    for name, delta in one.items():
        assert torch.equal(three[name], delta), name


def test_optimizer_groups_per_rate_and_a_checkpoint_round_trip() -> None:
    single = RecOptimizer(build_model(ModelSpec(type="single", **SMALL), 3, 2), lr=1e-3)
    assert [len(p.param_groups) for p in single.parts.values()] == [1, 1]
    model = build_model(ModelSpec(memory_lr_scale=2.5, **SMALL), 3, 2)
    opt = RecOptimizer(model, lr=1e-3)
    assert {g["lr"] for p in opt.parts.values() for g in p.param_groups} == {1e-3, 2.5e-3}
    spec = TrainingSpec(mode="mixed", batch_size=64, learning_rate=1e-3, model=model.spec)
    trainer = Trainer(model, spec)
    trainer.train_step(batch("batch"))
    restored = Trainer(build_model(model.spec, 3, 2), spec)
    restored.restore(*trainer.state(), step=1, samples=64)
    assert sorted(g["lr"] for g in restored.optimizer.parts["sparse"].param_groups) == [1e-3, 2.5e-3]

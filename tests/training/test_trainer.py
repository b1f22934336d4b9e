"""The trainer's optimiser: lazy SparseAdam for sparse embedding tables, Adam for the rest."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from primus_dagster.data import Batch
from primus_dagster.spec.job import ModelSpec, TrainingSpec
from primus_dagster.training.models import HashedEmbedding, build_model
from primus_dagster.training.trainer import RecOptimizer, Trainer

SMALL = {"embedding_dim": 4, "hash_buckets": 512, "memory_hidden": [8], "adapt_hidden": [8]}


def batch(kind: str, rows: int = 64) -> Batch:
    g = torch.Generator().manual_seed(1)
    dense = torch.randn(rows, 3, generator=g).numpy().ravel()
    sparse = torch.randint(0, 40, (rows, 2), generator=g).numpy()
    label = (torch.rand(rows, generator=g) < 0.3).float().numpy()
    columns = pa.record_batch(
        {
            "ts": pa.array(np.zeros(rows, dtype="int64"), pa.timestamp("us", "UTC")),
            "label": label,
            "dense": pa.FixedSizeListArray.from_arrays(pa.array(dense), 3),
            "a": sparse[:, 0],
            "b": sparse[:, 1],
        }
    )
    return Batch.from_arrow(columns, kind=kind)


def test_a_step_updates_only_the_embedding_rows_its_batch_touched() -> None:
    spec = TrainingSpec(mode="mixed", batch_size=32, model=ModelSpec(type="single", **SMALL))
    trainer = Trainer(build_model(spec.model, 3, 2), spec)
    assert set(trainer.optimizer.parts) == {"dense", "sparse"}
    embedding = next(m for m in trainer.model.modules() if isinstance(m, HashedEmbedding))
    before = embedding.table.weight.detach().clone()
    feats = batch("stream", rows=32)
    trainer.train_step(feats)
    changed = (embedding.table.weight.detach() != before).any(dim=1).nonzero().flatten()
    touched = embedding.bucket_ids(feats.sparse).unique()
    assert set(changed.tolist()) == set(touched.tolist())
    assert trainer.step == 1 and trainer.counters.samples == 32


def test_a_dense_model_uses_adam_only_and_states_do_not_mix() -> None:
    dense_spec = ModelSpec(type="mtrm", sparse_embeddings=False, **SMALL)
    dense = RecOptimizer(build_model(dense_spec, 3, 2), lr=1e-3)
    assert set(dense.parts) == {"dense"}
    sparse = RecOptimizer(build_model(ModelSpec(type="mtrm", **SMALL), 3, 2), lr=1e-3)
    with pytest.raises(ValueError, match="sparse_embeddings changed"):
        sparse.load_state_dict(dense.state_dict())


def test_trainer_cuts_a_reader_batch_into_micro_batches_and_restores_counters() -> None:
    spec = TrainingSpec(mode="mixed", batch_size=20, model=ModelSpec(type="mtrm", **SMALL))
    trainer = Trainer(build_model(spec.model, 3, 2), spec)
    assert trainer.train(batch("batch", rows=50)) == 3  # 20 + 20 + 10 rows
    assert trainer.train(batch("stream", rows=20)) == 1
    stats = trainer.stats()
    assert (stats["step"], stats["samples"], stats["samples_batch"], stats["samples_stream"]) == (4, 70, 50, 20)
    model_state, optimizer_state = trainer.state()
    again = Trainer(build_model(spec.model, 3, 2, seed=5), spec)
    again.restore(model_state, optimizer_state, step=4, samples=70, samples_by_kind={"batch": 50, "stream": 20})
    assert all(torch.equal(a, b) for a, b in zip(again.model.state_dict().values(), model_state.values(), strict=True))
    assert again.stats()["samples_stream"] == 20


def test_row_wise_adagrad_keeps_one_value_a_row_and_updates_only_the_touched_rows() -> None:
    from primus_dagster.training.trainer import RowWiseAdagrad

    table = torch.nn.Embedding(10, 4, sparse=True)
    before = table.weight.detach().clone()
    opt = RowWiseAdagrad([table.weight], lr=0.1)
    ids = torch.tensor([1, 3, 3])
    (table(ids) * torch.arange(4.0)).sum().backward()
    opt.step()
    state = opt.state[table.weight]
    assert state["sum"].shape == (10,) and state["step"] == 1
    grad = torch.zeros(10, 4)
    grad[1], grad[3] = torch.arange(4.0), 2 * torch.arange(4.0)
    expected_sum = grad.pow(2).mean(1)
    assert torch.allclose(state["sum"], expected_sum)
    expected = before - 0.1 * grad / (expected_sum.sqrt() + 1e-8).unsqueeze(1)
    touched = torch.tensor([1, 3])
    assert torch.allclose(table.weight.detach()[touched], expected[touched])
    untouched = torch.tensor([0, 2, 4, 5, 6, 7, 8, 9])
    assert torch.equal(table.weight.detach()[untouched], before[untouched])
    trainer = Trainer(
        build_model(ModelSpec(type="single", **SMALL), 3, 2),
        TrainingSpec(embedding_optimizer="row_wise_adagrad", model=ModelSpec(type="single", **SMALL)),
    )
    assert type(trainer.optimizer.parts["sparse"]).__name__ == "RowWiseAdagrad"

"""Building models: the default spec's shapes and summary, deterministic seeded building."""

from __future__ import annotations

import pytest
import torch

from primus_dagster.spec.job import ModelSpec
from primus_dagster.training.models import MTRM, build_model, model_summary

SMALL = dict(embedding_dim=4, hash_buckets=997, memory_hidden=[16, 8], adapt_hidden=[16, 8])


def inputs(b: int = 32, n_dense: int = 3, n_sparse: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, n_dense, generator=g), torch.randint(-1000, 1000, (b, n_sparse), generator=g)


def test_default_spec_shapes_and_summary() -> None:
    model = build_model(ModelSpec(), n_dense=13, n_sparse=5)
    assert isinstance(model, MTRM)
    dense, sparse = inputs(8, 13, 5)
    state = model.memory_state(dense, sparse)
    assert state.shape == (8, 32 + 5 * 16)  # h_mem ++ the memory tower's 5 embeddings
    assert torch.equal(state[:, 32:], model.memory.embedding(sparse))  # they are its own embeddings
    summary = model_summary(model)
    assert summary["type"] == "mtrm" and summary["params"] == summary["memory_params"] + summary["adapt_params"]
    assert summary["memory_params"] > 100_000 * 16  # its own embedding table
    single = model_summary(build_model(ModelSpec(type="single"), 13, 5))
    assert single["type"] == "single" and single["params"] > 100_000 * 16


@pytest.mark.parametrize("kind", ["single", "mtrm"])
def test_build_is_deterministic_and_leaves_global_rng_alone(kind: str) -> None:
    spec = ModelSpec(type=kind, **SMALL)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a, b, c = build_model(spec, 3, 2, seed=7), build_model(spec, 3, 2, seed=7), build_model(spec, 3, 2, seed=8)
    assert torch.equal(torch.rand(3), expected)  # building did not consume the global generator
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)

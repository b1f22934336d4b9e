"""A TorchRec model (``examples/models/torchrec_ebc.py``, ``training.model.type: custom``) on two ranks with
``training.sharding: row_wise``: TorchRec's ``DistributedModelParallel`` shards its tables over the group's
gloo process group (CPU), the run log names the plan per table, every sample is trained once (the batch
phase and the stream phase, whose ranks take their rows back from the batch phase's sharded checkpoint),
and the logged model is whole: it loads and scores without ``torch.distributed``. A rank that fails after a
checkpoint resumes on two ranks with each sample trained once across the attempts."""

from __future__ import annotations

import functools
import json
import logging
from collections import Counter
from pathlib import Path

import pytest
import torch
from jobkit import EXAMPLE_MODELS, expected_ids, make_job, skip_without_torchrec
from rankkit import fail_at

from primus_dagster.data import Batch, Jagged
from primus_dagster.spec import load_job_spec
from primus_dagster.training.phase_trainer import TrainerFailedError
from primus_dagster.training.run_state import RunHooks, TrainingRequest
from primus_dagster.training.window import train_window

pytestmark = pytest.mark.integration

POOL = "replicas: 2, min_replicas: 2, max_replicas: 2, restart: never"


def _job(root: Path, hours: int = 3) -> dict:
    skip_without_torchrec("torchrec_ebc")
    factory, params, _ = EXAMPLE_MODELS["torchrec_ebc"]
    model = f"{{type: custom, factory: '{factory}', params: {json.dumps(params)}, hash_buckets: 4096}}"
    training = "sharding: row_wise\nembedding_optimizer: row_wise_adagrad"
    env = make_job(root, mode="mixed", model_block=model, every=6, hours=hours, extra_training=training)
    text = env["job_path"].read_text()
    env["job_path"].write_text(text.replace("training: {replicas: 1}", f"training: {{{POOL}}}"))
    env["job"] = load_job_spec(env["job_path"])
    return env


def _attempt(env: dict, hooks: dict | None = None) -> tuple[list[tuple[int, list[int]]], object]:
    """One attempt of the run: the (round, sample ids) of every trained reader batch, and the result or error."""
    trained: list[tuple[int, list[int]]] = []

    def on_batch(step: int, batch: Batch, trainer: int) -> None:
        trained.append((step, batch.sample_id.tolist()))

    request = TrainingRequest(env["job"], env["job_path"], env["root"], env["window"], executors=2)
    try:
        return trained, train_window(request, RunHooks(on_batch=on_batch, **(hooks or {})))
    except TrainerFailedError as exc:
        return trained, exc


def _load_and_score(model_uri: str, tracking_uri: str) -> torch.Tensor:
    import mlflow
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection

    from primus_dagster.training.tracking import use_tracking_uri

    with use_tracking_uri(tracking_uri):
        model = mlflow.pytorch.load_model(model_uri).eval()
    assert not dist.is_initialized()
    (ebc,) = [m for m in model.modules() if isinstance(m, EmbeddingBagCollection)]
    assert all(bag.weight.shape[0] == 4096 for bag in ebc.embedding_bags.values())  # whole tables
    g = torch.Generator().manual_seed(0)
    lists = {
        n: Jagged(torch.randint(0, 2**40, (6,), generator=g), torch.tensor([0, 2, 2, 5, 6])) for n in model.list_names
    }
    with torch.no_grad():
        dense = torch.randn(4, model.n_dense, generator=g)
        return torch.sigmoid(model.predict(dense, torch.randint(0, 2**40, (4, model.n_sparse), generator=g), lists))


def test_a_torchrec_model_trains_under_dmp_on_two_ranks_each_sample_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = _job(tmp_path)
    caplog.set_level(logging.INFO, logger="primus_dagster")
    trained, result = _attempt(env)
    assert not isinstance(result, Exception), result
    plan = [r.getMessage() for r in caplog.records if "DistributedModelParallel sharded" in r.getMessage()]
    # one line per table and phase (each phase's ranks shard the model they build)
    assert plan and all(": row_wise (fused) over ranks [0, 1]" in line for line in plan), plan
    assert any("rank 1: rows 2048-4096" in line for line in plan), plan
    assert Counter(i for _, ids in trained for i in ids) == expected_ids(env)  # each sample once
    assert result.stats["trainers"] == 2
    scores = _load_and_score(result.model_uri, env["job"].tracking.tracking_uri)
    assert scores.shape == (4,) and bool(((scores > 0) & (scores < 1)).all())


def test_a_failed_rank_resumes_from_the_dmp_checkpoint_each_sample_once(tmp_path: Path) -> None:
    env = _job(tmp_path, hours=2)
    first, failed = _attempt(env, {"rank_hook": functools.partial(fail_at, 1, 9, None)})
    assert isinstance(failed, TrainerFailedError) and "injected failure of rank 1 at round 9" in str(failed)
    import mlflow

    client = mlflow.MlflowClient(env["job"].tracking.tracking_uri)
    run = client.search_runs([client.get_experiment_by_name("train-test").experiment_id])[0]
    logged = sorted(int(a.path.rsplit("-", 1)[1]) for a in client.list_artifacts(run.info.run_id, "checkpoints"))
    assert logged and logged[-1] < 9
    kept = Counter(i for step, ids in first if step <= logged[-1] for i in ids)
    after, result = _attempt(env)
    assert not isinstance(result, Exception), result
    assert result.resumed_from_step == logged[-1]
    assert kept + Counter(i for _, ids in after for i in ids) == expected_ids(env)

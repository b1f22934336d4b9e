"""Row-wise sharded tables (``training.sharding: row_wise``): two in-memory ranks, each holding half of every
table's rows and of their Adam state, train exactly as two replicated ranks do -- the dense parameters equal,
each table put together from its shards equal to a replica's -- and a table's rows are where the placement
says."""

from __future__ import annotations

import functools
import pickle
import signal
import sys
from collections import Counter
from pathlib import Path

import mlflow
import pytest
import torch
from jobkit import expected_ids, make_job
from rankkit import expect_address, fail_at, kill_at, run_ddp_in_memory

from primus_dagster.data import Batch
from primus_dagster.devtools.model_load import load_and_score
from primus_dagster.spec import load_job_spec
from primus_dagster.spec.job import ModelSpec, TrainingSpec
from primus_dagster.training.models import HashedEmbedding, TablePlacement, build_model, placed, shard_rows
from primus_dagster.training.phase_trainer import TrainerFailedError
from primus_dagster.training.rank_group import RankGroup
from primus_dagster.training.run_state import RunHooks, TrainingRequest
from primus_dagster.training.tracking import use_tracking_uri
from primus_dagster.training.window import train_window

pytestmark = pytest.mark.integration

SPEC = TrainingSpec(
    mode="mixed",
    batch_size=64,
    model={"type": "mtrm", "embedding_dim": 4, "hash_buckets": 501, "memory_hidden": [8], "adapt_hidden": [8]},
)


def _shards(tmp_path: Path, kinds: tuple[str, ...]) -> list[str]:
    torch.manual_seed(0)
    paths = []
    for rank, rank_kinds in enumerate(kinds):
        shard = [
            Batch.from_tensors(
                torch.randn(64, 3), torch.randint(-(10**9), 10**9, (64, 2)), (torch.rand(64) < 0.3).float(), kind=k
            )
            for k in rank_kinds.split()
        ]
        paths.append(str(tmp_path / f"{rank}.pt"))
        Path(paths[-1]).write_bytes(pickle.dumps(shard))
    return paths


def test_a_table_holds_its_ranks_rows_with_the_values_one_trainer_starts_from() -> None:
    whole = build_model(ModelSpec(type="single", hash_buckets=1000, embedding_dim=4), 3, 2, seed=5)
    parts = []
    for rank in range(3):
        shard = build_model(
            ModelSpec(type="single", hash_buckets=1000, embedding_dim=4),
            3,
            2,
            seed=5,
            placement=TablePlacement(rank, 3),
        )
        table = next(m for m in shard.modules() if isinstance(m, HashedEmbedding))
        assert table.sharded and (table.row_start, table.row_end) == shard_rows(1000, 3, rank) == (
            rank * 334,
            min(1000, rank * 334 + 334),
        )
        parts.append(table.table.weight.detach())
    table = next(m for m in whole.modules() if isinstance(m, HashedEmbedding))
    assert not table.sharded and torch.equal(torch.cat(parts), table.table.weight.detach())
    sharded = build_model(SPEC.model, 3, 2, placement=TablePlacement(0, 2))
    with pytest.raises(RuntimeError, match="its rows were not fetched"):
        next(m for m in sharded.modules() if isinstance(m, HashedEmbedding))(torch.zeros(1, 2, dtype=torch.int64))
    with placed(TablePlacement(1, 2)):  # what build_model(placement=...) does around the model's construction
        assert HashedEmbedding(2, 100, 4, sparse=True).row_start == 50


@pytest.mark.parametrize("optimizer", ["adam", "row_wise_adagrad"])
def test_two_sharded_ranks_train_as_two_replicated_ones(tmp_path: Path, optimizer: str) -> None:
    paths = _shards(tmp_path, ("batch stream batch stream", "batch batch stream stream"))
    spec = SPEC.model_copy(update={"embedding_optimizer": optimizer})
    states = {}
    for exchange in ("row_sparse", "row_wise"):
        out = tmp_path / exchange
        out.mkdir()
        results = run_ddp_in_memory(paths, spec, warmup_steps=1, exchange=exchange, states_dir=str(out))  # type: ignore[arg-type]
        assert [r.steps for r in results] == [4, 4]  # the timed rounds (after one warm-up round)
        states[exchange] = [torch.load(out / f"{rank}.pt") for rank in range(2)]
    replica, (first, second) = states["row_sparse"][0], states["row_wise"]
    assert set(replica) == set(first)
    # equal but for the last bits: a window's row gradients are summed by the presence-mask path of
    # row_sparse.row_sums (a window has no more rows than lookups), a whole table's here by the sort
    for name, value in replica.items():
        if name.endswith("table.weight"):
            assert first[name].shape[0] + second[name].shape[0] == value.shape[0]
            torch.testing.assert_close(torch.cat([first[name], second[name]]), value, rtol=1e-5, atol=1e-7)
        else:
            torch.testing.assert_close(first[name], value, rtol=1e-5, atol=1e-7)
            assert torch.equal(first[name], second[name]), name  # the ranks' dense parameters are one


def _group(root: Path, pool: str, *, every: int = 5, optimizer: str = "adam") -> dict:
    training = f"sharding: row_wise\nembedding_optimizer: {optimizer}"
    env = make_job(root, mode="mixed", model="mtrm", every=every, extra_training=training)
    text = env["job_path"].read_text()
    assert text.count("training: {replicas: 1}") == 1
    env["job_path"].write_text(text.replace("training: {replicas: 1}", f"training: {{{pool}}}"))
    env["job"] = load_job_spec(env["job_path"])
    return env


def _attempt(
    env: dict, pool: str, hooks: dict | None = None, hosts: tuple[str, ...] | None = None
) -> tuple[list[tuple[int, list[int]]], object]:
    """One attempt of the run (the job spec's pool set to ``pool``; ``hosts``: a rank group on these addresses,
    default the spec's trainer): the (round, sample ids) of every trained reader batch, and the result or the
    error."""
    text = env["job_path"].read_text()
    start = text.index("training: {", text.index("pools:"))
    env["job_path"].write_text(text[:start] + f"training: {{{pool}}}" + text[text.index("}", start) + 1 :])
    env["job"] = load_job_spec(env["job_path"])
    trained: list[tuple[int, list[int]]] = []

    def on_batch(step: int, batch: Batch, trainer: int) -> None:
        trained.append((step, batch.sample_id.tolist()))

    request = TrainingRequest(env["job"], env["job_path"], env["root"], env["window"], executors=2)
    run_hooks = RunHooks(on_batch=on_batch, **(hooks or {}))
    group = RankGroup(run_hooks, len(hosts), hosts) if hosts else None
    try:
        return trained, train_window(request, run_hooks, trainer=group)
    except TrainerFailedError as exc:
        return trained, exc


@pytest.mark.parametrize(("resume_on", "optimizer"), [("replicas: 1", "adam"), ("replicas: 3", "row_wise_adagrad")])
def test_a_sharded_checkpoint_resumes_on_another_group_size_exactly_once(
    tmp_path: Path, resume_on: str, optimizer: str
) -> None:
    """Two ranks hold half of every table each; one fails after the first checkpoint; the same run started
    again on one trainer (every row) or three ranks (a third each: the shards reshard) goes on from that
    checkpoint, every sample trained once across the attempts, and the model it logs is whole."""
    env = _group(tmp_path, "replicas: 2, restart: never", optimizer=optimizer)
    first, failed = _attempt(env, "replicas: 2, restart: never", {"rank_hook": functools.partial(fail_at, 1, 9, None)})
    assert isinstance(failed, TrainerFailedError) and "injected failure of rank 1 at round 9" in str(failed)
    client = mlflow.MlflowClient(env["job"].tracking.tracking_uri)
    run = client.search_runs([client.get_experiment_by_name("train-test").experiment_id])[0]
    logged = sorted(int(a.path.rsplit("-", 1)[1]) for a in client.list_artifacts(run.info.run_id, "checkpoints"))
    assert logged and logged[-1] < 9
    shards = [a.path for a in client.list_artifacts(run.info.run_id, f"checkpoints/step-{logged[-1]:09d}/shards")]
    assert any(p.endswith(".distcp") for p in shards) and any(p.endswith(".metadata") for p in shards)
    kept = Counter(i for step, ids in first if step <= logged[-1] for i in ids)
    after, result = _attempt(env, resume_on)
    assert not isinstance(result, Exception), result
    assert result.resumed_from_step == logged[-1]
    assert kept + Counter(i for _, ids in after for i in ids) == expected_ids(env)  # each once across the two
    with use_tracking_uri(env["job"].tracking.tracking_uri):
        model = mlflow.pytorch.load_model(result.model_uri)
    tables = [m for m in model.modules() if isinstance(m, HashedEmbedding)]
    assert tables and all(not t.sharded and t.table.weight.shape[0] == t.buckets for t in tables)

    if resume_on != "replicas: 3":
        return  # the model is whole either way (above); one interpreter start is enough for the load below
    # Served whole: an isolated interpreter (no process group, no checkout on its path) loads and scores it
    # as this process does. A fresh virtualenv with the package from a wheel: test_model_registry.py.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    answer = load_and_score(sys.executable, env["job"].tracking.tracking_uri, result.model_uri, cwd=elsewhere, rows=64)
    generator = torch.Generator().manual_seed(0)  # the batch load_and_score scores (its default seed)
    dense = torch.randn(64, model.n_dense, generator=generator)
    sparse = torch.randint(0, 2**40, (64, model.n_sparse), generator=generator)
    with torch.no_grad():
        expected = model.eval().predict(dense, sparse)[:8].tolist()
    assert answer["finite"] and answer["logits"] == pytest.approx(expected, abs=1e-5)


def test_ranks_on_two_hosts_train_sharded_and_a_killed_rank_resumes_exactly_once(tmp_path: Path) -> None:
    """Two ranks on two "hosts" (127.0.0.1 and 127.0.0.2: each listens for its peers on its own address; the
    rendezvous is torchrun's ``MASTER_ADDR`` / ``RANK`` / ``WORLD_SIZE``) train row-wise sharded tables. Rank 1
    is SIGKILLed mid-run (no word to anyone); the run started again on the same two hosts goes on from the
    last checkpoint, and every sample is trained once across the two attempts (the on_batch audit log)."""
    hosts = ("127.0.0.1", "127.0.0.2")
    pool = "replicas: 2, restart: never"
    env = _group(tmp_path, pool)
    first, failed = _attempt(env, pool, {"rank_hook": functools.partial(kill_at, 1, 9)}, hosts)
    assert isinstance(failed, TrainerFailedError) and f"exit code {-signal.SIGKILL}" in str(failed), failed
    client = mlflow.MlflowClient(env["job"].tracking.tracking_uri)
    run = client.search_runs([client.get_experiment_by_name("train-test").experiment_id])[0]
    logged = sorted(int(a.path.rsplit("-", 1)[1]) for a in client.list_artifacts(run.info.run_id, "checkpoints"))
    assert logged and logged[-1] < 9
    kept = Counter(i for step, ids in first if step <= logged[-1] for i in ids)
    after, result = _attempt(env, pool, {"rank_hook": functools.partial(expect_address, 1, "127.0.0.2")}, hosts)
    assert not isinstance(result, Exception), result
    assert result.resumed_from_step == logged[-1]
    assert kept + Counter(i for _, ids in after for i in ids) == expected_ids(env)  # each once across the two

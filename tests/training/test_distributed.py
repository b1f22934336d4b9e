"""Trainer groups (``primus_dagster.training.distributed``; started by ``rankkit``): gloo ranks, each
with its own RemoteReader.

Over a data plane: 2 ranks train every sample of the window exactly once between them and end with
identical parameters; a group of 1 works; a rank that never gets a batch still takes part. In memory:
both exchanges (row-sparse over the peer sockets or gloo, DDP's dense all-reduce) average each tower's
gradient over the ranks that trained it and keep the replicas identical; after one round they agree; a
failing rank is named (``ddp_dense``: the benchmarks' baseline, ``bench/_ddp.py``). The peer mesh
gathers messages of any length, and names a peer that left. Rank processes are stopped whatever they do.
"""

from __future__ import annotations

import functools
import operator
import os
import pickle
import signal
import time
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from jobkit import expected_ids, make_job
from rankkit import run_ddp, run_ddp_in_memory

from primus_dagster.cluster.pooled_plane import PooledDataPlane
from primus_dagster.data import Batch
from primus_dagster.data.graph import Planner
from primus_dagster.ports import free_port
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.distributed import PeerMesh, RankProcesses, serve_rank
from primus_dagster.training.loop import params_checksum
from primus_dagster.training.models import build_model
from primus_dagster.training.trainer import RecOptimizer

pytestmark = pytest.mark.integration


def _tasks(env: dict) -> list:
    return list(Planner(env["job"].dataset, env["context"], threads=2).plan(env["window"]).tasks)


def test_two_ranks_train_every_sample_once_and_end_identical(tmp_path: Path) -> None:
    env = make_job(tmp_path, mode="mixed", model="mtrm")
    tasks = _tasks(env)
    with PooledDataPlane(env["job_path"], env["root"], tasks, executors=2, trainers=2, token="t0k") as plane:
        results = run_ddp(plane, env["job"].training, world_size=2, record_ids=True, timeout_s=120)
        plane.driver.raise_if_failed()
    assert [r.rank for r in results] == [0, 1]
    trained = Counter(i for r in results for i in r.sample_ids or [])
    expected = expected_ids(env, tasks)
    assert trained == expected
    assert sum(r.samples for r in results) == sum(expected.values())
    assert all(r.steps > 0 and r.samples > 0 for r in results), [(r.steps, r.samples) for r in results]
    assert sum(r.samples_by_kind["batch"] for r in results) > 0
    assert sum(r.samples_by_kind["stream"] for r in results) > 0
    assert results[0].params_checksum and results[0].params_checksum == results[1].params_checksum
    assert results[0].params_abs_sum == results[1].params_abs_sum > 0
    # lockstep rounds: a rank steps (own data or a null step) in every round
    assert results[0].steps + results[0].null_steps == results[1].steps + results[1].null_steps


def test_a_group_of_one_trains_the_whole_window(tmp_path: Path) -> None:
    env = make_job(tmp_path, mode="mixed", model="single", hours=1)
    tasks = _tasks(env)
    with PooledDataPlane(env["job_path"], env["root"], tasks, executors=1, trainers=1) as plane:
        (result,) = run_ddp(plane, env["job"].training, world_size=1, record_ids=True, timeout_s=120)
    assert Counter(result.sample_ids or []) == expected_ids(env, tasks)
    assert result.null_steps == 0 and result.steps > 0 and result.params_checksum


def test_a_rank_without_any_batch_still_takes_part(tmp_path: Path) -> None:
    # One executor, batch data only: the forward shuffle pairs executor 0 with trainer 0, so
    # trainer 1 never gets a batch; it builds the same model and takes a null step every round.
    env = make_job(tmp_path, mode="mixed", model="single", hours=1)
    job_yaml = env["job_path"].read_text()
    assert job_yaml.count("window: 3h\n") == 1
    env["job_path"].write_text(job_yaml.replace("window: 3h\n", "window: 3h\n      shuffle: forward\n"))
    tasks = [t for t in _tasks(env) if t.kind == "batch"]
    with PooledDataPlane(env["job_path"], env["root"], tasks, executors=1, trainers=2) as plane:
        results = run_ddp(plane, env["job"].training, world_size=2, record_ids=True, timeout_s=120)
    assert Counter(i for r in results for i in r.sample_ids or []) == expected_ids(env, tasks)
    assert results[1].steps == 0 and results[1].null_steps == results[0].steps > 0
    assert results[0].params_checksum == results[1].params_checksum


SPEC = TrainingSpec(
    mode="mixed",
    batch_size=64,
    learning_rate=1e-3,  # the agreement's tolerance is set at this rate (SparseAdam's eps shows more at higher ones)
    model={"type": "mtrm", "embedding_dim": 4, "hash_buckets": 500, "memory_hidden": [8], "adapt_hidden": [8]},
)


def _shards(tmp_path: Path, kinds: tuple[str, ...]) -> list[list[Batch]]:
    """One in-memory shard per rank, a micro-batch of 64 rows per kind; pickled to ``<rank>.pt``."""
    torch.manual_seed(0)
    shards = [
        [
            Batch.from_tensors(
                torch.randn(64, 3), torch.randint(-(10**9), 10**9, (64, 2)), (torch.rand(64) < 0.3).float(), kind=k
            )
            for k in rank_kinds.split()
        ]
        for rank_kinds in kinds
    ]
    for rank, shard in enumerate(shards):
        (tmp_path / f"{rank}.pt").write_bytes(pickle.dumps(shard))
    return shards


def _loss(model: torch.nn.Module, x: Batch) -> torch.Tensor:
    """A trainer's loss of one micro-batch: BCE plus MTRM's adapt-tower loss on batch samples
    (``adapt_batch_weight``, 0.1 by default: a batch rank trains the adapt tower too)."""
    loss = F.binary_cross_entropy_with_logits(model(x.dense, x.sparse, x.kind), x.label)
    extra = model.auxiliary_loss(x.dense, x.sparse, x.kind, x.label)
    return loss if extra is None else loss + extra


def test_gradients_are_averaged_over_the_ranks_that_trained_each_tower(tmp_path: Path) -> None:
    """DDP's dense all-reduce: 2 in-memory ranks, rounds of equal and of different kinds == one process
    whose every parameter takes the mean gradient of the ranks that trained its tower (Adam, same seed)."""
    spec = SPEC
    shards = _shards(tmp_path, ("batch stream batch stream", "batch batch stream stream"))
    paths = [str(tmp_path / "0.pt"), str(tmp_path / "1.pt")]
    results = run_ddp_in_memory(paths, spec, warmup_steps=1, exchange="ddp_dense")

    as_ddp = {"sparse_embeddings": False, "adapt_batch_weight": 0.0}  # DenseDDPExchange trains the paper's split
    model = build_model(spec.model.model_copy(update=as_ddp), 3, 2, seed=spec.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=spec.learning_rate)
    for pair in [(shards[0][0], shards[1][0]), *zip(*shards, strict=True)]:  # the warm-up round, then the shards
        grads: dict[str, list[torch.Tensor]] = {}
        for x in pair:
            model.zero_grad(set_to_none=True)
            _loss(model, x).backward()
            for name, p in model.named_parameters():
                if p.grad is not None:
                    grads.setdefault(name, []).append(p.grad)
        for name, p in model.named_parameters():
            p.grad = torch.stack(grads[name]).mean(0) if name in grads else None
        optimizer.step()
    assert results[0].params_checksum == results[1].params_checksum
    assert results[0].params_abs_sum == pytest.approx(params_checksum(model)[1], rel=1e-6)


@pytest.mark.parametrize("transport", ["auto", "gloo"])
def test_row_sparse_exchange_averages_the_touched_rows_per_tower(tmp_path: Path, transport: str) -> None:
    """The row-sparse exchange (over the peer sockets, or gloo) == one process with sparse embedding
    gradients and the lazy SparseAdam (as a single trainer) whose every gradient is the mean over the
    ranks that trained its tower; the replicas end identical."""
    spec = SPEC
    shards = _shards(tmp_path, ("batch stream batch stream", "batch batch stream stream"))
    paths = [str(tmp_path / "0.pt"), str(tmp_path / "1.pt")]
    results = run_ddp_in_memory(paths, spec, warmup_steps=1, transport=transport)  # type: ignore[arg-type]
    assert results[0].params_checksum == results[1].params_checksum
    assert results[0].extra["exchange_bytes_per_step"] > 0

    model = build_model(spec.model, 3, 2, seed=spec.seed)  # sparse embeddings (the default)
    optimizer = RecOptimizer(model, spec.learning_rate)
    for pair in [(shards[0][0], shards[1][0]), *zip(*shards, strict=True)]:
        grads: dict[str, list[torch.Tensor]] = {}
        for x in pair:
            model.zero_grad(set_to_none=True)
            _loss(model, x).backward()
            for name, p in model.named_parameters():
                if p.grad is not None:
                    grads.setdefault(name, []).append(p.grad)
        for name, p in model.named_parameters():
            g = grads.get(name)
            p.grad = None if g is None else functools.reduce(operator.add, g) / len(g)  # dense or sparse
        optimizer.step()
    assert results[0].params_abs_sum == pytest.approx(params_checksum(model)[1], rel=1e-6)


def test_row_sparse_and_dense_allreduce_agree_on_the_same_rows(tmp_path: Path) -> None:
    """Each rank trains the same micro-batch twice (warm-up round, timed round): every row or tower
    with a gradient has it in both rounds, so Adam and the lazy SparseAdam take the same steps and
    the two exchanges give the same parameters -- the row-sparse one sending fewer bytes. Close, not
    equal: SparseAdam adds eps before its bias correction (``eps / sqrt(1 - beta2)`` in Adam's terms),
    which shows on the tiny embedding gradients."""
    _shards(tmp_path, ("batch", "batch"))
    paths = [str(tmp_path / "0.pt"), str(tmp_path / "1.pt")]
    split = SPEC.model_copy(update={"model": SPEC.model.model_copy(update={"adapt_batch_weight": 0.0})})
    sparse = run_ddp_in_memory(paths, split, warmup_steps=1)  # the paper's split, as DenseDDPExchange trains
    dense = run_ddp_in_memory(paths, split, warmup_steps=1, exchange="ddp_dense")
    assert sparse[0].steps == dense[0].steps == 1
    assert sparse[0].params_abs_sum == pytest.approx(dense[0].params_abs_sum, rel=3e-4)
    assert sparse[0].extra["exchange_bytes_per_step"] < dense[0].extra["exchange_bytes_per_step"]


def test_a_failing_rank_is_named(tmp_path: Path) -> None:
    micro = Batch.from_tensors(torch.zeros(4, 3), torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4), kind="batch")
    (tmp_path / "good.pt").write_bytes(pickle.dumps([micro]))
    spec = TrainingSpec(mode="batch", batch_size=4, model={"type": "single", "hash_buckets": 64, "embedding_dim": 2})
    # rank 1 fails first; rank 0 then loses its peer (it may fail too): the message names rank 1
    with pytest.raises(RuntimeError, match=r"rank 1 failed \(exit code 1; failed ranks: \[(0, )?1\]\)[\s\S]*missing"):
        run_ddp_in_memory([str(tmp_path / "good.pt"), str(tmp_path / "missing.pt")], spec, timeout_s=60)


def test_world_size_must_match_the_planes_trainers() -> None:
    plane = SimpleNamespace(trainers=1)  # checked before anything starts
    with pytest.raises(ValueError, match="serves 1 trainers"):
        run_ddp(plane, TrainingSpec(), world_size=2)  # type: ignore[arg-type]


def _message(rank: int, round_: int) -> torch.Tensor:
    """Rank ``rank``'s message in round ``round_``: lengths differ across ranks and rounds, one is 3 MB."""
    n = 3_000_000 if (rank, round_) == (1, 2) else 7 * rank + 3 * round_
    return (torch.arange(n, dtype=torch.int64) * (rank + 1) + round_).remainder(251).to(torch.uint8)


class _Pipe:
    """``put`` into one end of a pipe (no semaphore: no resource tracker process)."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def put(self, item: object) -> None:
        self.conn.send(item)


def _mesh_rank(rank: int, world: int, init: str, out: object) -> None:
    """Rounds over the peer sockets, then over gloo; then rank 2 leaves and the others try one more."""

    def body() -> tuple[list[str], str]:
        meshes = [PeerMesh.connect(30.0), PeerMesh.connect(30.0, gloo=True)]
        for round_, mesh in enumerate([meshes[0]] * 4 + [meshes[1]] * 2):
            got = mesh.all_gather(_message(rank, round_))
            assert [len(m) for m in got] == [len(_message(r, round_)) for r in range(world)]
            assert all(torch.equal(m, _message(r, round_)) for r, m in enumerate(got)), round_
        dist.barrier()
        if rank == 2:
            os._exit(0)  # gone without a word: its sockets close
        try:
            meshes[0].all_gather(_message(rank, 0))
        except ConnectionError as exc:
            return [type(m).__name__ for m in meshes], str(exc)
        return [type(m).__name__ for m in meshes], "no error"

    serve_rank(rank, world, init, 1, out, body, timeout_s=60)


def test_the_peer_mesh_gathers_messages_of_any_length_and_names_a_peer_that_left() -> None:
    world, ctx = 3, mp.get_context("spawn")
    pipes = [ctx.Pipe(duplex=False) for _ in range(world)]
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [
        ctx.Process(target=_mesh_rank, args=(r, world, init, _Pipe(pipes[r][1])), daemon=True) for r in range(world)
    ]
    for proc in procs:
        proc.start()
    try:
        results = {r: pipes[r][0].recv() for r in (0, 1) if pipes[r][0].poll(120)}
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    assert sorted(results) == [0, 1], results
    for rank, (_, status, (names, error)) in results.items():
        assert status == "ok" and names == ["PeerMesh", "GlooBytes"]
        assert error.startswith(f"rank {rank}: rank 2 is gone (it failed or exited)"), error


def _stubborn_rank(rank: int, init: str, out: object) -> None:
    """Exits at once with code 3 (rank 0) or ignores SIGTERM (rank 1)."""
    if rank == 0:
        os._exit(3)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out.put((rank, "ready", None))  # type: ignore[attr-defined]
    time.sleep(600)


def test_rank_processes_are_stopped_whatever_they_do() -> None:
    """A rank that ignores SIGTERM is killed; exit codes by rank; the context manager stops them."""
    with RankProcesses(_stubborn_rank, 2, name="stubborn") as ranks:
        assert ranks.out.get(timeout=120) == (1, "ready", None)
        assert ranks.join(30, [0]) and ranks.exit_codes()[0] == 3 and ranks.alive() == [1]
        ranks.stop(grace_s=0.5)
        assert ranks.exit_codes() == [3, -signal.SIGKILL] and ranks.alive() == []

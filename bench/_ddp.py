"""The benchmarks' rank groups: the ``ddp_dense`` baseline exchange and groups trained from memory.

* :class:`DenseDDPExchange` -- ``ddp_dense``: the exchange before the row-sparse one, kept as
  ``bench/train_throughput.py``'s baseline; a
  :class:`~primus_dagster.training.distributed.GradientExchange` for the
  :class:`~primus_dagster.training.distributed.LockStep` coordinator of the phase loop.
* :func:`run_ddp_in_memory` -- a group without a data plane: rank ``r`` trains the pickled list of
  :class:`Batch` at ``shard_paths[r]`` (:func:`ddp_in_memory_worker`), started with
  :class:`~primus_dagster.training.distributed.RankProcesses`.

Imported as the top-level module ``_ddp`` (``python bench/train_throughput.py`` puts ``bench/`` on
``sys.path``; the tests insert it): the spawned ranks import their target by that name, and spawn
hands them the parent's ``sys.path``.

Example::

    results = run_ddp_in_memory(["0.pkl", "1.pkl"], spec, exchange="ddp_dense")   # 2 ranks
    assert results[0].params_checksum == results[1].params_checksum
"""

from __future__ import annotations

import itertools
import pickle
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from primus_dagster.data import Batch
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.distributed import (
    Divisor,
    GradientExchange,
    LockStep,
    RankProcesses,
    RoundMessages,
    RowSparseExchange,
    ShardedExchange,
    collect_results,
    parameter_groups,
    pin_cores,
    serve_rank,
)
from primus_dagster.training.features import FeatureLayout, ModelInit
from primus_dagster.training.loop import (
    PhaseContext,
    PhaseLoop,
    ProgressPoint,
    RankResult,
    SavedCheckpoint,
    TableShards,
)
from primus_dagster.training.models import build_initial_model
from primus_dagster.training.trainer import Trainer, TrainerStats

from _common import vm_hwm

Exchange = Literal["row_sparse", "ddp_dense", "row_wise"]


def _average_hook(state: DenseDDPExchange, bucket):  # DDP rejects string annotations
    """(dist.GradBucket) -> Future[Tensor]: each gradient / its group's divisor, summed over the ranks; a
    group no rank trained this round (divisor 0: every rank knows it) is not sent at all."""
    started, flat, offset = time.perf_counter(), bucket.buffer(), 0
    runs: list[tuple[int, int]] = []
    for p in bucket.parameters():  # the bucket holds the parameters' gradients, flat, in this order
        n, d = p.numel(), state.divisor[state.group[id(p)]]
        if d > 1:
            flat[offset : offset + n].div_(d)
        if d and runs and runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], offset + n)
        elif d:
            runs.append((offset, offset + n))
        offset += n

    def done(_: object) -> torch.Tensor:
        state.comm_s += time.perf_counter() - started
        return flat

    state.sent += sum(b - a for a, b in runs) * flat.element_size()
    futures = [dist.all_reduce(flat[a:b], async_op=True).get_future() for a, b in runs]
    return torch.futures.collect_all(futures).then(done)


class DenseDDPExchange:
    """``ddp_dense``: the model in ``DistributedDataParallel`` with dense embedding gradients, a comm
    hook (:func:`_average_hook`) doing the division and all-reducing each trained tower's flat buckets;
    the round's all-gather carries the status rows only (``round_messages = False``), the gradients
    go during the backward after it. A null step runs a zero-row forward of a kind some ready rank
    trains (DDP needs its backward). ``sent`` / ``comm_s``: bytes and seconds of the hook's all-reduces.

    Example::

        loop = PhaseLoop(context, LockStep(DenseDDPExchange()), reader, sink, checkpoint_every=0)
    """

    round_messages = False
    backward_first = False  # DDP exchanges inside the backward, after the round's statuses
    table_shards: TableShards | None = None

    def __init__(self) -> None:
        self.group: dict[int, str] = {}  # id(parameter) -> memory | adapt | all
        self.divisor: Mapping[str, int] = {}  # the round's, per parameter group
        self.widths = (0, 0)
        self.sent, self.comm_s = 0, 0.0

    @property
    def seconds(self) -> float:
        return self.comm_s

    def reset_counters(self) -> None:
        self.sent, self.comm_s = 0, 0.0

    def close(self) -> None:
        pass  # its all-reduces are DDP's

    def build(self, spec: TrainingSpec, init: ModelInit, *, deterministic: bool = False) -> Trainer:
        """Dense embedding gradients: the comm hook reduces flat dense buckets. MTRM trains the paper's
        split here (``adapt_batch_weight`` 0): its adapt-tower loss on batch samples runs outside the
        module's forward, which DDP's hooks cannot see twice in one backward."""
        model_spec = spec.model.model_copy(update={"sparse_embeddings": False, "adapt_batch_weight": 0.0})
        model = build_initial_model(model_spec, init, seed=spec.seed)
        n_dense, n_sparse = init.layout.n_dense, init.layout.n_sparse
        ddp = DistributedDataParallel(
            model,
            find_unused_parameters=len(model.parameter_groups().names) > 1,  # a micro-batch trains one group
            forward_sync_buffers=False,
            gradient_as_bucket_view=True,
        )
        ddp.register_comm_hook(self, _average_hook)
        self.group, self.widths = parameter_groups(model), (n_dense, n_sparse)
        return Trainer(model, spec, module=ddp, observe_labels=False, deterministic=deterministic)

    def pack(self, status: torch.Tensor, kind: int, micro: Batch) -> torch.Tensor | None:
        return None  # the status alone (never called: no round messages)

    def gradients(
        self, trainer: Trainer, micro: Batch, loss: torch.Tensor | None, messages: RoundMessages, divisor: Divisor
    ) -> torch.Tensor:
        """DDP exchanges inside the backward."""
        self.divisor = divisor
        return trainer.backward(micro)

    def null_gradients(self, trainer: Trainer, kind: str, messages: RoundMessages, divisor: Divisor) -> None:
        self.divisor = divisor
        dense, sparse = torch.zeros(0, self.widths[0]), torch.zeros(0, self.widths[1], dtype=torch.int64)
        (trainer.module(dense, sparse, kind).sum() * 0.0).backward()


EXCHANGES: dict[str, Callable[[], GradientExchange]] = {
    "row_sparse": RowSparseExchange,  # replicated tables
    "ddp_dense": DenseDDPExchange,
    "row_wise": ShardedExchange,  # tables sharded by rows (training.sharding: row_wise)
}


def fail_rank_at(rank: int, at_round: int, this_rank: int, round_: int) -> None:
    """A rank hook (``RunHooks.rank_hook``, pickled into the ranks): rank ``rank`` raises at ``at_round``."""
    if this_rank == rank and round_ == at_round:
        raise RuntimeError(f"injected failure of rank {rank} at round {round_}")


@dataclass(frozen=True)
class InMemoryPlan:
    """What every rank of :func:`run_ddp_in_memory` gets (pickled into the spawned processes)."""

    world_size: int
    training_spec_json: str
    n_threads: int
    shard_paths: list[str]
    warmup_steps: int
    exchange: Exchange = "row_sparse"
    cores: list[list[int] | None] | None = None
    transport: Literal["auto", "gloo"] = "auto"
    timeout_s: float = 600.0
    states_dir: str | None = None  # each rank saves its final model state there (``<rank>.pt``)


class ShardReader:
    """A rank's reader batches from memory (a :class:`~primus_dagster.training.loop.PhaseReader`): the
    warm-up cycles its shard, then :meth:`timed` serves it once; no barriers (no checkpoints)."""

    def __init__(self, shard: list[Batch]):
        self.source: Iterator[Batch] = itertools.cycle(shard)
        self.shard = shard

    def timed(self) -> None:
        self.source = iter(self.shard)

    def next_batch(self, kind: str | None = None, timeout: float | None = None) -> Batch | None:
        return next(self.source, None)

    def barrier(self, barrier_id: int, wait_s: float = 0.0) -> dict[str, Any] | None:
        return None


class NoSink:
    """A :class:`~primus_dagster.training.loop.LoopSink` that keeps nothing (a benchmark's rank)."""

    wants_batches = False

    def batch_trained(self, rank: int, step: int, batch: Batch) -> None:
        pass

    def progress(self, point: ProgressPoint) -> None:
        pass

    def checkpoint(self, rank: int, step: int, saved: SavedCheckpoint | None) -> None:
        pass


def ddp_in_memory_worker(rank: int, init_method: str, out_queue: Any, plan: InMemoryPlan) -> None:
    """One rank on in-memory micro-batches (a pickled list of :class:`Batch` at ``shard_paths[rank]``),
    bound to ``cores[rank]``: ``warmup_steps`` rounds, then the timed loop over the whole shard.
    ``extra``: seconds in the gradient exchange (``exchange_s``; row_sparse: of which ``pack_s``
    making this rank's messages, ``gather_s`` exchanging them, waiting for the peer included,
    ``apply_s`` summing the gradients), bytes this rank put into its collectives per round
    (``exchange_bytes_per_step``), seconds of one gloo all-reduce of that many bytes
    (``allreduce_probe_s``), the process's peak RSS (``peak_rss_mb``)."""

    def body() -> RankResult:
        pin_cores(plan.cores[rank] if plan.cores else None)
        with open(plan.shard_paths[rank], "rb") as file:
            shard: list[Batch] = pickle.load(file)  # written by the caller (bench/train_throughput.py)
        spec = TrainingSpec.model_validate_json(plan.training_spec_json)
        first = shard[0]  # every rank's shard has the same columns
        dense = [f"d{i}" for i in range(int(first.dense.shape[1]))]
        init = ModelInit(FeatureLayout.resolve(spec, dense, list(first.sparse_names), list(first.list_names)))
        context = PhaseContext.outside_run(spec, plan.world_size, init=init)
        exchange = EXCHANGES[plan.exchange]()
        coordinator = LockStep(exchange, timeout_s=plan.timeout_s, transport=plan.transport)
        reader = ShardReader(shard)
        warm = PhaseLoop(context, coordinator, reader, NoSink(), checkpoint_every=0)
        warm.run(max_rounds=plan.warmup_steps)
        assert warm.state.trainer is not None
        warm.state.trainer.counters, warm.state.null_steps = TrainerStats(), 0
        coordinator.reset_counters()
        reader.timed()
        dist.barrier()
        loop = PhaseLoop(context, coordinator, reader, NoSink(), state=warm.state, checkpoint_every=0)
        loop.run()
        dist.barrier()
        result = loop.result()
        per_step = exchange.sent / max(1, result.steps + result.null_steps)
        longest = torch.tensor([per_step])  # the ranks' messages differ in size: probe the largest
        dist.all_reduce(longest, op=dist.ReduceOp.MAX)
        flat, probe0 = torch.zeros(int(longest) // 4), time.perf_counter()
        for _ in range(5):
            dist.all_reduce(flat)
        if plan.states_dir is not None:
            torch.save(loop.state.trainer.model.state_dict(), f"{plan.states_dir}/{rank}.pt")  # type: ignore[union-attr]
        result.extra = {
            "exchange_s": exchange.seconds + coordinator.mesh_s,
            "exchange_bytes_per_step": per_step,
            "allreduce_probe_s": (time.perf_counter() - probe0) / 5,
            "peak_rss_mb": vm_hwm() / 2**20,  # this rank's process
        }
        if isinstance(exchange, RowSparseExchange) and exchange.active:  # a group of one exchanges nothing
            result.extra.update(pack_s=exchange.pack_s, gather_s=coordinator.mesh_s, apply_s=exchange.apply_s)
        coordinator.close()
        return result

    serve_rank(rank, plan.world_size, init_method, plan.n_threads, out_queue, body, timeout_s=plan.timeout_s)


def run_ddp_in_memory(
    shard_paths: list[str],
    spec: TrainingSpec,
    *,
    threads_per_rank: int = 1,
    warmup_steps: int = 5,
    exchange: Exchange = "row_sparse",
    timeout_s: float = 600,
    cores: list[list[int] | None] | None = None,
    transport: Literal["auto", "gloo"] = "auto",
    states_dir: str | None = None,
) -> list[RankResult]:
    """:func:`ddp_in_memory_worker` on ``len(shard_paths)`` ranks (a group without a data plane);
    rank ``r`` bound to ``cores[r]`` (None: unbound); ``transport="gloo"``: the row-sparse exchange
    over gloo (``GlooBytes``) instead of the peer sockets. Results by rank; RuntimeError naming a
    failed rank."""
    plan = InMemoryPlan(
        world_size=len(shard_paths),
        training_spec_json=spec.model_dump_json(),
        n_threads=threads_per_rank,
        shard_paths=list(shard_paths),
        warmup_steps=warmup_steps,
        exchange=exchange,
        cores=cores,
        transport=transport,
        timeout_s=timeout_s,
        states_dir=states_dir,
    )
    with RankProcesses(ddp_in_memory_worker, plan.world_size, plan, name="ddp-rank") as ranks:
        return collect_results(ranks, timeout_s)

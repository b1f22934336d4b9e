"""Data-parallel training: N training processes as one ``torch.distributed`` group (gloo, CPU).

Rank ``r``: a process, its own :class:`RemoteReader` (``trainer_id = r``) on one data plane made with
``trainers=N`` (every sample trained once across the ranks); a gradient exchange keeps replicas
identical. The training job runs such groups with checkpoints (``multi_trainer.py``); :func:`run_ddp`
and :func:`run_ddp_in_memory` run one without (tests, benchmarks).

**Rounds, not** ``Join``. Each optimiser step is a *round*: every rank polls its reader without
waiting and the ranks all-gather ``(ready, ended, kind, n_dense, n_sparse, label sum, label count)``.
Nobody ready: stop once all ended, else wait briefly and poll again. Otherwise *every* rank steps: a
ready rank trains its micro-batch, the others take a *null step* (no data, zero gradient). ``Join``
covers ranks whose data *ended*, not a rank waiting for data that depends on the others: an executor
blocked on trainer 0's full buffer (forward shuffle) makes no batch for trainer 1, and trainer 0
drains it only while it steps; under ``Join`` it waits in its step's collective for trainer 1 -- a
deadlock (seen at 60k rows/hour in ``tests/training/jobkit``). Rounds also keep the Adam states
identical. The first round in which any rank has data builds the model on every rank with the lowest
ready rank's widths (same seed): a rank without any batch still takes part. MTRM's label-delay
counts are added from the gathered label sums of every ready rank, in rank order, so every replica
holds the group's counts.

**Averaging, MTRM.** Each gradient is divided by the number of ranks that trained it in the round
(MTRM: ranks of kind ``batch`` for the memory tower, ``stream`` for the adapt tower), then summed; a
tower no rank trained is not sent and keeps ``grad=None`` (Adam skips it); a parameter of a tower
some rank trained gets the group's gradient on every rank (zeros from the others). The stream loss
gives the memory tower no gradient (``MTRM.memory_state`` is detached). Two exchanges do this:

* ``row_sparse`` (default, :class:`RowSparseExchange`): embedding tables keep sparse gradients; each
  rank coalesces its table gradient to the rows its step touched, the ranks all-gather those (row
  index + gradient row, padded to the longest) and every rank sums them into the same coalesced
  sparse gradient for :class:`~primus_dagster.training.trainer.RecOptimizer`'s lazy SparseAdam, as a
  single trainer does; dense parameters go in one flat all-reduce. 1024 x 5 ids touch at most 5120
  of 100 000 rows: ~0.4 MB a rank a step instead of the 6.4 MB dense table. A null step only joins
  the exchange (no forward).
* ``ddp_dense``: the model in ``DistributedDataParallel`` with dense embedding gradients, a comm hook
  (:func:`_average_hook`) doing the division and all-reducing each trained tower's flat buckets; a
  null step runs a zero-row forward of a kind some ready rank trains (DDP needs its backward).
  Kept as the baseline of ``bench/train_throughput.py``.

Example::

    with LocalDataPlane(job_path, data_root, tasks, executors=2, trainers=2) as plane:
        results = run_ddp(plane, job.training, world_size=2)
    assert len({r.params_checksum for r in results}) == 1     # identical replicas
"""

from __future__ import annotations

import hashlib
import itertools
import os
import pickle
import queue as queue_mod
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from primus_dagster.data import Batch, DriverClient, LocalDataPlane, RemoteReader
from primus_dagster.ports import free_port
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.models import MTRM, build_model, model_inputs
from primus_dagster.training.priority import MixturePriority
from primus_dagster.training.trainer import Trainer, TrainerStats

Exchange = Literal["row_sparse", "ddp_dense"]
_KINDS = ("batch", "stream")
# a round's status row: ready, ended, kind, n_dense, n_sparse, label sum, rows; then rows touched per table
_STATUS, _MAX_TABLES = 7, 8


@dataclass
class RankResult:
    """What one rank did: counters, its time, a checksum of its final parameters."""

    rank: int
    steps: int
    samples: int
    samples_by_kind: dict[str, int]
    wall_s: float  # after init_process_group, to the end of training
    train_s: float  # inside its own optimiser steps (null steps excluded)
    params_checksum: str  # sha256 of the concatenated float32 parameter bytes ("" without a model)
    params_abs_sum: float  # float64 sum of |p|
    null_steps: int = 0  # rounds this rank took part in without data of its own
    cpu_s: float = 0.0  # CPU seconds of this process in the measured loop (all its threads)
    sample_ids: list[int] | None = None  # trained sample ids in order (record_ids=True)
    extra: dict[str, float] = field(default_factory=dict)


def params_checksum(model: nn.Module) -> tuple[str, float]:
    """(sha256 of the float32 parameter bytes in order, float64 sum of their absolute values)."""
    flat = [p.detach().to(torch.float32).contiguous() for p in model.parameters()]
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in flat)).hexdigest()
    return digest, float(sum(float(t.abs().sum(dtype=torch.float64)) for t in flat))


def parameter_groups(model: nn.Module) -> dict[int, str]:
    """``id(parameter) -> group`` whose gradients are averaged together: MTRM's ``memory`` /
    ``adapt`` towers, ``all`` for other models."""
    mtrm = isinstance(model, MTRM)
    return {id(p): (name.split(".")[0] if mtrm else "all") for name, p in model.named_parameters()}


class RowSparseExchange:
    """The ``row_sparse`` gradient exchange of a round (module docstring), in two calls: after
    backward, :meth:`touched` coalesces this rank's sparse table gradients and returns the rows
    touched per table (they ride in the round's status all-gather); then :meth:`__call__` with
    ``divisor[group]`` = the ranks that trained the group this round and every rank's row counts.

    One all-gather of one float32 payload per rank, padded to the longest: ``grad / divisor`` of
    every dense parameter of a trained group (zeros where this rank has none), then for every
    sparse table (``nn.Embedding(sparse=True)``) of a trained group its touched rows as ``[row index
    as 2 float32 words, grad row / divisor]``. Every rank sums the dense parts in rank order and
    coalesces the rows into one sparse gradient: the same on every rank. ``sent``: bytes this rank
    put into the collective; ``comm_s``: seconds spent in :meth:`__call__`.

    Example::

        exchange = RowSparseExchange(model)
        loss = trainer.backward(micro_batch)
        counts = gather_counts(exchange.touched())                 # [world, tables]
        exchange({"memory": 1, "adapt": 1, "all": 2}, counts)
        trainer.apply(micro_batch, loss, started)
    """

    def __init__(self, model: nn.Module):
        self.group = parameter_groups(model)
        sparse = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding) and m.sparse}
        self.dense = [p for p in model.parameters() if id(p) not in sparse]
        self.tables = [p for p in model.parameters() if id(p) in sparse]
        self._rows: list[tuple[torch.Tensor, torch.Tensor]] = []  # this rank's (rows, grad rows) per table
        self.sent, self.comm_s = 0, 0.0

    def touched(self) -> list[int]:
        """Coalesce this rank's table gradients (None: no rows); the rows touched per table."""
        self._rows = []
        for p in self.tables:
            grad = p.grad
            if grad is None:
                self._rows.append((torch.empty(0, dtype=torch.int64), p.new_empty(0, p.shape[1])))
            else:
                grad = grad.coalesce()
                self._rows.append((grad.indices()[0].contiguous(), grad.values()))
        return [rows.numel() for rows, _ in self._rows]

    def __call__(self, divisor: Mapping[str, int], counts: torch.Tensor) -> None:
        """Average the round's gradients; ``counts[r, i]``: rows of table ``i`` touched by rank ``r``
        (:meth:`touched`; zeros for a rank without data, which must hold no gradients)."""
        started = time.perf_counter()
        dense = [(p, d) for p in self.dense if (d := divisor[self.group[id(p)]])]
        tables = [(i, p, d) for i, p in enumerate(self.tables) if (d := divisor[self.group[id(p)]])]
        rows_of = self._rows or [(torch.empty(0, dtype=torch.int64), p.new_empty(0, p.shape[1])) for p in self.tables]
        parts = [p.new_zeros(p.numel()) if p.grad is None else p.grad.reshape(-1) / d for p, d in dense]
        for i, _, d in tables:
            rows, values = rows_of[i]
            parts.append(torch.cat([rows.view(torch.float32).reshape(-1, 2), values / d], 1).reshape(-1))
        n_dense = sum(p.numel() for p, _ in dense)
        widths = [(i, p.shape[1] + 2) for i, p, _ in tables]
        longest = n_dense + max(sum(int(c[i]) * w for i, w in widths) for c in counts)
        mine = torch.cat(parts) if parts else torch.empty(0)
        padded = torch.cat([mine, mine.new_zeros(longest - mine.numel())])
        gathered = [torch.empty_like(padded) for _ in range(len(counts))]
        dist.all_gather(gathered, padded)
        self.sent += padded.numel() * padded.element_size()
        if dense:
            total = torch.stack([g[:n_dense] for g in gathered]).sum(0)  # rank order: the same sum everywhere
            offset = 0
            for p, _ in dense:
                p.grad = total[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
        chunks: dict[int, list[torch.Tensor]] = {i: [] for i, _ in widths}
        for c, data in zip(counts, gathered, strict=True):
            offset = n_dense
            for i, width in widths:
                n = int(c[i])
                chunks[i].append(data[offset : offset + n * width].view(n, width))
                offset += n * width
        for i, p, _ in tables:
            block = torch.cat(chunks[i])
            if not len(block):
                p.grad = None
                continue
            rows = block[:, :2].contiguous().view(torch.int64).reshape(1, -1)
            p.grad = torch.sparse_coo_tensor(rows, block[:, 2:], p.shape, check_invariants=False).coalesce()
        self._rows = []
        self.comm_s += time.perf_counter() - started


def _average_hook(state: RankLoop, bucket):  # DDP rejects string annotations
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


class RankLoop:
    """One rank's rounds (module docstring). ``pull(wait_s)``: a reader batch; None: ended;
    TimeoutError: none yet.

    Checkpoints (set by the training job): with ``every`` > 0, once ``rounds`` reaches ``next_checkpoint`` the
    ranks stop pulling and finish the reader batches they hold (null steps for the others); at the
    first round in which no rank holds one, every rank calls ``on_checkpoint(rounds)`` -- the same
    round on every rank, decided from the gathered table, so the checkpoint covers whole reader
    batches -- and the next one falls ``every`` rounds later. ``on_batch_done(rounds, batch)``:
    after the last micro-batch of a reader batch; ``before_round(rounds)``: before every round.

    Example::

        loop = RankLoop(spec, lambda wait_s: reader.next_batch(timeout=wait_s))
        loop.run()
        loop.result(rank, wall_s, cpu_s).params_checksum
    """

    def __init__(
        self,
        spec: TrainingSpec,
        pull: Callable[[float], Batch | None],
        *,
        exchange: Exchange = "row_sparse",
        record_ids: bool = False,
    ):
        self.spec, self.pull, self.exchange = spec, pull, exchange
        self.pending, self.ended = deque[Batch](), False
        self.current: Batch | None = None  # the reader batch whose micro-batches are pending
        self.trainer: Trainer | None = None
        self.rounds, self.null_steps, self.comm_s, self.sent = 0, 0, 0.0, 0  # ddp_dense hook: seconds, bytes
        self.widths = (0, 0)
        self.group: dict[int, str] = {}  # id(parameter) -> memory | adapt | all
        self.divisor = {"memory": 1, "adapt": 1, "all": 1}  # of each group in this round (0: not sent)
        self.sample_ids: list[int] | None = [] if record_ids else None
        self.sparse: RowSparseExchange | None = None
        self.every, self.next_checkpoint = 0, 0  # checkpoints every `every` rounds (0: none), the next at
        self.on_checkpoint: Callable[[int], None] | None = None
        self.on_batch_done: Callable[[int, Batch], None] | None = None
        self.before_round: Callable[[int], None] | None = None
        self.on_build: Callable[[Trainer], None] | None = None

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank put into the gradient collectives so far."""
        return self.sparse.sent if self.sparse is not None else self.sent

    @property
    def exchange_s(self) -> float:
        """Seconds of the gradient exchange so far."""
        return self.sparse.comm_s if self.sparse is not None else self.comm_s

    def _head(self, wait_s: float, pull: bool) -> Batch | None:
        if not self.pending and not self.ended and pull:
            try:
                batch = self.pull(wait_s)
            except TimeoutError:
                return None
            self.ended, size = batch is None, self.spec.batch_size
            if batch is not None:
                self.current = batch
                self.pending.extend(batch.slice(s, s + size) for s in range(0, batch.rows, size))
        return self.pending[0] if self.pending else None

    def build(self, n_dense: int, n_sparse: int) -> Trainer:
        """Build the model and its trainer (every rank at the same round, same seed), then ``on_build``."""
        if self.exchange == "row_sparse":
            model = build_model(self.spec.model, n_dense, n_sparse, seed=self.spec.seed)
            self.sparse = RowSparseExchange(model) if dist.get_world_size() > 1 else None
            if self.sparse is not None and len(self.sparse.tables) > _MAX_TABLES:
                raise ValueError(f"{len(self.sparse.tables)} sparse embedding tables; at most {_MAX_TABLES}")
            self.trainer = Trainer(model, self.spec, observe_labels=False)
        else:  # dense embedding gradients: the comm hook reduces flat dense buckets
            model_spec = self.spec.model.model_copy(update={"sparse_embeddings": False})
            model = build_model(model_spec, n_dense, n_sparse, seed=self.spec.seed)
            ddp = DistributedDataParallel(
                model,
                find_unused_parameters=isinstance(model, MTRM),
                forward_sync_buffers=False,
                gradient_as_bucket_view=True,
            )
            ddp.register_comm_hook(self, _average_hook)
            self.trainer = Trainer(model, self.spec, module=ddp, observe_labels=False)
        self.group, self.widths = parameter_groups(model), (n_dense, n_sparse)
        if self.on_build is not None:
            self.on_build(self.trainer)
        return self.trainer

    def _null_step(self, trainer: Trainer, kind: str, counts: torch.Tensor) -> None:
        trainer.optimizer.zero_grad(set_to_none=True)
        if self.exchange == "ddp_dense":
            dense, sparse = torch.zeros(0, self.widths[0]), torch.zeros(0, self.widths[1], dtype=torch.int64)
            (trainer.module(dense, sparse, kind).sum() * 0.0).backward()
        elif self.sparse is not None:
            self.sparse(self.divisor, counts)
        trainer.optimizer.step()
        self.null_steps += 1

    def _observe(self, model: nn.Module, ready: torch.Tensor) -> None:
        """Every ready rank's label sum and count, in rank order (MTRM's label-delay calibration)."""
        if isinstance(model, MTRM):
            for row in ready.tolist():
                index = int(row[2])
                model.label_sums[index] += row[5]
                model.label_counts[index] += row[6]

    def _checkpoint_due(self) -> bool:
        return self.every > 0 and self.rounds >= self.next_checkpoint

    def run(self, max_rounds: int | None = None) -> None:
        """Rounds until every rank's data ended (or ``max_rounds`` training rounds)."""
        wait_s, done = 0.0, 0
        while max_rounds is None or done < max_rounds:
            if self.before_round is not None:
                self.before_round(self.rounds)
            draining = self._checkpoint_due()
            head = self._head(wait_s, pull=not draining)
            mine = torch.zeros(_STATUS + _MAX_TABLES, dtype=torch.float64)
            mine[1] = float(self.ended)
            loss, started = None, time.perf_counter()
            if head is not None:
                label_sum = float(model_inputs(head)[2].sum())
                shape = (head.dense.shape[1], head.sparse.shape[1])
                mine[:_STATUS] = torch.tensor([1, mine[1], _KINDS.index(head.kind), *shape, label_sum, head.rows])
                if self.exchange == "row_sparse":  # backward first: its touched rows ride in the status
                    trainer = self.trainer or self.build(*shape)
                    loss = trainer.backward(head)
                    if self.sparse is not None:
                        touched = self.sparse.touched()
                        mine[_STATUS : _STATUS + len(touched)] = torch.tensor(touched, dtype=torch.float64)
            rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(rows, mine)
            table = torch.stack(rows)
            ready = table[table[:, 0] == 1]
            if not len(ready):
                all_ended = bool((table[:, 1] == 1).all())
                if draining and not all_ended and self.on_checkpoint is not None:
                    self.on_checkpoint(self.rounds)  # every rank, this round: nobody holds a reader batch
                    self.next_checkpoint = self.rounds + self.every
                    continue
                if all_ended:
                    return
                wait_s = 0.02  # after a round in which nobody had data, every rank waits for some a little
                continue
            wait_s, done, self.rounds = 0.0, done + 1, self.rounds + 1
            trainer = self.trainer or self.build(int(ready[0, 3]), int(ready[0, 4]))
            if (widths := {(int(r[3]), int(r[4])) for r in ready}) != {self.widths}:
                raise ValueError(f"batches of input widths {sorted(widths)}; the model's: {self.widths}")
            n_batch, n_stream = int((ready[:, 2] == 0).sum()), int((ready[:, 2] == 1).sum())
            self.divisor.update(memory=n_batch, adapt=n_stream, all=len(ready))
            self._observe(trainer.model, ready)
            counts = table[:, _STATUS:].to(torch.int64)
            if head is None:
                self._null_step(trainer, "batch" if n_batch else "stream", counts)
                continue
            micro = self.pending.popleft()
            if loss is None:  # ddp_dense: DDP exchanges inside backward
                trainer.train_step(micro)
            else:
                if self.sparse is not None:
                    self.sparse(self.divisor, counts)
                trainer.apply(micro, loss, started)
            if self.sample_ids is not None and head.sample_id is not None:
                self.sample_ids.extend(head.sample_id.tolist())
            if not self.pending and self.current is not None:
                finished, self.current = self.current, None
                if self.on_batch_done is not None:
                    self.on_batch_done(self.rounds, finished)

    def result(self, rank: int, wall_s: float, cpu_s: float) -> RankResult:
        c = self.trainer.counters if self.trainer else TrainerStats()
        checksum, abs_sum = params_checksum(self.trainer.model) if self.trainer else ("", 0.0)
        return RankResult(
            rank,
            c.step,
            c.samples,
            dict(c.samples_by_kind),
            wall_s,
            c.train_s,
            checksum,
            abs_sum,
            self.null_steps,
            cpu_s,
            self.sample_ids,
        )


def pin_cores(cores: Sequence[int] | None) -> None:
    """Bind this process to ``cores`` (Linux; a no-op for None or elsewhere)."""
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, list(cores))


def serve_rank(
    rank: int,
    world_size: int,
    init_method: str,
    n_threads: int,
    out_queue: Any,
    body: Callable[[], Any],
    *,
    timeout_s: float = 600.0,
) -> None:
    """Join the group (collectives time out after ``timeout_s``), run ``body``; put ``(rank, "ok",
    result)`` or ``(rank, "error", (time, traceback))`` -- the time taken before leaving the group,
    whose end makes the other ranks fail too."""
    torch.set_num_threads(n_threads)
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
    )
    try:
        out_queue.put((rank, "ok", body()))
    except BaseException:
        out_queue.put((rank, "error", (time.time(), traceback.format_exc())))
        raise
    finally:
        dist.destroy_process_group()


def ddp_worker(
    rank: int,
    world_size: int,
    init_method: str,
    driver_location: str,
    token: str | None,
    training_spec_json: str,
    n_threads: int,
    out_queue: Any,
    record_ids: bool,
    exchange: Exchange = "row_sparse",
) -> None:
    """One rank of :func:`run_ddp`: reads trainer ``rank``'s batches from the data plane and trains."""

    def body() -> RankResult:
        spec = TrainingSpec.model_validate_json(training_spec_json)
        started, cpu0 = time.perf_counter(), time.process_time()
        chooser = MixturePriority(spec.priority_weights, seed=spec.seed + rank) if spec.mode == "mixed" else None
        with (
            DriverClient(driver_location, token=token) as client,
            RemoteReader(client, rank, token=token, choose_queue=chooser) as reader,
        ):
            loop = RankLoop(
                spec, lambda wait_s: reader.next_batch(timeout=wait_s), exchange=exchange, record_ids=record_ids
            )
            loop.run()
        return loop.result(rank, time.perf_counter() - started, time.process_time() - cpu0)

    serve_rank(rank, world_size, init_method, n_threads, out_queue, body)


def ddp_in_memory_worker(
    rank: int,
    world_size: int,
    init_method: str,
    training_spec_json: str,
    n_threads: int,
    out_queue: Any,
    shard_paths: list[str],
    warmup_steps: int,
    exchange: Exchange = "row_sparse",
) -> None:
    """One rank on in-memory micro-batches (a pickled list of :class:`Batch` at ``shard_paths[rank]``):
    ``warmup_steps`` rounds, then the timed loop over the whole shard. ``extra``: seconds in the
    gradient exchange (``exchange_s``), bytes this rank put into its collectives per round
    (``exchange_bytes_per_step``), seconds of one all-reduce of that many bytes (``allreduce_probe_s``)."""

    def body() -> RankResult:
        with open(shard_paths[rank], "rb") as file:
            shard: list[Batch] = pickle.load(file)  # written by the caller (bench/train_throughput.py)
        warm = itertools.cycle(shard)
        spec = TrainingSpec.model_validate_json(training_spec_json)
        loop = RankLoop(spec, lambda _: next(warm), exchange=exchange)
        loop.run(max_rounds=warmup_steps)
        assert loop.trainer is not None
        loop.trainer.counters, loop.comm_s, loop.sent, loop.null_steps = TrainerStats(), 0.0, 0, 0
        if loop.sparse is not None:
            loop.sparse.sent, loop.sparse.comm_s = 0, 0.0
        timed = iter(shard)
        loop.pull, loop.pending = (lambda _: next(timed, None)), deque()
        dist.barrier()
        started, cpu0 = time.perf_counter(), time.process_time()
        loop.run()
        dist.barrier()
        result = loop.result(rank, time.perf_counter() - started, time.process_time() - cpu0)
        per_step = loop.bytes_sent / max(1, result.steps + result.null_steps)
        flat, probe0 = torch.zeros(int(per_step) // 4), time.perf_counter()
        for _ in range(5):
            dist.all_reduce(flat)
        result.extra = {
            "exchange_s": loop.exchange_s,
            "exchange_bytes_per_step": per_step,
            "allreduce_probe_s": (time.perf_counter() - probe0) / 5,
        }
        return result

    serve_rank(rank, world_size, init_method, n_threads, out_queue, body)


def _launch(
    target: Callable[..., None],
    world_size: int,
    make_args: Callable[[int, str, Any], tuple[Any, ...]],
    timeout_s: float,
) -> list[RankResult]:
    """Spawn ``world_size`` ranks of ``target(*make_args(rank, init_method, out_queue))``; their results."""
    out: Any = (ctx := mp.get_context("spawn")).Queue()
    init, deadline = f"tcp://127.0.0.1:{free_port()}", time.monotonic() + timeout_s
    procs = [
        ctx.Process(target=target, args=make_args(rank, init, out), name=f"ddp-rank-{rank}", daemon=True)
        for rank in range(world_size)
    ]
    results, errors, dead = dict[int, RankResult](), dict[int, tuple[float, str]](), dict[int, int]()
    try:
        for proc in procs:
            proc.start()
        while len(results) + len(errors) < world_size and time.monotonic() < deadline:
            try:
                rank, status, payload = out.get(timeout=0.2)
                (results if status == "ok" else errors)[rank] = payload
            except queue_mod.Empty:  # quiet after an error, or a rank gone without a word (twice): stop
                if errors or dead:
                    break
                dead = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode and r not in results}
    finally:
        for proc in procs:
            proc.join(30 if len(results) == world_size else 1)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
    if errors:  # the first to fail is the cause; the others lost their peer
        rank = min(errors, key=lambda r: errors[r][0])
        raise RuntimeError(
            f"DDP rank {rank} failed (exit code {procs[rank].exitcode}; failed ranks: "
            f"{sorted(errors)}):\n{errors[rank][1]}"
        )
    for rank, code in dead.items():
        raise RuntimeError(f"DDP rank {rank} died with exit code {code}")
    if len(results) < world_size:
        raise TimeoutError(f"DDP group of {world_size}: only ranks {sorted(results)} done within {timeout_s:g}s")
    return [results[r] for r in range(world_size)]


def run_ddp(
    plane: LocalDataPlane,
    spec: TrainingSpec,
    world_size: int,
    *,
    threads_per_rank: int = 1,
    record_ids: bool = False,
    exchange: Exchange = "row_sparse",
    timeout_s: float = 600,
) -> list[RankResult]:
    """Train ``spec``'s model on the plane's data with ``world_size`` ranks (``spawn``-ed
    processes, gloo on loopback); results by rank. RuntimeError naming the rank when one fails."""
    if plane.trainers != world_size:
        raise ValueError(f"the data plane serves {plane.trainers} trainers; world_size is {world_size}")
    return _launch(
        ddp_worker,
        world_size,
        lambda rank, init, out: (
            rank,
            world_size,
            init,
            plane.location,
            plane.token,
            spec.model_dump_json(),
            threads_per_rank,
            out,
            record_ids,
            exchange,
        ),
        timeout_s,
    )


def run_ddp_in_memory(
    shard_paths: list[str],
    spec: TrainingSpec,
    *,
    threads_per_rank: int = 1,
    warmup_steps: int = 5,
    exchange: Exchange = "row_sparse",
    timeout_s: float = 600,
) -> list[RankResult]:
    """:func:`ddp_in_memory_worker` on ``len(shard_paths)`` ranks (benchmarks: a group without a data plane)."""
    return _launch(
        ddp_in_memory_worker,
        len(shard_paths),
        lambda rank, init, out: (
            rank,
            len(shard_paths),
            init,
            spec.model_dump_json(),
            threads_per_rank,
            out,
            list(shard_paths),
            warmup_steps,
            exchange,
        ),
        timeout_s,
    )

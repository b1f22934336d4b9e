"""Data-parallel training: N training executors as one ``torch.distributed`` DDP group (gloo, CPU).

Rank ``r``: a process, its own :class:`RemoteReader` (``trainer_id = r``) on one data plane made with
``trainers=N`` (every sample trained once across the ranks); DDP's allreduce keeps replicas identical.

**Rounds, not** ``Join``. Each optimiser step is a *round*: every rank polls its reader without
waiting and the ranks all-gather ``(ready, ended, kind, n_dense, n_sparse)``. Nobody ready: stop once
all ended, else wait briefly and poll again. Otherwise *every* rank steps: a ready rank trains its
micro-batch, the others take a *null step* (zero-row forward, zero gradient). ``Join`` covers ranks
whose data *ended*, not a rank waiting for data that depends on the others: an executor blocked on
trainer 0's full buffer (forward shuffle) makes no batch for trainer 1, and trainer 0 drains it only
while it steps; under ``Join`` it waits in its step's collective for trainer 1 -- a deadlock (seen at
60k rows/hour in ``tests/training/jobkit``). Rounds also keep the Adam states identical. The first
round in which any rank has data builds the model on every rank with the lowest ready rank's widths
(same seed; DDP broadcasts rank 0's parameters anyway): a rank without any batch still takes part.

**Averaging, MTRM.** A comm hook divides each gradient by the number of ranks that trained it in the
round (MTRM: ranks of kind ``batch`` for the memory tower, ``stream`` for the adapt tower), then sums;
a tower no rank trained is not sent. MTRM steps train one tower (``find_unused_parameters=True``):
a parameter unused on *every* rank keeps ``grad=None`` and Adam skips it; one used on *some* rank
gets the gradient on every rank. A zero-row forward marks its tower used with a zero gradient, which
Adam's momentum would still move: so a null step runs a kind some ready rank trains. The stream loss
gives the memory tower exactly zero gradient (``MTRM.memory_state`` is detached). No checkpoints.

Example::

    with LocalDataPlane(job_path, data_root, tasks, executors=2, trainers=2) as plane:
        results = run_ddp(plane, job.training, world_size=2)
    assert len({r.params_checksum for r in results}) == 1     # identical replicas
"""

from __future__ import annotations

import hashlib
import itertools
import pickle
import queue as queue_mod
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from primus_dagster.data import Batch, DriverClient, LocalDataPlane, RemoteReader
from primus_dagster.ports import free_port
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.models import MTRM, build_model
from primus_dagster.training.priority import MixturePriority
from primus_dagster.training.trainer import Trainer, TrainerStats


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


def _average_hook(state: _RankLoop, bucket):  # DDP rejects string annotations
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


class _RankLoop:
    """One rank's rounds (module docstring). ``pull(wait_s)``: a reader batch; None: ended;
    TimeoutError: none yet."""

    def __init__(self, spec: TrainingSpec, pull: Callable[[float], Batch | None], record_ids: bool):
        self.spec, self.pull, self.pending, self.ended = spec, pull, deque[Batch](), False
        self.trainer: Trainer | None = None
        self.widths, self.null_steps, self.comm_s, self.sent = (0, 0), 0, 0.0, 0  # comm hook: seconds, bytes
        self.group: dict[int, str] = {}  # id(parameter) -> memory | adapt | all
        self.divisor = {"memory": 1, "adapt": 1, "all": 1}  # of each group in this round (0: not sent)
        self.sample_ids: list[int] | None = [] if record_ids else None

    def _head(self, wait_s: float) -> Batch | None:
        if not self.pending and not self.ended:
            try:
                batch = self.pull(wait_s)
            except TimeoutError:
                return None
            self.ended, size = batch is None, self.spec.batch_size
            if batch is not None:
                self.pending.extend(batch.slice(s, s + size) for s in range(0, batch.rows, size))
        return self.pending[0] if self.pending else None

    def _build(self, n_dense: int, n_sparse: int) -> Trainer:
        # Dense embedding gradients: the comm hook reduces flat dense buckets (sparse_embeddings off).
        model_spec = self.spec.model.model_copy(update={"sparse_embeddings": False})
        model = build_model(model_spec, n_dense, n_sparse, seed=self.spec.seed)
        mtrm = isinstance(model, MTRM)
        ddp = DistributedDataParallel(
            model, find_unused_parameters=mtrm, forward_sync_buffers=False, gradient_as_bucket_view=True
        )
        self.group = {id(p): (name.split(".")[0] if mtrm else "all") for name, p in model.named_parameters()}
        ddp.register_comm_hook(self, _average_hook)
        self.trainer, self.widths = Trainer(model, self.spec, module=ddp, observe_labels=False), (n_dense, n_sparse)
        return self.trainer

    def _null_step(self, trainer: Trainer, kind: str) -> None:
        trainer.optimizer.zero_grad(set_to_none=True)
        dense, sparse = torch.zeros(0, self.widths[0]), torch.zeros(0, self.widths[1], dtype=torch.int64)
        (trainer.module(dense, sparse, kind).sum() * 0.0).backward()
        trainer.optimizer.step()
        self.null_steps += 1

    def run(self, max_rounds: int | None = None) -> None:
        """Rounds until every rank's data ended (or ``max_rounds`` training rounds)."""
        wait_s, rounds = 0.0, 0
        while max_rounds is None or rounds < max_rounds:
            head = self._head(wait_s)
            mine = (
                [0, int(self.ended), -1, 0, 0]
                if head is None
                else [1, int(self.ended), int(head.kind == "stream"), head.dense.shape[1], head.sparse.shape[1]]
            )
            rows = [torch.empty(5, dtype=torch.int64) for _ in range(dist.get_world_size())]
            dist.all_gather(rows, torch.tensor(mine, dtype=torch.int64))
            table = torch.stack(rows)
            ready = table[table[:, 0] == 1]
            if not len(ready):
                if bool((table[:, 1] == 1).all()):
                    return
                wait_s = 0.02  # after a round in which nobody had data, every rank waits for some a little
                continue
            wait_s, rounds = 0.0, rounds + 1
            trainer = self.trainer or self._build(int(ready[0, 3]), int(ready[0, 4]))
            if (widths := {(int(r[3]), int(r[4])) for r in ready}) != {self.widths}:
                raise ValueError(f"batches of input widths {sorted(widths)}; the model's: {self.widths}")
            n_batch, n_stream = int((ready[:, 2] == 0).sum()), int((ready[:, 2] == 1).sum())
            self.divisor.update(memory=n_batch, adapt=n_stream, all=len(ready))
            if head is None:
                self._null_step(trainer, "batch" if n_batch else "stream")
                continue
            trainer.train_step(self.pending.popleft())
            if self.sample_ids is not None and head.sample_id is not None:
                self.sample_ids.extend(head.sample_id.tolist())

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


def _serve(
    rank: int, world_size: int, init_method: str, n_threads: int, out_queue: Any, body: Callable[[], RankResult]
) -> None:
    """Join the group, run ``body``; put ``(rank, "ok", result)`` or ``(rank, "error", (time, traceback))``
    -- the time taken before leaving the group, whose end makes the other ranks fail too."""
    torch.set_num_threads(n_threads)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
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
            loop = _RankLoop(spec, lambda wait_s: reader.next_batch(timeout=wait_s), record_ids)
            loop.run()
        return loop.result(rank, time.perf_counter() - started, time.process_time() - cpu0)

    _serve(rank, world_size, init_method, n_threads, out_queue, body)


def ddp_in_memory_worker(
    rank: int,
    world_size: int,
    init_method: str,
    training_spec_json: str,
    n_threads: int,
    out_queue: Any,
    shard_paths: list[str],
    warmup_steps: int,
) -> None:
    """One rank on in-memory micro-batches (a pickled list of :class:`Batch` at ``shard_paths[rank]``): ``warmup_steps`` rounds, then the timed loop over the whole shard. ``extra``:
    seconds in the comm hook, bytes it allreduced per round, seconds of one allreduce of that size."""

    def body() -> RankResult:
        with open(shard_paths[rank], "rb") as file:
            shard: list[Batch] = pickle.load(file)  # written by the caller (bench/train_throughput.py)
        warm = itertools.cycle(shard)
        loop = _RankLoop(TrainingSpec.model_validate_json(training_spec_json), lambda _: next(warm), False)
        loop.run(max_rounds=warmup_steps)
        assert loop.trainer is not None
        loop.trainer.counters, loop.comm_s, loop.sent, loop.null_steps = TrainerStats(), 0.0, 0, 0
        timed = iter(shard)
        loop.pull, loop.pending = (lambda _: next(timed, None)), deque()
        dist.barrier()
        started, cpu0 = time.perf_counter(), time.process_time()
        loop.run()
        dist.barrier()
        result = loop.result(rank, time.perf_counter() - started, time.process_time() - cpu0)
        per_step = loop.sent / max(1, result.steps + result.null_steps)
        flat, probe0 = torch.zeros(int(per_step) // 4), time.perf_counter()
        for _ in range(5):
            dist.all_reduce(flat)
        result.extra = {
            "comm_hook_s": loop.comm_s,
            "allreduce_bytes_per_step": per_step,
            "allreduce_probe_s": (time.perf_counter() - probe0) / 5,
        }
        return result

    _serve(rank, world_size, init_method, n_threads, out_queue, body)


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
    timeout_s: float = 600,
) -> list[RankResult]:
    """Train ``spec``'s model on the plane's data with ``world_size`` DDP ranks (``spawn``-ed
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
        ),
        timeout_s,
    )


def run_ddp_in_memory(
    shard_paths: list[str],
    spec: TrainingSpec,
    *,
    threads_per_rank: int = 1,
    warmup_steps: int = 5,
    timeout_s: float = 600,
) -> list[RankResult]:
    """:func:`ddp_in_memory_worker` on ``len(shard_paths)`` ranks (benchmarks: DDP without a data plane)."""
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
        ),
        timeout_s,
    )

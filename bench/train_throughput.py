"""Training throughput: MTRM vs the single tower, the whole pipeline vs in-memory, DDP speedup, vs TorchRec.

Data: ``--hours`` hours of the synthetic world (seed 5, ~``--rows`` impressions in all, 13 dense +
5 sparse features), made canonical in memory (``SyntheticWorld`` -> ``Normalizer`` ->
``Batch.from_arrow``): the *batch copy* (complete labels) and the *stream copy* (clicks within
the stream label window only) of the same rows. Model: the example job's shape -- embedding_dim 16,
hash_buckets 100000 (one table per tower), memory_hidden [64, 32], adapt_hidden [128, 64] -- lr 1e-3,
micro-batches of ``--batch-size`` (1024) rows; torch runs 1 thread. Parts 1 and 2 train as a job
does: sparse embedding gradients with a lazy SparseAdam (only the touched rows) + Adam for the
rest; DDP (part 3) uses dense embedding gradients (its comm hook reduces flat dense buckets), so
its 1-rank figure is below part 1's.

1. ``mtrm_samples_per_s`` / ``single_samples_per_s``: ``Trainer.train_step`` over in-memory
   micro-batches in mixed fashion -- micro-batch ``i`` takes rows ``[i*B, (i+1)*B)`` from the batch
   copy when ``i`` is even, from the stream copy when odd (so MTRM alternates its towers; the single
   tower ignores the kind). Samples per CPU-second of this process (``getrusage``; wall figures in
   "detail"), after 5 warm-up steps. ``mtrm_overhead_ratio`` = single / mtrm (> 1: MTRM is slower).
2. ``pipeline_samples_per_s``: the whole pipeline for the **single tower** on the batch copy --
   Parquet written by ``write_world`` (2 files an hour) -> planner -> ``PooledDataPlane`` over a
   ``LocalPool`` (driver + 2 executor processes, shared memory; ``_common.local_plane``) -> ``RemoteReader`` -> ``Batch`` ->
   ``Trainer.train`` -- in samples per CPU-second of *every* process (this one: trainer, reader,
   driver; plus the executors after they were ready, ``plane.cpu_seconds(include_startup=False)``),
   from the first batch asked for to the last step. ``in_memory_samples_per_s``: the same model on
   the same rows from in-memory tensors (the ceiling), per CPU-second of this process.
   ``pipeline_ratio`` = pipeline / in_memory, **both per CPU-second**, of the medians of
   ``--pipeline-repeat`` (3) interleaved runs of each (a run is about a second: one is at the mercy of
   the machine's other load; ``detail.pipeline_ratios_per_repeat`` pairs them); the wall-clock figures
   (``pipeline_wall_samples_per_s``, ``in_memory_wall_samples_per_s``) are reported beside them.
   ``executor_startup_cpu_s_per_executor``: what each executor process spent before it announced it
   was ready (interpreter, imports, warm-up; not in the ratio), the mean of the run's executors.
   ``in_memory_beside_decoder_ratio`` (diagnostic, not a pipeline figure): the in-memory run again,
   each repeat, while one other process decodes the same Parquet files in a loop on another core (a
   data executor's work without the executor): the trainer's samples per CPU-second with it beside
   over alone, the median of the repeats. Below 1, the trainer's own CPU per sample grows when data
   work runs beside it (shared caches and memory bandwidth; on this 2-vCPU VM 0.72-0.97 over twelve
   paired runs): the pipeline's trainer runs beside its executors, the in-memory ceiling alone, so
   ``pipeline_ratio`` cannot reach 1 by removing the data path's own CPU alone. Null on one core.
3. ``ddp_speedup``: aggregate samples per wall-second of 2 ranks x 1 thread over 1 rank x 1 thread
   (world_size 2 vs 1, ``_ddp.run_ddp_in_memory``: the round protocol of
   ``primus_dagster.training.distributed`` that multi-trainer jobs run; ``--ddp-pin`` binds each rank
   to a core of its own: it helps on a quiet machine, and hurts a lot while other jobs load the cores
   -- measured at load 6: speedup 0.5 pinned, 1.37 unpinned), with the **row-sparse gradient exchange** (sparse embedding gradients; each rank coalesces
   its touched rows once and sends one message a round -- status, rows, dense gradients -- over
   direct sockets between the ranks (``PeerMesh``: no gloo collective, no padding); every rank sums
   them into one coalesced gradient for the lazy SparseAdam; a group of 1 exchanges nothing: it is a
   single trainer), each rank training from in-memory tensors: MTRM on the micro-batches of part 1,
   dealt to the ranks in (batch, stream) pairs so both ranks train the same tower in a round; same
   total rows. Only the training loop after 5 warm-up rounds is timed (not process start).
   ``ddp_exchange_bytes_per_step``: bytes of one rank's message per round (mean of the ranks).
   ``ddp_cpu_per_sample_ratio``: CPU-seconds per sample of the 2 ranks (every thread) over 1 rank's
   -- what the group adds; on this 2-core machine the speedup cannot exceed ``2 / ratio``, and less
   when other processes run. "detail.ddp.ws2" has the exchange's seconds per round: ``pack_s``
   (coalescing, the message), ``gather_s`` (sending and receiving, *waiting for the peer included*:
   mostly the other rank's compute imbalance) and ``apply_s`` (merging the rows, summing).
   Measured side by side while other jobs loaded the 2 cores (load average 6-7, unpinned): ratio
   1.12-1.21 and speedup 1.37 against 1.47-1.68 and 0.49-1.34 with the former exchange (two gloo
   all-gathers a round, the second padded: gloo's threads took ~1 ms of CPU per collective on this
   VM whatever its size). The wall-clock speedup is only meaningful on a quiet machine.
   ``ddp_speedup_dense_allreduce``: the same with DDP's dense all-reduce of the trained tower
   (``_ddp.DenseDDPExchange``)
   (its dense 100000 x 16 embedding gradient: 6.4 MB a step; ``ddp_dense_allreduce_bytes_per_step``),
   the exchange before the row-sparse one. The load average at start and end is in "detail":
   wall-clock figures are only as good as the machine is quiet.
4. ``ratio_vs_torchrec``: the single tower next to TorchRec's DLRM, trained in this run,
   side by side, on the same synthetic in-memory rows: ``--torchrec-batches`` (20) batches of 2048 rows,
   13 dense features (``log1p|N(0,1)|``), 26 sparse features with one id each, uniform in [0, 10 000),
   ~25 % positives; 1 torch thread. Shapes: TorchRec has 26 ``EmbeddingBag`` tables of 10 000 x 16
   (sum pooling), dense arch [16], pairwise-dot interaction, over arch [128, 64, 1]; ours
   (``dlrm_shape_spec``) one hashed table of 26 x 10 000 = 260 000 rows x 16 shared by the 26 features
   (the same capacity: 4 160 000 embedding parameters on both sides; ours hashes (feature, id) pairs
   into it, so pairs may collide where TorchRec's are 1:1), bottom 13 -> 16 (+ReLU, = dense arch [16]),
   top [128, 64] -> 1 on the concatenation (16 + 26 x 16 = 432 wide; DLRM's over arch reads 16 + 351
   dot products = 367): 63 969 dense parameters against DLRM's 55 649 (``detail.vs_torchrec``).
   **Ours** trains as a job does: ``Trainer.train_step`` (sparse embedding gradients, lazy SparseAdam
   for the table + Adam, lr 1e-3); its timing covers the NaN checks, zero_grad, hashing, lookup, MLPs,
   BCE, backward, both optimiser steps, the counters and ``float(loss)`` -- the ``Batch`` tensors are
   converted before. **TorchRec** (Adagrad, lr 1e-3) in three configurations, the fastest is the
   baseline: ``dmp_fused`` (its docs' and DLRM example's way, CPU included: ``apply_optimizer_in_backward``
   on the tables, ``DistributedModelParallel`` over a 1-rank gloo group, which shards them to FBGEMM's
   fused CPU kernel -- the table update runs inside backward -- and plain Adagrad for the dense
   parameters), ``dense_adagrad`` (unsharded, one plain Adagrad over everything) and
   ``in_backward_unsharded`` (unsharded, Adagrad applied in backward to the tables); its timing covers
   zero_grad, ``DLRMTrain`` forward (lookup, MLPs, interaction, BCE), backward, the optimizer step and
   ``float(loss)`` -- the ``KeyedJaggedTensor`` of every batch is built before (like our tensors).
   After 5 warm-up steps each, ``--torchrec-repeats`` (7) timed passes over the batches per side,
   interleaved (the order rotated each repeat); samples per CPU-second of this process; medians.
   **Ours, before that, trains on until its kernels are the compiled ones** (``steady_state``: the
   spec's ``training.compile: auto`` compiles the tables' backward and Adam step in the background
   after ``compile_after_steps`` = 1000 steps and switches when ready; training/kernels.py): its timed
   figure is the steady state of every run past 1000 steps with the shipped defaults. **Beside it an
   eager twin** (the same model and seed, ``compile: off``: every run's first 1000 steps) is timed in the
   same rotation: ``ratio_vs_torchrec_eager``, ``single_dlrm_shape_eager_samples_per_s``.
   ``ratio_vs_torchrec`` = ours / the fastest TorchRec configuration (``torchrec_mode``;
   ``paired_ratios`` in "detail" are the per-repeat ratios). ``--only-torchrec`` runs only this part.
   Without TorchRec the keys are ``ratio_vs_torchrec: null`` and ``torchrec_note``. Install it (the
   1.8 pair is the one checked with torch 2.13 here; torchrec's metadata requires the CUDA fbgemm-gpu,
   hence ``--no-deps``)::

       pip install -c constraints.txt -e ".[bench]"           # fbgemm-gpu-cpu + torchrec's pure-Python deps
       pip install -c constraints.txt --no-deps torchrec==1.8.0

5. ``ratio_vs_torchrec_multihot``: the same comparison on a multi-hot shape -- 8 list
   features, each row 0..20 ids per feature (uniform: mean 10), ids uniform in [0, 10 000), 13 dense,
   2048-row batches. TorchRec: DLRM over an ``EmbeddingBagCollection`` of 8 tables of 10 000 x 16 (sum
   pooling) on the ``KeyedJaggedTensor`` of each batch, the same three configurations; ours
   (``multihot_spec``): the single tower with each list in a declared table of its own (10 000 x 16,
   ``pooling: sum``), the jagged ids pooled by ``embedding_bag`` (``Batch.lists``, no padding); warmed to
   its compiled kernels as in part 4, with its eager twin beside it (``ratio_vs_torchrec_multihot_eager``,
   ``single_multihot_eager_samples_per_s``). Runs with part 4 (``--only-torchrec`` included);
   "detail.vs_torchrec.multihot" has the runs.

Last line: {"bench": "train_throughput", "mtrm_samples_per_s", "single_samples_per_s",
"mtrm_overhead_ratio", "pipeline_samples_per_s", "in_memory_samples_per_s", "pipeline_ratio",
"in_memory_beside_decoder_ratio",
"ddp_speedup", "ddp_exchange_bytes_per_step", "ddp_speedup_dense_allreduce", "ratio_vs_torchrec",
"ratio_vs_torchrec_eager", "torchrec_samples_per_s", "torchrec_mode", "single_dlrm_shape_samples_per_s",
"single_dlrm_shape_eager_samples_per_s", "ratio_vs_torchrec_multihot", "ratio_vs_torchrec_multihot_eager",
"torchrec_multihot_samples_per_s", "torchrec_multihot_mode", "single_multihot_samples_per_s",
"single_multihot_eager_samples_per_s", ...details}
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import shutil
import statistics
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

from primus_dagster.data import Batch, Jagged, Normalizer, Planner, SourceContext, TimeWindow
from primus_dagster.spec import load_job_spec
from primus_dagster.spec.job import ModelSpec, TrainingSpec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world
from primus_dagster.training.features import FeatureLayout
from primus_dagster.training.loop import RankResult
from primus_dagster.training.models import HashedEmbedding, build_model, model_summary, sparse_tables
from primus_dagster.training.trainer import Trainer

from _common import PARQUET_DATASET, bench_dir, cpu_self, decoding_beside, emit, local_plane
from _ddp import Exchange, run_ddp_in_memory

JOB = (
    """
name: bench-train
pools: {data: {replicas: 2}, training: {replicas: 1}}
"""
    + PARQUET_DATASET
)


def spec_of(model: str, batch_size: int, buckets: int = 100_000) -> TrainingSpec:
    return TrainingSpec(
        mode="mixed",
        batch_size=batch_size,
        learning_rate=1e-3,
        seed=0,
        model=ModelSpec(
            type=model, embedding_dim=16, hash_buckets=buckets, memory_hidden=[64, 32], adapt_hidden=[128, 64]
        ),
    )


def world_batches(job, world: SyntheticWorld, hours: int) -> tuple[Batch, Batch]:
    """(batch copy, stream copy) of the world's first ``hours`` hours, canonical, in memory (tensors
    converted: micro-batches are slices of them)."""
    norm = Normalizer(job.dataset.source("src"))
    batch, stream = [], []
    for h in range(hours):
        table = world.hour(h)
        for copy, out, kind in ((table, batch, "batch"), (world.stream_copy(table), stream, "stream")):
            canonical = norm(copy.combine_chunks().to_batches()[0])
            out.append(Batch.from_arrow(canonical, kind=kind))
    batch_copy, stream_copy = Batch.concat(batch), Batch.concat(stream)
    batch_copy.tensors, stream_copy.tensors  # noqa: B018 - convert once, before any timing
    return batch_copy, stream_copy


def mixed_micro(batch: Batch, stream: Batch, size: int) -> list[Batch]:
    """Micro-batch i: rows [i*size, (i+1)*size) of the batch copy (i even) or the stream copy (i odd)."""
    return [
        (batch if i % 2 == 0 else stream).slice(start, start + size)
        for i, start in enumerate(range(0, batch.rows, size))
    ]


def train_in_memory(spec: TrainingSpec, micro: list[Batch], warmup: int = 5) -> dict:
    trainer = Trainer(build_model(spec.model, micro[0].dense.shape[1], micro[0].sparse.shape[1], seed=0), spec)
    for batch in micro[:warmup]:
        trainer.train_step(batch)
    cpu0, wall0 = cpu_self(), time.perf_counter()
    samples = 0
    for batch in micro:
        trainer.train_step(batch)
        samples += batch.rows
    cpu, wall = cpu_self() - cpu0, time.perf_counter() - wall0
    return {
        "samples": samples,
        "steps": len(micro),
        "cpu_s": round(cpu, 3),
        "wall_s": round(wall, 3),
        "samples_per_cpu_s": round(samples / cpu),
        "samples_per_wall_s": round(samples / wall),
    }


def train_beside_decoder(spec: TrainingSpec, micro: list[Batch], files: list[str]) -> dict:
    """:func:`train_in_memory` while another process decodes ``files`` (the module docstring)."""
    with decoding_beside(files):
        return train_in_memory(spec, micro)


def run_pipeline(job_path: Path, root: Path, window: TimeWindow, spec: TrainingSpec, executors: int) -> dict:
    job = load_job_spec(job_path)
    tasks = list(Planner(job.dataset, SourceContext(str(root)), threads=2).plan(window).tasks)
    trainer = Trainer(build_model(spec.model, 13, 5, seed=0), spec)
    with local_plane(job_path, root, tasks, executors=executors, trainers=1) as plane:
        cpu0, wall0 = cpu_self(), time.perf_counter()
        with plane.reader(0) as reader:
            for batch in reader:
                trainer.train(batch)
        wall, cpu_trainer = time.perf_counter() - wall0, cpu_self() - cpu0
        plane.wait_executors(30)
        cpu_exec = plane.cpu_seconds(include_startup=False)
        startup = plane.cpu_seconds() - cpu_exec
    samples = trainer.counters.samples
    cpu = cpu_trainer + cpu_exec
    return {
        "samples": samples,
        "steps": trainer.counters.step,
        "tasks": len(tasks),
        "wall_s": round(wall, 3),
        "trainer_process_cpu_s": round(cpu_trainer, 3),
        "executors_cpu_s": round(cpu_exec, 3),
        "executor_startup_cpu_s": round(startup, 3),  # not in the ratio: interpreter, imports, warm-up
        "executor_startup_cpu_s_per_executor": round(startup / executors, 3),
        "train_s": round(trainer.counters.train_s, 3),
        "samples_per_cpu_s": round(samples / cpu),
        "samples_per_wall_s": round(samples / wall),
    }


def run_ddp_part(
    micro: list[Batch], spec: TrainingSpec, directory: Path, world_size: int, exchange: Exchange, pin: bool = False
) -> dict:
    """``world_size`` ranks, the (batch, stream) pairs of ``micro`` dealt round-robin; ``pin``: a core each."""
    pairs = [micro[i : i + 2] for i in range(0, len(micro), 2)]
    paths = []
    for rank in range(world_size):
        shard = [batch for pair in pairs[rank::world_size] for batch in pair]
        paths.append(str(directory / f"shard-{world_size}-{rank}.pkl"))
        Path(paths[-1]).write_bytes(pickle.dumps(shard))
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cores = [[cpus[r]] for r in range(world_size)] if pin and len(cpus) >= world_size else None
    results: list[RankResult] = run_ddp_in_memory(
        paths, spec, threads_per_rank=1, warmup_steps=5, exchange=exchange, timeout_s=600, cores=cores
    )
    samples = sum(r.samples for r in results)
    wall = max(r.wall_s for r in results)
    rounds = results[0].steps + results[0].null_steps
    if exchange != "row_wise" and len({r.params_checksum for r in results}) != 1:  # row_wise: each its rows
        raise AssertionError("replicas diverged")
    return {
        "world_size": world_size,
        "exchange": exchange,
        "samples": samples,
        "rounds": rounds,
        "wall_s": round(wall, 3),
        "samples_per_s": round(samples / wall),
        "step_s": round(wall / rounds, 5),
        "cpu_s": round(sum(r.cpu_s for r in results), 3),
        "exchange_s_per_step": round(results[0].extra["exchange_s"] / rounds, 5),
        **{
            f"{k}_per_step": round(sum(r.extra[k] for r in results) / len(results) / rounds, 5)
            for k in ("pack_s", "gather_s", "apply_s")
            if k in results[0].extra
        },
        "cores": cores,
        "exchange_bytes_per_step": int(sum(r.extra["exchange_bytes_per_step"] for r in results) / len(results)),
        "allreduce_probe_s": round(results[0].extra["allreduce_probe_s"], 5),
        "peak_rss_mb": round(max(r.extra["peak_rss_mb"] for r in results), 1),  # the larger rank's
    }


def ddp_speedup(
    micro: list[Batch], spec: TrainingSpec, directory: Path, exchange: Exchange, pin: bool = False
) -> tuple[float, dict, dict]:
    one = run_ddp_part(micro, spec, directory, 1, exchange, pin)
    two = run_ddp_part(micro, spec, directory, 2, exchange, pin)
    return two["samples_per_s"] / one["samples_per_s"], one, two


# ----------------------------------------------------------------------------- part 4: vs TorchRec
DLRM_FEATURES, DLRM_ROWS, DLRM_DIM, DLRM_DENSE = 26, 10_000, 16, 13
DLRM_TOP = [128, 64]  # hidden layers of our top MLP = DLRM's over arch [128, 64, 1] (its last layer is the logit)
TORCHREC_INSTALL = (
    'pip install -c constraints.txt -e ".[bench]" && pip install -c constraints.txt --no-deps torchrec==1.8.0'
)


def dlrm_shape_spec(batch_size: int) -> TrainingSpec:
    """Our single tower on the DLRM shapes: one shared hashed table of 26 x 10 000 rows of dim 16 (the
    capacity of TorchRec's 26 tables of 10 000 rows), bottom 13 -> 16 (+ReLU), top [128, 64] -> 1."""
    return TrainingSpec(
        mode="batch",
        batch_size=batch_size,
        learning_rate=1e-3,
        seed=0,
        model=ModelSpec(
            type="single",
            embedding_dim=DLRM_DIM,
            hash_buckets=DLRM_FEATURES * DLRM_ROWS,
            adapt_hidden=list(DLRM_TOP),
            sparse_embeddings=True,
        ),
    )


def dlrm_shape_batches(n: int, batch_size: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``n`` synthetic batches ``(dense float32 [B, 13], ids int64 [B, 26] uniform in [0, 10 000), label
    float32 [B] with ~25 % positives)``; both sides train on exactly these rows."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        dense = torch.randn(batch_size, DLRM_DENSE, generator=g).abs_().log1p_()  # non-negative, like log(1 + count)
        ids = torch.randint(0, DLRM_ROWS, (batch_size, DLRM_FEATURES), generator=g, dtype=torch.int64)
        label = (torch.rand(batch_size, generator=g) < 0.25).to(torch.float32)
        out.append((dense, ids, label))
    return out


class _TorchRecSide:
    """TorchRec's DLRM on the same rows, in one of three configurations:

    * ``dmp_fused`` -- what TorchRec's DLRM example and docs do (also on CPU): Adagrad applied in backward
      to the tables (``apply_optimizer_in_backward``), the model wrapped in ``DistributedModelParallel``
      (gloo group of 1 rank; the planner shards the tables to FBGEMM's fused CPU kernel, whose optimizer
      updates the touched rows inside backward), plain ``torch.optim.Adagrad`` for the dense parameters
      (``in_backward_optimizer_filter``), both behind a ``CombinedOptimizer``.
    * ``dense_adagrad`` -- the unsharded model (``EmbeddingBagCollection`` of ``nn.EmbeddingBag``) with
      one plain ``torch.optim.Adagrad`` over every parameter (dense table gradients).
    * ``in_backward_unsharded`` -- the unsharded model with ``apply_optimizer_in_backward(Adagrad)`` on
      the tables and plain Adagrad for the rest (no DMP).
    """

    def __init__(self, mode: str, lr: float = 1e-3, n_features: int = DLRM_FEATURES):
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
        from torchrec.models.dlrm import DLRM, DLRMTrain
        from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
        from torchrec.optim.optimizers import in_backward_optimizer_filter

        self.mode = mode
        tables = [
            EmbeddingBagConfig(name=f"t{i}", embedding_dim=DLRM_DIM, num_embeddings=DLRM_ROWS, feature_names=[f"f{i}"])
            for i in range(n_features)
        ]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
            dlrm = DLRM(
                embedding_bag_collection=ebc,
                dense_in_features=DLRM_DENSE,
                dense_arch_layer_sizes=[DLRM_DIM],
                over_arch_layer_sizes=[*DLRM_TOP, 1],
            )
        emb = sum(p.numel() for p in dlrm.sparse_arch.parameters())
        self.params = {"params": sum(p.numel() for p in dlrm.parameters()), "embedding_params": emb}
        self.params["dense_params"] = self.params["params"] - emb
        model: nn.Module = DLRMTrain(dlrm)
        self.kernel = "nn.EmbeddingBag (unsharded)"
        if mode == "dense_adagrad":
            self.optimizer: Any = torch.optim.Adagrad(model.parameters(), lr=lr)
        else:
            from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

            apply_optimizer_in_backward(torch.optim.Adagrad, dlrm.sparse_arch.parameters(), {"lr": lr})
            if mode == "dmp_fused":
                from torchrec.distributed import DistributedModelParallel

                model = DistributedModelParallel(module=model, device=torch.device("cpu"))
                plan: Any = model.plan
                self.kernel = ",".join(sorted({s.compute_kernel for p in plan.plan.values() for s in p.values()}))
                fused = [model.fused_optimizer]
            else:
                fused = []
            dense = KeyedOptimizerWrapper(
                dict(in_backward_optimizer_filter(model.named_parameters())),
                lambda params: torch.optim.Adagrad(params, lr=lr),
            )
            self.optimizer = CombinedOptimizer([*fused, dense])
        self.model = model

    def step(self, batch: Any) -> float:
        self.optimizer.zero_grad()
        loss, _ = self.model(batch)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())


def _torchrec_batches(batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> list[Any]:
    """TorchRec's ``Batch`` of each (the KeyedJaggedTensor built here, outside any timing)."""
    from torchrec import KeyedJaggedTensor
    from torchrec.datasets.utils import Batch as TorchRecBatch

    keys = [f"f{i}" for i in range(DLRM_FEATURES)]
    out = []
    for dense, ids, label in batches:
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=ids.t().contiguous().reshape(-1),  # feature-major: feature f's B ids, then f+1's
            lengths=torch.ones(DLRM_FEATURES * ids.shape[0], dtype=torch.int32),
        )
        out.append(TorchRecBatch(dense_features=dense, sparse_features=kjt, labels=label))
    return out


def _timed(step: Callable[[Any], float], batches: list[Any]) -> tuple[float, float, float]:
    """(CPU-seconds of this process, wall seconds, last loss) of one pass of ``step`` over ``batches``."""
    cpu0, wall0 = cpu_self(), time.perf_counter()
    loss = float("nan")
    for batch in batches:
        loss = step(batch)
    return cpu_self() - cpu0, time.perf_counter() - wall0, loss


STEADY_MAX_STEPS = 20_000  # bound of the warm-up to the compiled kernels (training.compile auto)


def steady_state(trainer: Trainer, batches: list[Any]) -> dict[str, Any]:
    """Train ``trainer`` (the spec's defaults) over ``batches``, round and round, until its kernels are the
    compiled ones -- ``training.compile: auto`` switches once the background compile that starts at
    ``compile_after_steps`` is ready: what every step of a long run trains on after that -- at most
    :data:`STEADY_MAX_STEPS` steps; the steps and seconds it took, and the kernels' line."""
    started, steps = time.perf_counter(), 0
    while trainer.kernels.switched_at is None and steps < STEADY_MAX_STEPS:
        trainer.train_step(batches[steps % len(batches)])
        steps += 1
    return {
        "warmup_steps": steps,
        "warmup_s": round(time.perf_counter() - started, 1),
        "kernels": trainer.kernels.describe(),
    }


def eager_twin(spec: TrainingSpec, build: Callable[[], Any]) -> Trainer:
    """A trainer of the same model (``build``: from the same seed) with ``training.compile: off``: the
    kernels of every run's first ``compile_after_steps`` steps."""
    return Trainer(build(), spec.model_copy(update={"compile": "off"}))


def run_vs_torchrec(batch_size: int, n_batches: int, repeats: int, warmup: int = 5) -> tuple[dict, dict]:
    """Part 4: (result keys, detail) of our single tower vs TorchRec's DLRM on the same rows."""
    rows = dlrm_shape_batches(n_batches, batch_size)
    spec = dlrm_shape_spec(batch_size)
    ours_batches = [Batch.from_tensors(d, s, y, kind="batch") for d, s, y in rows]
    for b in ours_batches:
        b.tensors  # noqa: B018 - converted before timing, as the in-memory parts do
    model = build_model(spec.model, DLRM_DENSE, DLRM_FEATURES, seed=0)
    summary = model_summary(model)
    emb = sum(m.table.weight.numel() for m in model.modules() if isinstance(m, HashedEmbedding))
    trainer = Trainer(model, spec)
    steady = steady_state(trainer, ours_batches)
    eager = eager_twin(spec, lambda: build_model(spec.model, DLRM_DENSE, DLRM_FEATURES, seed=0))
    steps: dict[str, Callable[[Any], float]] = {"ours": trainer.train_step, "ours_eager": eager.train_step}
    inputs: dict[str, list[Any]] = {"ours": ours_batches, "ours_eager": ours_batches}
    detail: dict = {
        "shape": {
            "sparse_features": DLRM_FEATURES,
            "rows_per_table": DLRM_ROWS,
            "embedding_dim": DLRM_DIM,
            "dense_features": DLRM_DENSE,
            "batch_size": batch_size,
            "ids": f"uniform in [0, {DLRM_ROWS}) per feature, one id per feature per row",
        },
        "batches": n_batches,
        "repeats": repeats,
        "torch_threads": torch.get_num_threads(),
        "ours": {
            "model": f"SingleTower: one hashed table of {spec.model.hash_buckets} x {DLRM_DIM} shared by the "
            f"{DLRM_FEATURES} features; bottom {DLRM_DENSE}->{DLRM_DIM}; top MLP {DLRM_TOP} on the concat "
            f"({DLRM_DIM} + {DLRM_FEATURES}x{DLRM_DIM}) -> 1",
            "optimizer": "SparseAdam (touched rows) + Adam, lr 1e-3 (Trainer / RecOptimizer)",
            "timed": "Trainer.train_step per batch: NaN checks, zero_grad, hashing, lookup, MLPs, BCE, backward, "
            "SparseAdam + Adam steps, counters, float(loss); tensors converted before",
            "steady_state": steady,
            "params": summary["params"],
            "embedding_params": emb,
            "dense_params": summary["params"] - emb,
        },
    }
    root = logging.getLogger()
    level = root.level
    with warnings.catch_warnings():  # torchrec and its planner warn at length about a 1-rank CPU "cluster"
        warnings.simplefilter("ignore")
        root.setLevel(logging.ERROR)
        try:
            try:
                import torchrec.models.dlrm  # noqa: F401
            except ImportError as e:  # not installed, or without its deps
                detail["torchrec"] = {"note": f"TorchRec not importable ({e}); install: {TORCHREC_INSTALL}"}
                return {"ratio_vs_torchrec": None}, detail
            return _measure_vs_torchrec(
                lambda: _torchrec_batches(rows), DLRM_FEATURES, steps, inputs, detail, batch_size, repeats, warmup
            )
        finally:
            root.setLevel(level)


def _measure_vs_torchrec(
    tr_batches: Callable[[], list[Any]],
    n_features: int,
    steps: dict[str, Callable[[Any], float]],
    inputs: dict[str, list[Any]],
    detail: dict,
    batch_size: int,
    repeats: int,
    warmup: int,
) -> tuple[dict, dict]:
    """The TorchRec sides next to ours (``steps["ours"]``), interleaved; (result keys, detail)."""
    import importlib.metadata as md
    import tempfile

    import torch.distributed as dist

    store_file = tempfile.NamedTemporaryFile(prefix="torchrec-store-", delete=False)  # noqa: SIM115
    store_file.close()
    created_group = not dist.is_initialized()
    if created_group:
        dist.init_process_group("gloo", store=dist.FileStore(store_file.name, 1), rank=0, world_size=1)
    try:
        batches = tr_batches()
        sides: dict[str, _TorchRecSide] = {}
        for mode in TORCHREC_MODES:
            sides[mode] = _TorchRecSide(mode, n_features=n_features)
            steps[mode], inputs[mode] = sides[mode].step, batches
        for name, step in steps.items():  # warm-up (also builds FBGEMM's caches, lazy optimizer state)
            for batch in inputs[name][:warmup]:
                step(batch)
        runs: dict[str, list[dict]] = {name: [] for name in steps}
        for r in range(repeats):  # interleaved: every side once per repeat, the order rotated
            names = list(steps)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                cpu, wall, loss = _timed(steps[name], inputs[name])
                samples = batch_size * len(inputs[name])
                runs[name].append(
                    {
                        "cpu_s": round(cpu, 3),
                        "wall_s": round(wall, 3),
                        "samples_per_cpu_s": round(samples / cpu),
                        "loss": round(loss, 4),
                    }
                )
    finally:
        if created_group:
            dist.destroy_process_group()
        os.unlink(store_file.name)
    med = {name: round(statistics.median(x["samples_per_cpu_s"] for x in runs[name])) for name in runs}
    best = max(TORCHREC_MODES, key=lambda m: med[m])
    paired = [
        runs["ours"][i]["samples_per_cpu_s"] / max(runs[m][i]["samples_per_cpu_s"] for m in TORCHREC_MODES)
        for i in range(repeats)
    ]
    detail["ours"].update(samples_per_cpu_s=med["ours"], runs=runs["ours"])
    detail["ours_eager"] = {"samples_per_cpu_s": med["ours_eager"], "runs": runs["ours_eager"]}
    detail["torchrec"] = {
        "versions": {p: md.version(p) for p in ("torchrec", "fbgemm-gpu-cpu", "torch")},
        "model": f"DLRM: {n_features} EmbeddingBag tables of {DLRM_ROWS} x {DLRM_DIM} (sum pooling), dense arch [{DLRM_DIM}], pairwise-dot interaction, over arch [{', '.join(map(str, DLRM_TOP))}, 1]",
        "timed": "zero_grad, DLRMTrain forward (lookup, MLPs, interaction, BCE), backward (fused modes: the table "
        "update inside it), optimizer step, float(loss); KeyedJaggedTensor built before",
        **sides[best].params,
        "baseline_mode": best,
        "modes": {m: {"kernel": sides[m].kernel, "samples_per_cpu_s": med[m], "runs": runs[m]} for m in TORCHREC_MODES},
    }
    detail["paired_ratios"] = [round(x, 3) for x in paired]  # per repeat: ours / the fastest TorchRec of that repeat
    detail["paired_ratio_median"] = round(statistics.median(paired), 3)
    result = {
        "ratio_vs_torchrec": round(med["ours"] / med[best], 3),
        "ratio_vs_torchrec_eager": round(med["ours_eager"] / med[best], 3),
        "torchrec_samples_per_s": med[best],
        "torchrec_mode": best,
        "single_dlrm_shape_samples_per_s": med["ours"],
        "single_dlrm_shape_eager_samples_per_s": med["ours_eager"],
    }
    return result, detail


TORCHREC_MODES = ("dmp_fused", "dense_adagrad", "in_backward_unsharded")

# ----------------------------------------------------------------------------- part 5: multi-hot vs TorchRec
MULTIHOT_FEATURES, MULTIHOT_MAX_LENGTH = 8, 20  # lengths uniform in [0, 20]: mean 10
MultiHotRow = tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]


def multihot_batches(n: int, batch_size: int, seed: int = 0) -> list[MultiHotRow]:
    """``n`` batches ``(dense [B, 13], per list feature (ids, lengths [B]), label)``: 8 list features,
    lengths uniform in [0, 20] (mean 10), ids uniform in [0, 10 000); both sides train on these rows."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        dense = torch.randn(batch_size, DLRM_DENSE, generator=g).abs_().log1p_()
        lists = []
        for _ in range(MULTIHOT_FEATURES):
            lengths = torch.randint(0, MULTIHOT_MAX_LENGTH + 1, (batch_size,), generator=g, dtype=torch.int64)
            ids = torch.randint(0, DLRM_ROWS, (int(lengths.sum()),), generator=g, dtype=torch.int64)
            lists.append((ids, lengths))
        label = (torch.rand(batch_size, generator=g) < 0.25).to(torch.float32)
        out.append((dense, lists, label))
    return out


def multihot_spec(batch_size: int) -> TrainingSpec:
    """Our single tower on the multi-hot shape: each list feature in a table of its own (10 000 x 16, sum
    pooling: TorchRec's per-feature tables), bottom 13 -> 16, top [128, 64] -> 1."""
    lists = [
        {"name": f"l{i}", "buckets": DLRM_ROWS, "dim": DLRM_DIM, "pooling": "sum"} for i in range(MULTIHOT_FEATURES)
    ]
    return TrainingSpec.model_validate(
        {
            "mode": "batch",
            "batch_size": batch_size,
            "learning_rate": 1e-3,
            "seed": 0,
            "model": {"type": "single", "embedding_dim": DLRM_DIM, "adapt_hidden": list(DLRM_TOP)},
            "features": {"categorical_list": lists},
        }
    )


def _torchrec_multihot_batches(rows: list[MultiHotRow]) -> list[Any]:
    from torchrec import KeyedJaggedTensor
    from torchrec.datasets.utils import Batch as TorchRecBatch

    keys = [f"f{i}" for i in range(MULTIHOT_FEATURES)]
    out = []
    for dense, lists, label in rows:
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=torch.cat([ids for ids, _ in lists]),  # feature-major, as the KJT layout is
            lengths=torch.cat([lengths for _, lengths in lists]).to(torch.int32),
        )
        out.append(TorchRecBatch(dense_features=dense, sparse_features=kjt, labels=label))
    return out


def run_vs_torchrec_multihot(batch_size: int, n_batches: int, repeats: int, warmup: int = 5) -> tuple[dict, dict]:
    """Part 5: (result keys, detail) of our single tower vs TorchRec on 8 list features of mean length 10."""
    rows = multihot_batches(n_batches, batch_size)
    spec = multihot_spec(batch_size)
    names = [f"l{i}" for i in range(MULTIHOT_FEATURES)]
    layout = FeatureLayout.resolve(spec, [f"d{i}" for i in range(DLRM_DENSE)], [], names)
    empty = torch.zeros(batch_size, 0, dtype=torch.int64)
    ours_batches = []
    for dense, lists, label in rows:
        jagged = {
            name: Jagged(ids, torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)]))
            for name, (ids, lengths) in zip(names, lists, strict=True)
        }
        ours_batches.append(Batch.from_tensors(dense, empty, label, kind="batch", lists=jagged))
    for b in ours_batches:
        b.tensors  # noqa: B018 - converted before timing
    model = build_model(spec.model, layout=layout, seed=0)
    summary = model_summary(model)
    emb = sum(p.numel() for p in sparse_tables(model))
    trainer = Trainer(model, spec)
    steady = steady_state(trainer, ours_batches)
    eager = eager_twin(spec, lambda: build_model(spec.model, layout=layout, seed=0))
    detail: dict = {
        "shape": {
            "list_features": MULTIHOT_FEATURES,
            "length": f"uniform in [0, {MULTIHOT_MAX_LENGTH}] ids per feature per row (mean {MULTIHOT_MAX_LENGTH / 2:g})",
            "rows_per_table": DLRM_ROWS,
            "embedding_dim": DLRM_DIM,
            "dense_features": DLRM_DENSE,
            "batch_size": batch_size,
        },
        "batches": n_batches,
        "repeats": repeats,
        "ours": {
            "model": f"SingleTower: {MULTIHOT_FEATURES} hashed tables of {DLRM_ROWS} x {DLRM_DIM} (one per list, "
            f"embedding_bag sum over the jagged ids); bottom {DLRM_DENSE}->{DLRM_DIM}; top MLP {DLRM_TOP} -> 1",
            "optimizer": "SparseAdam (touched rows) + Adam, lr 1e-3 (Trainer / RecOptimizer)",
            "steady_state": steady,
            "params": summary["params"],
            "embedding_params": emb,
            "dense_params": summary["params"] - emb,
        },
    }
    steps: dict[str, Callable[[Any], float]] = {"ours": trainer.train_step, "ours_eager": eager.train_step}
    inputs: dict[str, list[Any]] = {"ours": ours_batches, "ours_eager": ours_batches}
    keys, detail = _measure_vs_torchrec(
        lambda: _torchrec_multihot_batches(rows), MULTIHOT_FEATURES, steps, inputs, detail, batch_size, repeats, warmup
    )
    return {
        "ratio_vs_torchrec_multihot": keys["ratio_vs_torchrec"],
        "ratio_vs_torchrec_multihot_eager": keys["ratio_vs_torchrec_eager"],
        "torchrec_multihot_samples_per_s": keys["torchrec_samples_per_s"],
        "torchrec_multihot_mode": keys["torchrec_mode"],
        "single_multihot_samples_per_s": keys["single_dlrm_shape_samples_per_s"],
        "single_multihot_eager_samples_per_s": keys["single_dlrm_shape_eager_samples_per_s"],
    }, detail


def vs_torchrec(args: argparse.Namespace) -> tuple[dict, dict]:
    """Part 4 with the command line's sizes, and its console lines."""
    keys, detail = run_vs_torchrec(args.torchrec_batch_size, args.torchrec_batches, args.torchrec_repeats)
    ours = detail["ours"]
    if keys["ratio_vs_torchrec"] is None:
        print(f"vs_torchrec skipped: {detail['torchrec']['note']}")
        keys["torchrec_note"] = detail["torchrec"]["note"]
        return keys, detail
    print(
        f"dlrm-shape ours (single tower)  {ours['samples_per_cpu_s']:,} samples/CPU-s (median; kernels "
        f"{ours['steady_state']['kernels']} after {ours['steady_state']['warmup_steps']} warm-up steps), eager "
        f"{detail['ours_eager']['samples_per_cpu_s']:,}"
    )
    for mode, d in detail["torchrec"]["modes"].items():
        print(f"dlrm-shape torchrec {mode:22s} {d['samples_per_cpu_s']:,} samples/CPU-s (median; {d['kernel']})")
    print(f"dlrm-shape ratio_vs_torchrec {keys['ratio_vs_torchrec']} (vs {keys['torchrec_mode']})")
    root = logging.getLogger()
    level = root.level
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        root.setLevel(logging.ERROR)
        try:
            multi, detail["multihot"] = run_vs_torchrec_multihot(
                args.torchrec_batch_size, args.torchrec_batches, args.torchrec_repeats
            )
        finally:
            root.setLevel(level)
    keys.update(multi)
    print(
        f"multi-hot ours {multi['single_multihot_samples_per_s']:,} vs torchrec {multi['torchrec_multihot_mode']} "
        f"{multi['torchrec_multihot_samples_per_s']:,} samples/CPU-s: ratio_vs_torchrec_multihot "
        f"{multi['ratio_vs_torchrec_multihot']} (eager: {multi['single_multihot_eager_samples_per_s']:,}, "
        f"{multi['ratio_vs_torchrec_multihot_eager']})"
    )
    return keys, detail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000, help="about this many impressions in all")
    parser.add_argument("--hours", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batch-rows", type=int, default=65536, help="rows per executor batch (pipeline)")
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument(
        "--pipeline-repeat", type=int, default=3, help="interleaved (in-memory, pipeline) runs of part 2; medians"
    )
    parser.add_argument("--skip-dense-ddp", action="store_true", help="skip the dense all-reduce baseline")
    parser.add_argument("--skip-ddp", action="store_true")
    parser.add_argument("--ddp-pin", action="store_true", help="bind each DDP rank to a core of its own")
    parser.add_argument("--only-torchrec", action="store_true", help="run only part 4 (single tower vs TorchRec)")
    parser.add_argument("--skip-torchrec", action="store_true")
    parser.add_argument("--torchrec-batch-size", type=int, default=2048)
    parser.add_argument("--torchrec-batches", type=int, default=20, help="batches of one timed pass (part 4)")
    parser.add_argument("--torchrec-repeats", type=int, default=7, help="interleaved timed passes per side")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.only_torchrec:
        torchrec_keys, torchrec_detail = vs_torchrec(args)
        emit({"bench": "train_throughput", **torchrec_keys, "detail": {"vs_torchrec": torchrec_detail}})
        return

    root = bench_dir("train_throughput")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    job_path = root / "job.yaml"
    job_path.write_text(JOB.replace("{batch_rows}", str(args.batch_rows)))
    job = load_job_spec(job_path)
    start = job.dataset.start
    world = SyntheticWorld(WorldConfig(seed=5, rows_per_hour=args.rows / args.hours), start)
    t0 = time.perf_counter()
    batch, stream = world_batches(job, world, args.hours)
    micro = mixed_micro(batch, stream, args.batch_size)
    print(
        f"data       {batch.rows:,} rows x (batch copy, stream copy) in {time.perf_counter() - t0:.1f}s; "
        f"{len(micro)} micro-batches of {args.batch_size}"
    )

    single, mtrm = spec_of("single", args.batch_size), spec_of("mtrm", args.batch_size)
    detail: dict = {
        "rows": batch.rows,
        "batch_size": args.batch_size,
        "cores": os.cpu_count(),
        "torch_threads": 1,
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
    }
    for name, spec in (("single", single), ("mtrm", mtrm)):
        detail[name] = train_in_memory(spec, micro)
        d = detail[name]
        print(
            f"{name:10s} {d['samples']:,} samples, {d['steps']} steps: {d['samples_per_cpu_s']:,} samples/CPU-s, "
            f"{d['samples_per_wall_s']:,} samples/s wall"
        )

    write_world(job, SourceContext(str(root)), world, range(args.hours), files_per_hour=2, progress=False)
    window = TimeWindow(start, start + timedelta(hours=args.hours))
    in_memory_micro = [batch.slice(s, s + args.batch_size) for s in range(0, batch.rows, args.batch_size)]
    repeats: dict[str, list[dict]] = {"in_memory": [], "pipeline": []}
    beside: list[float] = []  # in-memory with a decoding process beside / alone, samples per CPU-second
    files = [t.read.uri for t in Planner(job.dataset, SourceContext(str(root)), threads=2).plan(window).tasks]
    for _ in range(args.pipeline_repeat):  # interleaved: drifting background load hits both alike
        repeats["in_memory"].append(train_in_memory(single, in_memory_micro))
        repeats["pipeline"].append(run_pipeline(job_path, root, window, single, args.executors))
        if (os.cpu_count() or 1) > 1:
            busy = train_beside_decoder(single, in_memory_micro, files)
            beside.append(round(busy["samples_per_cpu_s"] / repeats["in_memory"][-1]["samples_per_cpu_s"], 3))
        for name in ("in_memory", "pipeline"):
            d = repeats[name][-1]
            print(
                f"{name:10s} {d['samples']:,} samples (single tower): {d['samples_per_cpu_s']:,} samples/CPU-s, "
                f"{d['samples_per_wall_s']:,} samples/s wall"
            )
    for name, runs in repeats.items():  # the median repeat (by samples per CPU-second), all of them beside it
        detail[name] = {**sorted(runs, key=lambda d: d["samples_per_cpu_s"])[len(runs) // 2], "repeats": runs}
    detail["pipeline_ratios_per_repeat"] = [
        round(p["samples_per_cpu_s"] / m["samples_per_cpu_s"], 3)
        for p, m in zip(repeats["pipeline"], repeats["in_memory"], strict=True)
    ]
    pipe, mem = detail["pipeline"], detail["in_memory"]

    result = {
        "bench": "train_throughput",
        "mtrm_samples_per_s": detail["mtrm"]["samples_per_cpu_s"],
        "single_samples_per_s": detail["single"]["samples_per_cpu_s"],
        "mtrm_overhead_ratio": round(detail["single"]["samples_per_cpu_s"] / detail["mtrm"]["samples_per_cpu_s"], 3),
        "pipeline_samples_per_s": pipe["samples_per_cpu_s"],
        "in_memory_samples_per_s": mem["samples_per_cpu_s"],
        "pipeline_ratio": round(pipe["samples_per_cpu_s"] / mem["samples_per_cpu_s"], 3),
        "pipeline_wall_samples_per_s": pipe["samples_per_wall_s"],
        "in_memory_wall_samples_per_s": mem["samples_per_wall_s"],
        "pipeline_model": "single",
        "executor_startup_cpu_s_per_executor": pipe["executor_startup_cpu_s_per_executor"],
        "in_memory_beside_decoder_ratio": statistics.median(beside) if beside else None,
    }
    detail["in_memory_beside_decoder_ratios_per_repeat"] = beside
    if not args.skip_ddp:
        speedup, one, two = ddp_speedup(micro, mtrm, root, "row_sparse", args.ddp_pin)
        dense, d_one, d_two = (None, None, None) if args.skip_dense_ddp else ddp_speedup(micro, mtrm, root, "ddp_dense")
        for d in (one, two, d_one, d_two):
            if d is not None:
                print(
                    f"{d['exchange']:10s} ws={d['world_size']} {d['samples']:,} samples, {d['rounds']} rounds: "
                    f"{d['samples_per_s']:,} samples/s wall, {d['step_s'] * 1000:.1f} ms/step, "
                    f"{d['exchange_bytes_per_step'] / 1e6:.3f} MB exchanged per step"
                )
        # CPU per sample of the 2 ranks (all their threads) over 1 rank's: what the group adds
        cpu_ratio = (two["cpu_s"] / two["samples"]) / (one["cpu_s"] / one["samples"])
        result.update(
            ddp_speedup=round(speedup, 3),
            ddp_exchange="row_sparse",
            ddp_exchange_bytes_per_step=two["exchange_bytes_per_step"],
            ddp_cpu_per_sample_ratio=round(cpu_ratio, 3),
            ddp_model="mtrm",
            ddp_hash_buckets=100_000,
        )
        detail["ddp"] = {"ws1": one, "ws2": two}
        if dense is not None and d_two is not None:
            result.update(
                ddp_speedup_dense_allreduce=round(dense, 3),
                ddp_dense_allreduce_bytes_per_step=d_two["exchange_bytes_per_step"],
            )
            detail["ddp_dense_allreduce"] = {"ws1": d_one, "ws2": d_two}
    if not args.skip_torchrec:
        torchrec_keys, detail["vs_torchrec"] = vs_torchrec(args)
        result.update(torchrec_keys)
    detail["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    emit({**result, "detail": detail})


if __name__ == "__main__":
    main()

"""Training throughput: MTRM vs the single tower, the whole pipeline vs in-memory, DDP speedup.

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
   Parquet written by ``write_world`` (2 files an hour) -> planner -> ``LocalDataPlane`` (driver +
   2 executor processes, shared memory) -> ``RemoteReader`` -> ``Batch`` ->
   ``Trainer.train`` -- in samples per CPU-second of *every* process (this one: trainer, reader,
   driver; plus the executors after they were ready, ``plane.cpu_seconds(include_startup=False)``),
   from the first batch asked for to the last step. ``in_memory_samples_per_s``: the same model on
   the same rows from in-memory tensors (the ceiling), per CPU-second of this process.
   ``pipeline_ratio`` = pipeline / in_memory, **both per CPU-second**; the wall-clock figures
   (``pipeline_wall_samples_per_s``, ``in_memory_wall_samples_per_s``) are reported beside them.
3. ``ddp_speedup``: aggregate samples per wall-second of 2 ranks x 1 thread over 1 rank x 1 thread
   (gloo group of world_size 2 vs 1, :func:`run_ddp_in_memory`: the round protocol of
   ``primus_dagster.training.distributed`` that multi-trainer jobs run) with the **row-sparse
   gradient exchange** (sparse embedding gradients, the touched rows all-gathered, SparseAdam; a
   group of 1 exchanges nothing: it is a single trainer), each rank training from in-memory
   tensors: MTRM on the micro-batches of part 1, dealt to the ranks in (batch, stream) pairs so both
   ranks train the same tower in a round; same total rows. Only the training loop after 5 warm-up
   rounds is timed (not process start). ``ddp_exchange_bytes_per_step``: bytes one rank puts into
   the exchange's collectives per round. ``ddp_cpu_per_sample_ratio``: CPU-seconds per sample of
   the 2 ranks (every thread) over 1 rank's -- what the group adds; on this 2-core machine the
   speedup cannot exceed ``2 / ratio``, and less when other processes run.
   ``ddp_speedup_dense_allreduce``: the same with DDP's dense all-reduce of the trained tower
   (its dense 100000 x 16 embedding gradient: 6.4 MB a step; ``ddp_dense_allreduce_bytes_per_step``),
   the exchange before the row-sparse one. The load average at start and end is in "detail":
   wall-clock figures are only as good as the machine is quiet.

Last line: {"bench": "train_throughput", "mtrm_samples_per_s", "single_samples_per_s",
"mtrm_overhead_ratio", "pipeline_samples_per_s", "in_memory_samples_per_s", "pipeline_ratio",
"ddp_speedup", "ddp_exchange_bytes_per_step", "ddp_speedup_dense_allreduce", ...details}
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import time
from datetime import timedelta
from pathlib import Path

import torch

from primus_dagster.data import Batch, LocalDataPlane, Normalizer, Planner, SourceContext, TimeWindow
from primus_dagster.spec import load_job_spec
from primus_dagster.spec.job import ModelSpec, TrainingSpec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world
from primus_dagster.training.distributed import Exchange, RankResult, run_ddp_in_memory
from primus_dagster.training.models import build_model
from primus_dagster.training.trainer import Trainer

from _common import PARQUET_DATASET, bench_dir, cpu_self, emit

JOB = (
    """
name: bench-train
data: {buffer_batches: 4, lease: 30s}
pools: {data: {replicas: 2, task_runners: 1}, training: {replicas: 1}}
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


def run_pipeline(job_path: Path, root: Path, window: TimeWindow, spec: TrainingSpec, executors: int) -> dict:
    job = load_job_spec(job_path)
    tasks = list(Planner(job.dataset, SourceContext(str(root)), threads=2).plan(window).tasks)
    trainer = Trainer(build_model(spec.model, 13, 5, seed=0), spec)
    with LocalDataPlane(job_path, root, tasks, executors=executors, trainers=1) as plane:
        cpu0, wall0 = cpu_self(), time.perf_counter()
        with plane.reader(0) as reader:
            for batch in reader:
                trainer.train(batch)
        wall, cpu_trainer = time.perf_counter() - wall0, cpu_self() - cpu0
        plane.wait_executors(30)
        cpu_exec = plane.cpu_seconds(include_startup=False)
    samples = trainer.counters.samples
    cpu = cpu_trainer + cpu_exec
    return {
        "samples": samples,
        "steps": trainer.counters.step,
        "tasks": len(tasks),
        "wall_s": round(wall, 3),
        "trainer_process_cpu_s": round(cpu_trainer, 3),
        "executors_cpu_s": round(cpu_exec, 3),
        "train_s": round(trainer.counters.train_s, 3),
        "samples_per_cpu_s": round(samples / cpu),
        "samples_per_wall_s": round(samples / wall),
    }


def run_ddp_part(micro: list[Batch], spec: TrainingSpec, directory: Path, world_size: int, exchange: Exchange) -> dict:
    """``world_size`` ranks, the (batch, stream) pairs of ``micro`` dealt round-robin."""
    pairs = [micro[i : i + 2] for i in range(0, len(micro), 2)]
    paths = []
    for rank in range(world_size):
        shard = [batch for pair in pairs[rank::world_size] for batch in pair]
        paths.append(str(directory / f"shard-{world_size}-{rank}.pkl"))
        Path(paths[-1]).write_bytes(pickle.dumps(shard))
    results: list[RankResult] = run_ddp_in_memory(
        paths, spec, threads_per_rank=1, warmup_steps=5, exchange=exchange, timeout_s=600
    )
    samples = sum(r.samples for r in results)
    wall = max(r.wall_s for r in results)
    rounds = results[0].steps + results[0].null_steps
    if len({r.params_checksum for r in results}) != 1:
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
        "exchange_bytes_per_step": int(results[0].extra["exchange_bytes_per_step"]),
        "allreduce_probe_s": round(results[0].extra["allreduce_probe_s"], 5),
    }


def ddp_speedup(
    micro: list[Batch], spec: TrainingSpec, directory: Path, exchange: Exchange
) -> tuple[float, dict, dict]:
    one = run_ddp_part(micro, spec, directory, 1, exchange)
    two = run_ddp_part(micro, spec, directory, 2, exchange)
    return two["samples_per_s"] / one["samples_per_s"], one, two


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000, help="about this many impressions in all")
    parser.add_argument("--hours", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batch-rows", type=int, default=65536, help="rows per executor batch (pipeline)")
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--skip-dense-ddp", action="store_true", help="skip the dense all-reduce baseline")
    parser.add_argument("--skip-ddp", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)

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
    detail["in_memory"] = train_in_memory(
        single, [batch.slice(s, s + args.batch_size) for s in range(0, batch.rows, args.batch_size)]
    )
    detail["pipeline"] = run_pipeline(job_path, root, window, single, args.executors)
    for name in ("in_memory", "pipeline"):
        d = detail[name]
        print(
            f"{name:10s} {d['samples']:,} samples (single tower): {d['samples_per_cpu_s']:,} samples/CPU-s, "
            f"{d['samples_per_wall_s']:,} samples/s wall"
        )
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
    }
    if not args.skip_ddp:
        speedup, one, two = ddp_speedup(micro, mtrm, root, "row_sparse")
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
    detail["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    emit({**result, "detail": detail})


if __name__ == "__main__":
    main()

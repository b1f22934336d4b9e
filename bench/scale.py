"""Tables sharded by rows beside replicated ones and beside one trainer: memory per rank, speed, quality.

``training.sharding: row_wise`` against ``replicated`` on the same model, data and group size (2 ranks),
and against one trainer; everything else at the spec's defaults but the table size (``--buckets``) and
``pools.training.memory``, which a replicated rank of these tables needs more of than the default 2Gi.

1. **Memory and speed, in memory** (``_ddp.run_ddp_in_memory``: the phase loop of the job's ranks
   under ``LockStep``, each rank training from in-memory tensors, no data plane): the synthetic world's
   micro-batches (MTRM: batch and stream copies, as ``bench/train_throughput.py``'s part 3), tables of
   ``--buckets`` rows x 16 in each of MTRM's two towers, lazy Adam. One trainer (a group of one), two
   replicated ranks, two row-wise ranks. ``rss_mb``: the peak RSS of a rank's process (``VmHWM``, the
   larger of the two ranks); ``shard_memory_ratio`` = row-wise / replicated. ``sharded_speedup_2r``:
   samples per second (wall, the timed loop) of the row-wise group over one trainer;
   ``sharded_vs_replicated``: row-wise group over replicated group. The wall figures need a quiet
   machine with a core a rank: ``load_avg_1m`` says how quiet it was.
2. **Quality, through the pipeline** (``train_window``: executors, Flight, the rank processes): a mixed
   MTRM job over Parquet batch and stream sources of the synthetic world, ``--hours`` hours, evaluated on
   the next 4 hours, on each of ``--seeds`` seeds (the world's and the model's), 2 ranks, the runs of
   :data:`VARIANTS`; every figure is a paired difference over the seeds, mean and 95 % t-interval:
   ``auc_delta``: row-wise minus replicated with ``data.deterministic: true`` (a non-default key: every
   batch's rank and order fixed, so the two differ by what sharding does and nothing else);
   ``auc_delta_default_order``: row-wise at the spec's default order minus that; ``auc_noise``: the same
   default-order row-wise run twice (what "within noise" means here); ``auc_delta_resharded``: rank 1
   failing at round ``--fail-round``, the run then resumed from its last checkpoint on 3 ranks (``to_3``)
   or on one trainer (``to_1``) -- the tables resharded -- minus the uninterrupted default-order run.
   Every variant checkpoints every ``--checkpoint-every`` steps (the spec's default, 500, is more steps
   than these runs have: the failure must find a checkpoint). Part 2's tables have the spec's default
   ``hash_buckets`` (``--quality-buckets``): what is compared is what the sharding does to learning, and
   checkpoints of part 1's tables would be gigabytes each.

Last line: ``{"bench": "scale", "shard_memory_ratio": ..., "sharded_speedup_2r": ...,
"sharded_vs_replicated": ..., "auc_delta": [mean, lo95, hi95], "auc_delta_resharded": {"to_3": [...],
"to_1": [...]}, "auc_noise": [...], "rss_mb": {"replicated": ..., "row_wise": ...,
"one_trainer": ...}, "load_avg_1m": ..., "detail": {...}}``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import shutil
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from train_throughput import JOB as THROUGHPUT_JOB
from train_throughput import mixed_micro, run_ddp_part, spec_of, world_batches

from primus_dagster.data import SourceContext, TimeWindow
from primus_dagster.spec import load_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world
from primus_dagster.training.phase_trainer import TrainerFailedError
from primus_dagster.training.run_state import RunHooks, TrainingRequest
from primus_dagster.training.window import train_window

from _common import bench_dir, emit
from _ddp import fail_rank_at

QUALITY_JOB = """
name: scale-{variant}-{seed}
data: {{lease: 30s, deterministic: {deterministic}}}
pools: {{data: {{replicas: 2}}, training: {{replicas: {ranks}, max_replicas: 3, memory: {memory}, restart: never}}}}
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: {hours}h
      sources:
        - name: imp
          type: parquet
          kind: batch
          path: parquet/impressions
          columns: &cols {{ts: event_time, label: click, id: sample_id, dense: [d0, d1, d2, d3, d4], sparse: [user_id, item_id, topic_id]}}
    - name: live
      window: 1h
      sources:
        - {{name: events, type: parquet, kind: stream, path: parquet/events, columns: *cols}}
training:
  mode: mixed
  model: {{type: mtrm, hash_buckets: {buckets}}}
  sharding: {sharding}
  checkpoint_every_steps: {every}
  eval_hours: 4
  seed: {seed}
tracking: {{tracking_uri: "sqlite:///{root}/mlflow.db", experiment: scale}}
"""


def interval(values: list[float]) -> list[float]:
    """Mean and 95 % t-interval (two-sided) of ``values``."""
    n, mean = len(values), statistics.fmean(values)
    if n < 2:
        return [round(mean, 5), float("nan"), float("nan")]
    t = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}.get(n, 2.0)
    half = t * statistics.stdev(values) / math.sqrt(n)
    return [round(mean, 5), round(mean - half, 5), round(mean + half, 5)]


def memory_and_speed(args: argparse.Namespace, root: Path) -> dict:
    job_path = root / "throughput.yaml"
    job_path.write_text(THROUGHPUT_JOB.replace("{batch_rows}", "65536"))
    job = load_job_spec(job_path)
    world = SyntheticWorld(WorldConfig(seed=5, rows_per_hour=args.rows / 6), job.dataset.start)
    batch, stream = world_batches(job, world, 6)
    micro = mixed_micro(batch, stream, 1024)
    spec = spec_of("mtrm", 1024, buckets=args.buckets)
    runs = {
        "one_trainer": run_ddp_part(micro, spec, root, 1, "row_sparse"),
        "replicated": run_ddp_part(micro, spec, root, 2, "row_sparse"),
        "row_wise": run_ddp_part(micro, spec, root, 2, "row_wise"),
    }
    for name, run in runs.items():
        print(f"{name:12} {run['samples_per_s']:>9,} samples/s  peak RSS {run['peak_rss_mb']:,.0f} MiB a rank")
    return runs


@dataclass(frozen=True)
class Variant:
    """One run of part 2: its sharding, whether the order is fixed (``data.deterministic``) and, for a
    resharded run, the group size it resumes on after rank 1 failed."""

    sharding: str
    deterministic: bool = False
    resume_on: int | None = None


#: Part 2's runs per seed. ``*_fixed``: ``data.deterministic: true`` (every batch's rank and order fixed), so
#: replicated and row-wise see the same batches and differ only by what sharding does; the others at the
#: spec's default order (the shuffle's), where ``row_wise_again`` -- the same run twice -- is the noise.
VARIANTS = {
    "replicated_fixed": Variant("replicated", deterministic=True),
    "row_wise_fixed": Variant("row_wise", deterministic=True),
    "row_wise": Variant("row_wise"),
    "row_wise_again": Variant("row_wise"),
    "resharded_to_3": Variant("row_wise", resume_on=3),
    "resharded_to_1": Variant("row_wise", resume_on=1),
}


def quality_job(args: argparse.Namespace, where: Path, name: str, seed: int, ranks: int) -> Path:
    variant = VARIANTS[name]
    job_path = where / "job.yaml"
    text = QUALITY_JOB.format(
        variant=name.replace("_", "-"),
        sharding=variant.sharding,
        deterministic=str(variant.deterministic).lower(),
        ranks=ranks,
        every=args.checkpoint_every,
        seed=seed,
        hours=args.hours,
        buckets=args.quality_buckets,
        memory=args.memory,
        root=where,
    )
    job_path.write_text(text)
    return job_path


def quality_run(args: argparse.Namespace, root: Path, name: str, seed: int) -> float:
    """Next-4-hours AUC of variant ``name`` on ``seed``'s world."""
    variant = VARIANTS[name]
    where = root / f"quality-{name}-{seed}"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    job_path = quality_job(args, where, name, seed, ranks=2)
    job = load_job_spec(job_path)
    world = SyntheticWorld(WorldConfig(seed=seed, rows_per_hour=args.rows_per_hour, n_dense=5), job.dataset.start)
    write_world(job, SourceContext(str(where)), world, range(args.hours + 5), files_per_hour=2, progress=False)
    window = TimeWindow(job.dataset.start, job.dataset.start + timedelta(hours=args.hours))
    started = time.perf_counter()
    if variant.resume_on is not None:  # 2 ranks until rank 1 fails, then the same run on resume_on
        hooks = RunHooks(rank_hook=functools.partial(fail_rank_at, 1, args.fail_round))
        try:
            train_window(TrainingRequest(job, job_path, where, window), hooks)
            raise AssertionError(f"rank 1 did not fail at round {args.fail_round}: lower --fail-round")
        except TrainerFailedError:
            pass
        job_path = quality_job(args, where, name, seed, ranks=variant.resume_on)
        job = load_job_spec(job_path)
    result = train_window(TrainingRequest(job, job_path, where, window))
    assert result.evaluation is not None
    if variant.resume_on is not None:
        assert result.resumed_from_step, f"{name} did not resume from a checkpoint"
    auc = result.evaluation.result.auc
    print(f"seed {seed} {name:16} AUC {auc:.4f} ({time.perf_counter() - started:.0f} s)")
    shutil.rmtree(where, ignore_errors=True)
    return auc


def quality(args: argparse.Namespace, root: Path) -> dict:
    aucs: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for seed in range(1, args.seeds + 1):
        for name in VARIANTS:
            aucs[name].append(quality_run(args, root, name, seed))

    def paired(a: str, b: str) -> list[float]:
        return interval([x - y for x, y in zip(aucs[a], aucs[b], strict=True)])

    return {
        "auc": aucs,
        "auc_delta": paired("row_wise_fixed", "replicated_fixed"),
        "auc_delta_default_order": paired("row_wise", "replicated_fixed"),
        "auc_noise": paired("row_wise_again", "row_wise"),
        "auc_delta_resharded": {
            "to_3": paired("resharded_to_3", "row_wise"),
            "to_1": paired("resharded_to_1", "row_wise"),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buckets", type=int, default=8_000_000, help="rows of every table (two MTRM towers)")
    parser.add_argument("--rows", type=int, default=300_000, help="impressions of part 1 (in memory)")
    parser.add_argument("--memory", default="8Gi", help="pools.training.memory of part 2")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--hours", type=int, default=24, help="hours trained in part 2")
    parser.add_argument("--rows-per-hour", type=int, default=8000)
    parser.add_argument(
        "--quality-buckets", type=int, default=100_000, help="model.hash_buckets of part 2 (the spec's default)"
    )
    parser.add_argument("--checkpoint-every", type=int, default=25, help="training.checkpoint_every_steps of part 2")
    parser.add_argument("--fail-round", type=int, default=80, help="the resharded variant's rank 1 fails here")
    parser.add_argument("--skip-quality", action="store_true")
    args = parser.parse_args()
    logging.getLogger("primus_dagster").setLevel(logging.WARNING)
    root = bench_dir("scale")
    load_start = os.getloadavg()[0]
    runs = memory_and_speed(args, root)
    result: dict = {
        "bench": "scale",
        "shard_memory_ratio": round(runs["row_wise"]["peak_rss_mb"] / runs["replicated"]["peak_rss_mb"], 3),
        "sharded_speedup_2r": round(runs["row_wise"]["samples_per_s"] / runs["one_trainer"]["samples_per_s"], 3),
        "sharded_vs_replicated": round(runs["row_wise"]["samples_per_s"] / runs["replicated"]["samples_per_s"], 3),
        "auc_delta": None,
        "auc_delta_resharded": None,
        "rss_mb": {name: round(run["peak_rss_mb"]) for name, run in runs.items()},
        "load_avg_1m": round(load_start, 2),
        "detail": {"buckets": args.buckets, "in_memory": runs},
    }
    if not args.skip_quality:
        found = quality(args, root)
        result["auc_delta"] = found["auc_delta"]
        result["auc_delta_resharded"] = found["auc_delta_resharded"]
        result["auc_noise"] = found["auc_noise"]
        result["detail"]["quality"] = {
            **found,
            "seeds": args.seeds,
            "hours": args.hours,
            "memory": args.memory,
            "buckets": args.quality_buckets,
        }
    result["detail"]["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    emit(result)


if __name__ == "__main__":
    main()

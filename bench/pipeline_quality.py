"""Model quality through the real pipeline: ``primus-dagster train`` (data plane, executors, reader)
against the in-memory training of the same rows, per training mode.

**What it checks.** ``bench/quality.py`` builds its features in memory; a bug that misaligned
features and labels in the executors, the Flight reader or the batch hand-out would not show there.
Here the same synthetic world (a ``bench/quality.py`` world, ``--world``, default ``trend``) is
written with the synth writers to a Parquet batch source (complete labels, ``label_delay`` = the
world's ``max_label_delay``, 24 h) and to a Kafka stream source on an embedded broker
(``primus_dagster.devtools.kafka_broker``: the stream copy, clicks within the 15-min label window
only), and for each mode (``batch``, ``stream``, ``batch_then_stream``, ``mixed``; ``batch_lag``
24 h: the stream of ``[T0, T0 + hours)`` with the batch of the day before):

* **pipeline** -- ``primus-dagster train SPEC --start T0 --hours H --json`` as a subprocess (its own
  executors, Flight reader, MLflow on SQLite); its next-hours ``eval_auc``;
* **in memory** -- the tasks the job plans (``plan_training_tasks``), read in this process through
  the source adapters (``read_batches``), trained by the project's ``Trainer`` on the same
  ``build_model(seed=training.seed)`` in the mode's order (phases in turn; ``mixed``: each stream
  hour's micro-batches interleaved evenly with those of its lagged batch hour, as ``bench/quality.py``
  does), scored by the same ``evaluate_window`` on the same held-out rows.

The two differ only in the order of the micro-batches (the data plane's hand-out; one executor by
default keeps it close to the plan's) -- so per mode the AUCs should agree within noise, and the
modes rank the same way. Criterion: ``|pipeline - in memory| <= 0.01`` per mode, same
ranking.

**Size.** ``--hours 6`` at ``--rows-per-hour 6000`` (~32 k stream + ~32 k batch rows), 2 held-out
hours (~6 k rows), the ``ModelSpec`` defaults (``single`` for the one-kind modes, where the spec
rejects MTRM; ``mtrm`` for the others), batch 512, Adam lr 2e-3 (one pass: a higher rate than
``bench/quality.py``'s 5e-4 so that ~140 steps learn); about 2 min on 2 busy cores.

Last line: {"bench": "pipeline_quality", "auc_pipeline": {mode: auc}, "auc_in_memory": {mode: auc},
"abs_diff": {mode: d}, "max_abs_diff": d, "ranking_pipeline": [...], "ranking_in_memory": [...],
"same_ranking": bool, "within_0_01": bool, "samples": {mode: {"pipeline": n, "in_memory": n}}, ...}
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from quality import WORLDS, _micro, interleave

from primus_dagster.data import Batch, SourceContext, TimeWindow, read_batches
from primus_dagster.devtools.kafka_broker import EmbeddedBroker
from primus_dagster.spec import JobSpec, format_duration, load_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world
from primus_dagster.training.evaluation import evaluate_window
from primus_dagster.training.models import build_model
from primus_dagster.training.modes import phase_tasks, phases
from primus_dagster.training.planning import plan_training_tasks
from primus_dagster.training.trainer import Trainer

from _common import COLUMNS, emit

MODES = ("batch", "stream", "batch_then_stream", "mixed")
# MTRM needs both kinds (the spec rejects it for a one-kind mode): the single tower there, as bench/quality.py
MODEL_TYPE = {"batch": "single", "stream": "single", "batch_then_stream": "mtrm", "mixed": "mtrm"}

JOB = """
name: pipeline-quality-{mode_name}
data: {{buffer_batches: 8}}
pools: {{data: {{replicas: {executors}, task_runners: 1}}, training: {{replicas: 1}}}}
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: 24h
      sources:
        - name: impressions
          type: parquet
          kind: batch
          batch_rows: {batch_rows}
          label_delay: {max_delay}
          path: parquet/impressions
          columns: {columns}
    - name: live
      window: 1h
      sources:
        - name: events
          type: kafka
          kind: stream
          batch_rows: {batch_rows}
          label_delay: {window}
          topic: pq-events
          max_records_per_task: 1000000
          columns: {columns}
training:
  mode: {mode}
  model: {{type: {model}{model_extra}}}
  batch_lag: {max_delay}
  batch_size: {batch_size}
  learning_rate: {lr}
  eval_hours: {eval_hours}
  checkpoint_every_steps: 100000
  seed: {seed}
tracking: {{tracking_uri: "sqlite:///{root}/mlflow-{mode_name}.db", experiment: pipeline-quality}}
"""


def write_spec(root: Path, mode: str, args: argparse.Namespace, config: WorldConfig) -> Path:
    path = root / f"job-{mode}.yaml"
    path.write_text(
        JOB.format(
            mode=mode,
            model=MODEL_TYPE[mode],
            model_extra="".join(
                f", {key}: {value}"
                for key, value in (
                    ("memory_lr_scale", args.memory_lr_scale),
                    ("adapt_batch_weight", args.adapt_batch_weight),
                )
                if MODEL_TYPE[mode] == "mtrm" and value is not None
            ),
            mode_name=mode.replace("_", "-"),
            executors=args.executors,
            batch_rows=args.batch_rows,
            max_delay=format_duration(config.max_label_delay),
            window=format_duration(config.stream_label_window),
            columns=COLUMNS,
            batch_size=args.batch_size,
            lr=args.lr,
            eval_hours=args.eval_hours,
            seed=args.seed,
            root=root,
        )
    )
    return path


def write_data(job: JobSpec, context: SourceContext, config: WorldConfig, args: argparse.Namespace) -> dict:
    """The hours the window reads (and only those): batch ``[0, H)`` (lagged into the window) and the
    held-out ``[lag + H, lag + H + E)``; stream ``[lag, lag + H]`` (one hour more so that the
    window's last Kafka hour is complete)."""
    lag = int(config.max_label_delay.total_seconds() // 3600)
    world = SyntheticWorld(config, job.dataset.start)
    h, e = args.hours, args.eval_hours
    rows: dict[str, int] = {}
    for source, hours in (
        ("impressions", range(0, h)),
        ("impressions", range(lag + h, lag + h + e)),
        ("events", range(lag, lag + h + 1)),
    ):
        summary = write_world(job, context, world, hours, sources=[source], progress=False, files_per_hour=1)
        rows[source] = rows.get(source, 0) + sum(s.rows for s in summary.sources.values())
    return {"lag_hours": lag, "rows_written": rows}


def run_pipeline(spec: Path, window: TimeWindow, root: Path, bootstrap: str, args: argparse.Namespace) -> dict:
    """``primus-dagster train --json`` in a subprocess; its result metadata (last stdout line)."""
    cli = Path(sys.executable).parent / "primus-dagster"  # the installed console script
    entry = [str(cli)] if cli.exists() else [sys.executable, "-m", "primus_dagster.cli"]
    command = [*entry, "train", str(spec), "--start", window.start.isoformat()]
    command += ["--hours", str(args.hours), "--data-root", str(root), "--kafka-bootstrap", bootstrap, "--json"]
    command += ["--executors", str(args.executors)]
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    meta = json.loads(proc.stdout.strip().splitlines()[-1])
    meta["bench_wall_s"] = round(time.perf_counter() - started, 1)
    return meta


def in_memory_order(job: JobSpec, context: SourceContext, window: TimeWindow, mode: str) -> list[Batch]:
    """The micro-batches of the window's planned tasks in the mode's order."""
    tasks = plan_training_tasks(job, context, window)
    size = job.training.batch_size
    out: list[Batch] = []
    for phase in phases(mode):
        chosen = phase_tasks(tasks, phase)
        if len(phase.kinds) == 1:
            out += [m for b in read_batches(job, context, chosen) for m in _micro(b, size)]
            continue
        by_hour: dict[str, dict[str, list[Batch]]] = defaultdict(lambda: defaultdict(list))
        for task in chosen:  # mixed: a stream hour with the batch hour lagged onto it
            hour = str(task.meta.get("order_at", task.partition.isoformat()))
            for b in read_batches(job, context, [task]):
                by_hour[hour][task.kind] += _micro(b, size)
        for hour in sorted(by_hour):
            out += interleave([by_hour[hour][k] for k in ("batch", "stream") if by_hour[hour][k]])
    return out


def run_in_memory(job: JobSpec, context: SourceContext, window: TimeWindow, mode: str, eval_hours: int) -> dict:
    started = time.perf_counter()
    micro = in_memory_order(job, context, window, mode)
    model = build_model(job.training.model, micro[0].dense.shape[1], micro[0].sparse.shape[1], seed=job.training.seed)
    trainer = Trainer(model, job.training)
    for m in micro:
        trainer.train_step(m)
    model.eval()
    held = evaluate_window(job, context, model, window.end, window.end + timedelta(hours=eval_hours))
    if held is None:
        raise SystemExit(f"in memory ({mode}): no held-out data after {window.end}")
    return {
        "auc": held.result.auc,
        "labels": held.labels,
        "rows": held.result.rows,
        "samples": sum(m.rows for m in micro),
        "steps": len(micro),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def ranking(aucs: dict[str, float]) -> list[str]:
    return sorted(aucs, key=lambda m: -aucs[m])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", default="trend", choices=sorted(WORLDS), help="a bench/quality.py world")
    parser.add_argument("--seed", type=int, default=7, help="world seed and training.seed")
    parser.add_argument("--hours", type=int, default=6, help="training window length (hours)")
    parser.add_argument("--eval-hours", type=int, default=2)
    parser.add_argument("--rows-per-hour", type=float, default=6000.0)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--batch-rows", type=int, default=4096, help="rows per reader batch of a source")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument(
        "--memory-lr-scale", type=float, default=None, help="MTRM's memory_lr_scale (default: the ModelSpec's)"
    )
    parser.add_argument(
        "--adapt-batch-weight",
        type=float,
        default=None,
        help="MTRM's adapt_batch_weight (default: the ModelSpec's, 0; the quality bench runs 0.25)",
    )
    parser.add_argument("--executors", type=int, default=1, help="data executors of the pipeline runs")
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per pipeline run")
    parser.add_argument("--keep", type=Path, default=None, help="work here (kept) instead of a temp dir")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    if unknown := set(args.modes) - set(MODES):
        raise SystemExit(f"unknown modes {sorted(unknown)}; choose from {MODES}")
    torch.set_num_threads(1)
    overrides = WORLDS[args.world][0]
    config = WorldConfig(seed=args.seed, rows_per_hour=args.rows_per_hour, **overrides)
    wall0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pipeline-quality-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        broker = EmbeddedBroker().start()
        try:
            context = SourceContext(str(root), broker.bootstrap_servers)
            specs = {mode: write_spec(root, mode, args, config) for mode in args.modes}
            jobs = {mode: load_job_spec(path) for mode, path in specs.items()}
            some = jobs[args.modes[0]]
            written = write_data(some, context, config, args)
            start = some.dataset.start + timedelta(hours=written["lag_hours"])
            window = TimeWindow.hours_from(start, args.hours)
            print(f"world {args.world} seed {args.seed}: {written}; window {window}", flush=True)
            pipeline: dict[str, dict] = {}
            memory: dict[str, dict] = {}
            for mode in args.modes:
                pipeline[mode] = run_pipeline(specs[mode], window, root, broker.bootstrap_servers, args)
                memory[mode] = run_in_memory(jobs[mode], context, window, mode, args.eval_hours)
                p, m = pipeline[mode], memory[mode]
                print(
                    f"{mode:18s} pipeline AUC {p['eval_auc']:.4f} ({p['samples']} samples, {p['steps']} steps, "
                    f"{p['bench_wall_s']}s)   in memory AUC {m['auc']:.4f} ({m['samples']} samples, "
                    f"{m['steps']} steps, {m['wall_s']}s)   diff {p['eval_auc'] - m['auc']:+.4f}",
                    flush=True,
                )
        finally:
            broker.stop()
    auc_p = {m: round(pipeline[m]["eval_auc"], 5) for m in args.modes}
    auc_m = {m: round(memory[m]["auc"], 5) for m in args.modes}
    diff = {m: round(abs(auc_p[m] - auc_m[m]), 5) for m in args.modes}
    result: dict[str, Any] = {
        "bench": "pipeline_quality",
        "auc_pipeline": auc_p,
        "auc_in_memory": auc_m,
        "abs_diff": diff,
        "max_abs_diff": max(diff.values()),
        "ranking_pipeline": ranking(auc_p),
        "ranking_in_memory": ranking(auc_m),
        "same_ranking": ranking(auc_p) == ranking(auc_m),
        "within_0_01": max(diff.values()) <= 0.01,
        "samples": {m: {"pipeline": pipeline[m]["samples"], "in_memory": memory[m]["samples"]} for m in args.modes},
        "eval": {
            m: {
                "labels": pipeline[m].get("eval_labels"),
                "rows": pipeline[m].get("eval_rows"),
                "window": pipeline[m].get("eval_window"),
            }
            for m in args.modes
        },
        "model_type": {m: MODEL_TYPE[m] for m in args.modes},
        "world": args.world,
        "config": {
            "seed": args.seed,
            "hours": args.hours,
            "eval_hours": args.eval_hours,
            "rows_per_hour": args.rows_per_hour,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "executors": args.executors,
            "window": f"{window.start.isoformat()}/{window.end.isoformat()}",
        },
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    emit(result)


if __name__ == "__main__":
    main()

"""A small training job on the synthetic world, written to a temp dir (shared by the job tests)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path

from primus_dagster.data.graph import Planner
from primus_dagster.data.sources import SourceContext, TimeWindow, make_adapter
from primus_dagster.data.tasks import DataTask
from primus_dagster.spec import load_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world

JOB = """
name: train-test
data: {{lease: 5s, buffer_batches: 4}}
pools: {{data: {{replicas: 2, task_runners: 1}}, training: {{replicas: 1}}}}
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: 3h
      sources:
        - name: imp
          type: parquet
          kind: batch
          batch_rows: 500
          path: parquet/impressions
          columns: &cols {{ts: event_time, label: click, id: sample_id, dense: [d0, d1, d2, d3, d4], sparse: [user_id, item_id, topic_id]}}
    - name: live
      window: 1h
      shuffle: rebalance
      sources:
        - {stream_source}
training:
  mode: {mode}
  model: {{type: {model}, embedding_dim: 8, hash_buckets: 4096, memory_hidden: [16], adapt_hidden: [32, 16]}}
  batch_size: 250
  learning_rate: 0.003
  checkpoint_every_steps: {every}
{extra_training}tracking: {{tracking_uri: "sqlite:///{root}/mlflow.db", experiment: train-test}}
"""

PARQUET_STREAM = "{name: events, type: parquet, kind: stream, batch_rows: 500, path: parquet/events, columns: *cols}"
KAFKA_STREAM = (
    "{name: events, type: kafka, kind: stream, batch_rows: 500, topic: TOPIC, "
    "max_records_per_task: 1000, columns: *cols}"
)


def make_job(
    root: Path,
    *,
    mode: str = "mixed",
    model: str = "mtrm",
    every: int = 5,
    hours: int = 3,
    kafka: str | None = None,
    topic: str | None = None,
    rows_per_hour: int = 1500,
    extra_training: str = "",
) -> dict:
    """Write the job spec and ``hours`` + 2 hours of the world (an evaluation hour, and one more so
    Kafka's hours are complete); returns paths, the window and the spec."""
    # a topic of its own by default: the session's broker is shared, and two worlds in one topic interleave
    topic = topic or f"train-events-{uuid.uuid4().hex[:8]}"
    stream = KAFKA_STREAM.replace("TOPIC", topic) if kafka else PARQUET_STREAM
    root.mkdir(parents=True, exist_ok=True)
    job_path = root / "job.yaml"
    job_path.write_text(
        JOB.format(
            mode=mode,
            model=model,
            every=every,
            root=root,
            stream_source=stream,
            extra_training="".join(f"  {line}\n" for line in extra_training.splitlines()),
        )
    )
    job = load_job_spec(job_path)
    context = SourceContext(str(root), kafka)
    window = None
    if hours:  # hours=0: the spec only
        world = SyntheticWorld(WorldConfig(seed=5, rows_per_hour=rows_per_hour, n_dense=5), job.dataset.start)
        write_world(job, context, world, range(hours + 2), files_per_hour=2, progress=False)
        window = TimeWindow(job.dataset.start, job.dataset.start + timedelta(hours=hours))
    return {"root": root, "job_path": job_path, "job": job, "window": window, "context": context, "kafka": kafka}


def expected_ids(env: dict, tasks: Iterable[DataTask] | None = None) -> Counter:
    """Sample ids of every task of the window (default: as planned), read through the adapters:
    the reference the trained samples are compared with, independent of the data plane."""
    if tasks is None:
        tasks = Planner(env["job"].dataset, env["context"], threads=2).plan(env["window"]).tasks
    out: Counter = Counter()
    for task in tasks:
        with make_adapter(env["job"].dataset.source(task.read.source), env["context"]) as adapter:
            for batch in adapter.read(task.read):
                out.update(batch.column("sample_id").to_pylist())
    return out


def dev_train_command(env: dict, samples_log: Path, slow_executors_ms: int) -> list[str]:
    """``primus-dagster-dev train`` on the job's 3-hour window (2 executors, no evaluation, JSON result),
    logging the trained sample ids to ``samples_log`` and slowing executors so that a test can kill it
    mid-run (the SIGKILL/resume tests)."""
    command = [sys.executable, "-m", "primus_dagster.devtools.cli", "train", str(env["job_path"]), "--hours", "3"]
    command += ["--data-root", str(env["root"]), "--executors", "2", "--record-samples", str(samples_log)]
    command += ["--no-eval", "--json", "--slow-executors-ms", str(slow_executors_ms)]
    if env.get("kafka"):
        command += ["--kafka-bootstrap", env["kafka"]]
    return command


def train_one_hour(env: dict, *extra: str) -> subprocess.CompletedProcess[str]:
    """``primus-dagster train`` on the first hour of the job's window with one executor (``extra``: more
    arguments, e.g. ``--json``); its exit code, stdout and stderr."""
    command = [str(Path(sys.executable).parent / "primus-dagster"), "train", str(env["job_path"])]
    command += ["--data-root", str(env["root"]), "--start", env["window"].start.strftime("%Y-%m-%dT%H")]
    command += ["--hours", "1", "--executors", "1", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)

"""A small training job on the synthetic world, written to a temp dir (shared by the job tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
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

MODELS_DIR = Path(__file__).resolve().parents[2] / "examples" / "models"
#: example -> (factory, params, its module's class): the team models of examples/models/
EXAMPLE_MODELS = {
    "deepfm": (f"{MODELS_DIR / 'deepfm.py'}:build", {"fm_dim": 8, "hidden": [32]}, "DeepFM"),
    "torchrec_ebc": (f"{MODELS_DIR / 'torchrec_ebc.py'}:build", {"hidden": [32]}, "EBCTower"),
}


def skip_without_torchrec(example: str) -> None:
    """Skip a test of the TorchRec example where torchrec is not installed (CI installs ``.[dev]`` only)."""
    if example == "torchrec_ebc":
        import pytest

        pytest.importorskip(
            "torchrec",
            reason="torchrec is not installed (make test installs .[dev]; `make test-torchrec` installs it and runs "
            "these tests: docs/models.md)",
        )


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
  model: {model_block}
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
    model_block: str | None = None,
) -> dict:
    """Write the job spec (``model_block``: the whole ``training.model`` mapping, else the small
    ``model`` tower of the template) and ``hours`` + 2 hours of the world (an evaluation hour, and one more so
    Kafka's hours are complete); returns paths, the window and the spec."""
    # a topic of its own by default: the session's broker is shared, and two worlds in one topic interleave
    topic = topic or f"train-events-{uuid.uuid4().hex[:8]}"
    stream = KAFKA_STREAM.replace("TOPIC", topic) if kafka else PARQUET_STREAM
    root.mkdir(parents=True, exist_ok=True)
    job_path = root / "job.yaml"
    job_path.write_text(
        JOB.format(
            mode=mode,
            model_block=model_block
            or f"{{type: {model}, embedding_dim: 8, hash_buckets: 4096, memory_hidden: [16], adapt_hidden: [32, 16]}}",
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


def kill_at_first_checkpoint(env: dict, samples_log: Path, slow_executors_ms: int, timeout_s: float = 120) -> str:
    """Run :func:`dev_train_command` and SIGKILL its whole process group (the job, its ranks and
    executors: a dead node) when the run log announces a checkpoint; the announcing line."""
    first = subprocess.Popen(
        dev_train_command(env, samples_log, slow_executors_ms),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    killed_after = None
    deadline = time.monotonic() + timeout_s
    for line in first.stderr:  # type: ignore[union-attr]
        if "checkpoint at step" in line and ", done" not in line:
            os.killpg(first.pid, signal.SIGKILL)
            killed_after = line
            break
        assert time.monotonic() < deadline, f"no checkpoint within {timeout_s:g} s"
    first.wait(30)
    assert killed_after is not None and first.returncode == -signal.SIGKILL
    return killed_after


def resume_and_count(
    env: dict, first_log: Path, second_log: Path, slow_executors_ms: int, timeout_s: float = 300
) -> tuple[dict, Counter, Counter]:
    """Rerun the killed job (:func:`kill_at_first_checkpoint`); ``(its JSON result, the sample ids the
    first run trained up to the checkpoint it resumed from, those the second run trained)``."""
    second = subprocess.run(
        dev_train_command(env, second_log, slow_executors_ms), capture_output=True, text=True, timeout=timeout_s
    )
    assert second.returncode == 0, second.stderr[-3000:]
    meta = json.loads(second.stdout.strip().splitlines()[-1])
    resumed = meta["resumed_from_step"]
    assert resumed is not None and resumed > 0
    from primus_dagster.devtools.trained_sample_ids import read_trained_sample_ids

    kept = Counter(int(i) for s, ids in read_trained_sample_ids(first_log) if s <= resumed for i in ids)
    after = Counter(int(i) for _, ids in read_trained_sample_ids(second_log) for i in ids)
    return meta, kept, after


REALISTIC_SPEC = Path(__file__).resolve().parents[2] / "examples" / "realistic" / "job.yaml"


def realistic_batch_world(root: Path, rows_per_hour: int, training: dict) -> dict:
    """Three days of ``synth --schema realistic`` in ``root`` (the daily Hive Parquet source only) and
    the realistic example spec cut to that source, ``training`` merged into its ``training`` and
    MLflow on SQLite in ``root``: ``{"root", "env", "spec"}`` (the spec as a dict)."""
    import yaml

    env = {**os.environ, "PRIMUS_HOME": str(root / "home")}
    synth = [
        sys.executable,
        "-m",
        "primus_dagster.cli",
        "synth",
        "--schema",
        "realistic",
        "--spec",
        str(REALISTIC_SPEC),
    ]
    synth += ["--data-root", str(root), "--days", "3", "--rows-per-hour", str(rows_per_hour)]
    synth += ["--sources", "events_parquet", "--no-progress"]
    done = subprocess.run(synth, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    spec = yaml.safe_load(REALISTIC_SPEC.read_text())
    spec["dataset"]["streams"] = [spec["dataset"]["streams"][0]]
    spec["dataset"]["streams"][0]["sources"] = spec["dataset"]["streams"][0]["sources"][:1]
    spec["training"] |= training
    spec["tracking"] = {"tracking_uri": f"sqlite:///{root / 'mlflow.db'}", "experiment": root.name}
    return {"root": root, "env": env, "spec": spec}

"""Many tiny Parquet files train in full steps of ``batch_size`` rows.

A world of 200 files of 4 rows each per source through ``train_window`` (real executor processes, the driver,
MLflow on SQLite): the DTGG packs each hour's small files into a few tasks (``data.pack_bytes``,
``data.open_cost_bytes``), read as full batches, and the reader batches of a kind are merged into
micro-batches of ``batch_size`` rows, so the run takes about ``rows / batch_size`` steps, not one per file; a step is short only where the
trainer flushes (a checkpoint barrier, the end of the phase; one per kind in ``mixed`` mode, whose kinds
each fill their own micro-batch); every sample is trained
once, a checkpoint covers exactly the rows trained up to it, and checkpoints fall every
``checkpoint_every_steps`` full steps.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from jobkit import expected_ids

from primus_dagster.data import Batch
from primus_dagster.data.graph import Planner
from primus_dagster.data.sources import SourceContext, TimeWindow
from primus_dagster.spec import load_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world
from primus_dagster.training.run_state import RunHooks, TrainingRequest
from primus_dagster.training.trainer import Trainer
from primus_dagster.training.window import train_window

pytestmark = pytest.mark.integration

BATCH_SIZE, EVERY, HOURS, FILES_PER_HOUR = 32, 5, 2, 100
COLUMNS = "{ts: event_time, label: click, id: sample_id, dense: [d0, d1, d2], sparse: [user_id, item_id]}"
JOB = f"""
name: tiny-files
data: {{lease: 5s, buffer_batches: 8}}
pools: {{data: {{replicas: 2, task_runners: 2}}, training: {{replicas: 1}}}}
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: {HOURS}h
      sources:
        - {{name: imp, type: parquet, kind: batch, batch_rows: 500, path: parquet/impressions, columns: {COLUMNS}}}
    - name: live
      window: 1h
      sources:
        - {{name: events, type: parquet, kind: stream, batch_rows: 500, path: parquet/events, columns: {COLUMNS}}}
training:
  mode: MODE
  model: {{type: MODEL, embedding_dim: 4, hash_buckets: 1024, memory_hidden: [8], adapt_hidden: [8]}}
  batch_size: {BATCH_SIZE}
  learning_rate: 0.003
  checkpoint_every_steps: {EVERY}
tracking: {{tracking_uri: "sqlite:///ROOT/mlflow.db", experiment: tiny-files}}
"""


def tiny_world(root: Path, mode: str, model: str) -> dict:
    """The job and ``HOURS`` hours of 4-row files, ``FILES_PER_HOUR`` an hour per source."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "job.yaml"
    path.write_text(JOB.replace("MODEL", model).replace("MODE", mode).replace("ROOT", str(root)))
    job = load_job_spec(path)
    context = SourceContext(str(root))
    world = SyntheticWorld(WorldConfig(seed=3, rows_per_hour=400, n_dense=3), job.dataset.start)
    write_world(job, context, world, range(HOURS), files_per_hour=FILES_PER_HOUR, progress=False)
    window = TimeWindow(job.dataset.start, job.dataset.start + timedelta(hours=HOURS))
    return {"root": root, "job_path": path, "job": job, "context": context, "window": window}


@pytest.mark.parametrize(("mode", "model"), [("batch", "single"), ("mixed", "mtrm")])
def test_tiny_files_train_in_full_steps_each_sample_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, model: str
) -> None:
    env = tiny_world(tmp_path, mode, model)
    kinds = {"batch": {"batch"}, "mixed": {"batch", "stream"}}[mode]
    planned = Planner.for_job(env["job"], env["context"]).plan(env["window"]).tasks  # as the run plans
    tasks = [t for t in planned if t.kind in kinds]
    files = sum(t.units for t in tasks)
    assert files >= FILES_PER_HOUR * HOURS and len(tasks) < files / 10  # packs of the small files
    expected = expected_ids(env, tasks)

    steps: list[tuple[int, int, str, list[int]]] = []  # (step, rows, kind, sample ids) of each optimiser step
    apply = Trainer.apply

    def recording(self: Trainer, batch: Batch, loss: torch.Tensor, started: float) -> float:
        value = apply(self, batch, loss, started)
        assert batch.sample_id is not None
        steps.append((self.step, batch.rows, batch.kind, batch.sample_id.tolist()))
        return value

    monkeypatch.setattr(Trainer, "apply", recording)
    reported: list[tuple[int, list[int]]] = []  # on_batch: (step, sample ids of the reader batch)

    def on_batch(step: int, batch: Batch, trainer: int) -> None:
        assert batch.sample_id is not None
        reported.append((step, batch.sample_id.tolist()))

    request = TrainingRequest(env["job"], env["job_path"], env["root"], env["window"], executors=2, evaluate=False)
    result = train_window(request, RunHooks(on_batch=on_batch))

    rows = sum(expected.values())
    # every sample once: in the optimiser steps and in what on_batch heard
    assert Counter(i for *_, ids in steps for i in ids) == expected
    assert Counter(i for _, ids in reported for i in ids) == expected
    assert [s for s, *_ in steps] == list(range(1, len(steps) + 1)) and result.stats["step"] == len(steps)
    assert len(reported) >= len(tasks)

    # a step is short only at a flush (a checkpoint, the end of the phase), one per kind with rows held:
    # each kind fills its own micro-batch, so mixed mode's alternating kinds make full steps too
    checkpoints = set(result.checkpoints)
    flushed = {s for ck in checkpoints for s in range(ck - len(kinds) + 1, ck + 1)}
    short = {s for s, n, *_ in steps if n < BATCH_SIZE}
    assert short <= flushed, sorted(short - flushed)
    assert len(steps) <= math.ceil(rows / BATCH_SIZE) + len(kinds) * len(checkpoints)
    assert files > 4 * len(steps)  # steps are far fewer than files

    # a checkpoint covers exactly the rows trained up to it, and they are whole reader batches
    for ck in result.checkpoints:
        trained = Counter(i for s, _, _, ids in steps if s <= ck for i in ids)
        assert Counter(i for s, ids in reported if s <= ck for i in ids) == trained
    # checkpoints fall every EVERY full steps, at the end of a reader batch (a pack's batch holds several
    # steps' rows), more by the short ones the flush adds: one per kind
    ordered = sorted(checkpoints)
    gaps = [b - a for a, b in itertools.pairwise([0, *ordered[:-1]])]  # the last: the end of the phase
    within = math.ceil(max(len(ids) for _, ids in reported) / BATCH_SIZE) - 1  # steps a reader batch may add
    assert gaps and all(EVERY <= g <= EVERY + within + len(kinds) for g in gaps), (gaps, within)

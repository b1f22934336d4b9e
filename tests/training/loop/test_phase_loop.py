"""The phase loop with the one-trainer coordinator, in process: rounds, micro-batches, the checkpoint cadence
and record, a resume that goes on where the checkpoint left off, progress and audits through the sink."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from primus_dagster.data import Batch
from primus_dagster.spec.job import ModelSpec, TrainingSpec
from primus_dagster.training.checkpoint import load_checkpoint
from primus_dagster.training.features import FeatureLayout, ModelInit
from primus_dagster.training.loop import (
    PhaseContext,
    PhaseLoop,
    ProgressPoint,
    RankCounters,
    SavedCheckpoint,
    Solo,
    TrainerStart,
    TrainerState,
)

SMALL = {"embedding_dim": 4, "hash_buckets": 512, "memory_hidden": [8], "adapt_hidden": [8]}


def reader_batch(kind: str, rows: int, seed: int, task: str = "t") -> Batch:
    g = np.random.default_rng(seed)
    columns = pa.record_batch(
        {
            "ts": pa.array(np.zeros(rows, dtype="int64"), pa.timestamp("us", "UTC")),
            "label": (g.random(rows) < 0.3).astype("float32"),
            "dense": pa.FixedSizeListArray.from_arrays(pa.array(g.standard_normal(rows * 3).astype("float32")), 3),
            "s0": g.integers(0, 40, rows),
            "s1": g.integers(0, 40, rows),
        }
    )
    return Batch.from_arrow(columns, kind=kind)


class ListReader:
    """Reader batches from a list; barriers answer with a snapshot naming the round and what was consumed."""

    def __init__(self, batches: list[Batch]):
        self.batches = deque(batches)
        self.barriers: list[int] = []
        self.taken = 0

    def next_batch(self, kind: str | None = None, timeout: float | None = None) -> Batch | None:
        if not self.batches:
            return None
        self.taken += 1
        return self.batches.popleft()

    def barrier(self, barrier_id: int, wait_s: float = 0.0) -> dict[str, Any] | None:
        self.barriers.append(barrier_id)
        return {"barrier_id": barrier_id, "consumed": self.taken}


class RecordingSink:
    wants_batches = True

    def __init__(self) -> None:
        self.trained: list[tuple[int, int]] = []  # (step, rows)
        self.points: list[ProgressPoint] = []
        self.saved: list[SavedCheckpoint] = []

    def batch_trained(self, rank: int, step: int, batch: Batch) -> None:
        self.trained.append((step, batch.rows))

    def progress(self, point: ProgressPoint) -> None:
        self.points.append(point)

    def checkpoint(self, rank: int, step: int, saved: SavedCheckpoint | None) -> None:
        assert saved is not None
        self.saved.append(saved)


def context(
    tmp_path: Path, *, every: int = 3, start: TrainerStart | None = None, model: str = "single"
) -> PhaseContext:
    mode = "mixed" if model == "mtrm" else "batch"
    spec = TrainingSpec(mode=mode, batch_size=16, checkpoint_every_steps=every, model=ModelSpec(type=model, **SMALL))
    layout = FeatureLayout.plain(spec.model, 3, 2)
    return PhaseContext(
        spec_json=spec.model_dump_json(),
        phase="batch",
        prioritised=False,
        deterministic=False,
        kind_weights={},
        world=1,
        versions={"src": 1},
        window=["2026-11-01T00:00:00+00:00", "2026-11-02T00:00:00+00:00"],
        checkpoint_dir=str(tmp_path / "checkpoints"),
        model_init=ModelInit(layout).to_dict(),
        start=start,
    )


def test_small_reader_batches_make_full_steps_and_checkpoints_cover_whole_batches(tmp_path: Path) -> None:
    batches = [reader_batch("batch", 10, seed) for seed in range(9)]  # 90 rows
    reader, sink = ListReader(batches), RecordingSink()
    loop = PhaseLoop(context(tmp_path, every=3), Solo(), reader, sink)
    loop.run()
    loop.finish()
    # steps of 16, 16, 16 rows; at round 3 the drain flushes the open one (2 rows: round 4) and checkpoints
    # 5 whole reader batches; then 16, 16 and the last 8 rows, and the phase's checkpoint at round 7
    assert loop.state.rounds == 7 and loop.state.trainer is not None and loop.state.trainer.step == 7
    assert [s.step for s in sink.saved] == [4, 7] and reader.barriers == [4, 7]
    first = load_checkpoint(sink.saved[0].path)
    assert first.data_snapshot == {"barrier_id": 4, "consumed": 5} and not first.extra["phase_done"]
    assert first.samples == 50 and first.extra["ranks"] == [
        RankCounters(4, 50, {"batch": 50, "stream": 0}, 0, 5).to_dict()
    ]
    last = load_checkpoint(sink.saved[-1].path)
    assert last.extra["phase_done"] and last.samples == 90 and last.source_versions == {"src": 1}
    assert sum(rows for _, rows in sink.trained) == 90 and len(sink.trained) == 9
    assert sink.points and sink.points[-1].samples == 90  # the phase's last point is forced
    assert sorted(step for p in sink.points for step, _ in p.losses) == list(range(1, 8))  # every round's loss


def test_a_resume_goes_on_from_the_checkpoint_as_the_uninterrupted_run(tmp_path: Path) -> None:
    batches = [reader_batch("batch", 16, seed) for seed in range(8)]
    whole = PhaseLoop(context(tmp_path / "a", every=3), Solo(), ListReader(batches), RecordingSink())
    whole.run()
    first = RecordingSink()
    cut = PhaseLoop(context(tmp_path / "b", every=3), Solo(), ListReader(batches[:3]), first)
    cut.run()  # its drain checkpoints at round 3
    saved = first.saved[-1]
    start = TrainerStart(saved.path, "resume", step=saved.step, phase="batch", ranks=saved.ranks)
    resumed = PhaseLoop(context(tmp_path / "b", every=3, start=start), Solo(), ListReader(batches[3:]), RecordingSink())
    assert resumed.state.rounds == 3
    resumed.run()
    assert resumed.state.rounds == whole.state.rounds == 8
    assert resumed.state.trainer is not None and whole.state.trainer is not None
    assert resumed.state.trainer.counters.samples == 128
    for a, b in zip(resumed.state.trainer.model.parameters(), whole.state.trainer.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert resumed.result().samples_trained == 80


def test_the_model_observes_every_trained_micro_batch_once(tmp_path: Path) -> None:
    batches = [reader_batch(kind, 16, seed) for seed, kind in enumerate(["batch", "stream"] * 3)]
    loop = PhaseLoop(context(tmp_path, every=100, model="mtrm"), Solo(), ListReader(batches), RecordingSink())
    loop.run()
    model = loop.state.trainer.model  # type: ignore[union-attr]
    labels = [float(b.label.sum()) for b in batches]
    assert model.label_counts.tolist() == [48.0, 48.0]
    assert model.label_sums.tolist() == pytest.approx([sum(labels[0::2]), sum(labels[1::2])])


def test_a_carried_trainer_goes_on_into_the_next_phase(tmp_path: Path) -> None:
    state = TrainerState()
    first = PhaseLoop(
        context(tmp_path, every=100), Solo(), ListReader([reader_batch("batch", 16, 1)]), RecordingSink(), state=state
    )
    first.run()
    trainer = state.trainer
    second = PhaseLoop(
        context(tmp_path, every=100), Solo(), ListReader([reader_batch("batch", 16, 2)]), RecordingSink(), state=state
    )
    second.run()
    assert state.trainer is trainer and state.rounds == 2 and second.result().samples_trained == 16


class ShardedSolo(Solo):
    """Solo with sharded tables: it records whether the trainer existed at every agreement (a build there
    would be a collective inside a round that a peer without data never enters)."""

    def __init__(self) -> None:
        self.table_shards = object()  # type: ignore[assignment]  # only its presence matters to the loop
        self.built_at_agree: list[bool] = []

    def agree(self, status: Any, trainer: Any, micro: Any) -> Any:
        self.built_at_agree.append(trainer is not None)
        return super().agree(status, trainer, micro)


def test_a_group_with_sharded_tables_builds_before_its_first_round_even_with_no_data(tmp_path: Path) -> None:
    coordinator = ShardedSolo()
    loop = PhaseLoop(context(tmp_path, every=100), coordinator, ListReader([]), RecordingSink())
    loop.run()
    assert loop.state.trainer is not None and coordinator.built_at_agree == [True]
    plain = Solo()
    unbuilt = PhaseLoop(context(tmp_path, every=100), plain, ListReader([]), RecordingSink())
    unbuilt.run()
    assert unbuilt.state.trainer is None  # without shards the first round with data builds it

"""Training modes as phases: order, kinds, task selection, resume lookups."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from primus_dagster.data.sources.base import ReadTask
from primus_dagster.data.tasks import DataTask
from primus_dagster.training.modes import phase_index, phase_tasks, phases

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def task(kind: str, name: str) -> DataTask:
    return DataTask.for_read("s-" + kind, kind, ReadTask(name, T0, f"/data/{name}.parquet"))  # type: ignore[arg-type]


def test_phases_per_mode() -> None:
    assert [p.kinds for p in phases("batch")] == [("batch",)]
    assert [p.kinds for p in phases("stream")] == [("stream",)]
    assert [p.name for p in phases("batch_then_stream")] == ["batch", "stream"]
    (mixed,) = phases("mixed")
    assert mixed.prioritised and set(mixed.kinds) == {"batch", "stream"}
    assert not phases("batch")[0].prioritised


def test_phase_tasks_keep_planner_order() -> None:
    tasks = [task("batch", "a"), task("stream", "b"), task("batch", "c")]
    first, second = phases("batch_then_stream")
    assert [t.read.source for t in phase_tasks(tasks, first)] == ["a", "c"]
    assert [t.read.source for t in phase_tasks(tasks, second)] == ["b"]
    assert len(phase_tasks(tasks, phases("mixed")[0])) == 3


def test_unknown_mode_and_foreign_checkpoint_phase_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown training mode 'online'"):
        phases("online")
    assert phase_index("batch_then_stream", "stream") == 1
    with pytest.raises(ValueError, match=r"training\.mode changed"):
        phase_index("mixed", "stream")

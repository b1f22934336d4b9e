"""``label_delay`` in the training plan: a batch partition whose labels are complete only after the training
window's end does not feed the memory tower; it is counted, and named when nothing else is left."""

from __future__ import annotations

from datetime import timedelta

import pytest
from jobkit import make_job

from primus_dagster.training.planning import NoTrainingDataError, label_incomplete, plan_training_tasks


def batch_hours(tasks) -> list[int]:
    return sorted({t.partition.hour for t in tasks if t.kind == "batch"})


def test_label_delay_leaves_out_batch_partitions_not_complete_by_the_window_end(tmp_path) -> None:
    env = make_job(tmp_path, hours=3, rows_per_hour=200)  # mixed, no batch lag: batch hours 0-2 of the window
    job, context, window = env["job"], env["context"], env["window"]
    assert batch_hours(plan_training_tasks(job, context, window)) == [0, 1, 2]  # label_delay 0s: all complete

    job.dataset.streams[0].sources[0].label_delay = timedelta(hours=1)  # hour h complete at h + 2h
    tasks = plan_training_tasks(job, context, window)
    assert batch_hours(tasks) == [0, 1]  # hours 0, 1 are complete at 02:00, 03:00; hour 2 only at 04:00
    assert {t.kind for t in tasks} == {"batch", "stream"}  # the stream is never held back by label_delay
    left_out = label_incomplete(job, [t for t in tasks if t.kind == "stream"], window)
    assert left_out == []


def test_a_window_with_only_incomplete_batch_data_names_why(tmp_path) -> None:
    env = make_job(tmp_path, mode="batch", model="single", hours=2, rows_per_hour=200)
    job = env["job"]
    job.dataset.streams[0].sources[0].label_delay = timedelta(hours=24)
    with pytest.raises(NoTrainingDataError, match=r"imp 2026-11-01T00: labels complete at 2026-11-02T01:00:00\+00:00"):
        plan_training_tasks(job, env["context"], env["window"])


def test_batch_lag_covering_the_label_delay_keeps_every_lagged_partition(tmp_path) -> None:
    env = make_job(tmp_path, hours=3, rows_per_hour=200, extra_training="batch_lag: 2h")
    job = env["job"]
    job.dataset.streams[0].sources[0].label_delay = timedelta(hours=2)
    window = env["window"].__class__(env["window"].start + timedelta(hours=2), env["window"].end + timedelta(hours=1))
    # The window 02:00-04:00 reads batch hours 0-1, complete at 03:00 and 04:00: both by the window end.
    assert batch_hours(plan_training_tasks(job, env["context"], window)) == [0, 1]

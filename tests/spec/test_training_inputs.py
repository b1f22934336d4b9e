"""The one input rule (:mod:`primus_dagster.spec.inputs`: which source partitions feed a training window)
against a brute-force reference, and its three users against it:

(a) the sensors (:mod:`primus_dagster.dagster_defs.sensors`) use the rule itself, through their own view
    of a training partition (its window and the source partition keys): the same partitions;
(b) the training asset's dependencies (``source_deps`` on ``training_partitions_def``, mapped by Dagster's
    ``TimeWindowPartitionMapping`` onto the source assets' partitions) hold **at least** the rule's
    partitions, and exactly those when nothing makes a mapping coarser. A Dagster mapping is a window
    shifted by whole downstream partitions, named for every source, so it is necessarily coarser where
    (1) ``batch_lag`` is not a whole number of training partitions (the shifted window is rounded out to
    them), (2) a batch partition's labels are not complete by the window's end (``end + label_delay``
    cannot be a whole-partition offset: a 90m delay, or one that differs per source), (3) the mode does
    not read the source's kind (the asset still depends on it: same graph whatever the mode). What it
    holds beyond the rule is pinned too: the partitions overlapping the rounded window within the dataset;
(c) the planner (``plan_training_tasks``, on a small world on disk): its tasks' partitions per source are
    the rule's, less those not on disk.

Jobs are generated (hour / day sources and training partitions, batch lag, label delays, modes, dataset
start and end); dataset ends are whole days (a partial last day is a partition of the rule but not of
Dagster's daily partitions: ``time_partitions`` cuts the end to the day).
"""

from __future__ import annotations

import doctest
import os
import sys
import typing
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from dagster import DagsterInstance, TimeWindowPartitionMapping, TimeWindowPartitionsDefinition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primus_dagster.dagster_defs import sensors
from primus_dagster.dagster_defs.partitions import time_partitions
from primus_dagster.dagster_defs.sensors import TrainingRequests
from primus_dagster.dagster_defs.training_asset import source_deps, training_partitions_def
from primus_dagster.data import TimeWindow
from primus_dagster.spec import (
    MODE_PHASES,
    JobSpec,
    Span,
    TrainingSpec,
    clip_to_dataset,
    dependency_offsets,
    first_training_start,
    granularity_step,
    mode_kinds,
    parse_job_spec,
    partition_starts,
    training_inputs,
    training_span_fed_by,
)
from primus_dagster.spec import inputs as rule
from primus_dagster.training import modes
from primus_dagster.training.planning import plan_training_tasks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from jobkit import make_job

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
STEP = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
# Generated jobs start well before today: Dagster's open-ended partitions end at the real "now", so a
# generated window must never reach it (a window of today or later has no training partition yet).
PAST = datetime(2025, 1, 1, tzinfo=timezone.utc)
FAR = PAST + timedelta(days=400)  # "now" for the mappings: every partition of a generated job has started
PROPERTY = settings(
    max_examples=int(os.environ.get("PRIMUS_FUZZ_EXAMPLES", "60")),
    deadline=None,
    database=None,  # nothing written under the work tree
    suppress_health_check=[HealthCheck.too_slow],
)


# ---- generated jobs and windows ---------------------------------------------------------------------------

half_hours = st.integers(min_value=0, max_value=4 * 24).map(lambda n: timedelta(minutes=30 * n))  # 0 .. 48h


@st.composite
def jobs(draw: st.DrawFn) -> JobSpec:
    """1-3 sources (each in a stream of its own, a 1-day window fits hour and day), hour / day
    granularities, label delays and batch lag in half hours up to 48h, any mode, an hour-aligned start
    and an optional whole-day end."""
    start = PAST + timedelta(hours=draw(st.integers(0, 47)))
    days = draw(st.none() | st.integers(1, 6))
    end = (
        None
        if days is None
        else datetime.combine(start.date(), datetime.min.time(), timezone.utc) + timedelta(days=days)
    )
    streams = []
    for i in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["batch", "stream"]))
        granularity = draw(st.sampled_from(["hour", "day"]))
        delay = int(draw(half_hours).total_seconds() // 60)
        streams.append(
            f"    - name: s{i}\n      window: 1d\n      sources:\n"
            f"        - {{name: src{i}, type: parquet, kind: {kind}, granularity: {granularity}, "
            f"label_delay: {delay}m, path: p{i}, columns: {{ts: t, dense: [d]}}}}\n"
        )
    mode = draw(st.sampled_from(sorted(MODE_PHASES)))
    partition = draw(st.sampled_from(["hour", "day"]))
    lag = int(draw(half_hours).total_seconds() // 60)
    return parse_job_spec(
        f"name: gen\ndataset:\n  start: {start.isoformat()}\n"
        + (f"  end: {end.isoformat()}\n" if end else "")
        + "  streams:\n"
        + "".join(streams)
        + f"training: {{mode: {mode}, partition: {partition}, batch_lag: {lag}m, model: {{type: single}}}}\n"
    )


def training_partitions(job: JobSpec) -> TimeWindowPartitionsDefinition:
    partitions = training_partitions_def(job)
    assert isinstance(partitions, TimeWindowPartitionsDefinition)
    return partitions


def nth_training_window(job: JobSpec, n: int) -> TimeWindow:
    """The window of the ``n``-th partition of the training asset (its Dagster partitions definition)."""
    first = training_partitions(job).get_first_partition_window()
    assert first is not None
    step = STEP[job.training.partition]
    return TimeWindow(first.start + n * step, first.end + n * step)


# ---- the reference: every source partition near the window, tested against the rule's words ----------------


def floor(moment: datetime, step: timedelta) -> datetime:
    return EPOCH + ((moment - EPOCH) // step) * step


def candidates(source, window: TimeWindow) -> list[datetime]:
    """Every partition start of ``source`` from 3 days before the window to 3 days after it."""
    step = STEP[source.granularity]
    out, current = [], floor(window.start - timedelta(days=3), step)
    while current < window.end + timedelta(days=3):
        out.append(current)
        current += step
    return out


def feeds(job: JobSpec, source, start: datetime, window: TimeWindow) -> bool:
    """The rule in its own words: the mode reads the kind; the partition overlaps the part inside the
    dataset of the window (stream) or of the window shifted back by the batch lag (batch); a batch
    partition's labels are complete by the window's end."""
    kinds = {"batch": {"batch"}, "stream": {"stream"}}.get(job.training.mode, {"batch", "stream"})
    end = start + STEP[source.granularity]
    lag = job.training.batch_lag if source.kind == "batch" else timedelta(0)
    low = max(window.start - lag, job.dataset.start)
    high = window.end - lag if job.dataset.end is None else min(window.end - lag, job.dataset.end)
    return (
        source.kind in kinds
        and low < high
        and start < high
        and end > low
        and (source.kind == "stream" or end + source.label_delay <= window.end)
    )


def reference(job: JobSpec, window: TimeWindow) -> dict[str, list[datetime]]:
    kinds = {"batch": {"batch"}, "stream": {"stream"}}.get(job.training.mode, {"batch", "stream"})
    return {
        s.name: [p for p in candidates(s, window) if feeds(job, s, p, window)]
        for _, s in job.dataset.all_sources()
        if s.kind in kinds
    }


@given(jobs(), st.integers(0, 60), st.integers(-48, 48), st.integers(1, 72))
@PROPERTY
def test_the_rule_is_its_definition_and_the_inverse_agrees(job: JobSpec, n: int, shift: int, hours: int) -> None:
    windows = [nth_training_window(job, n)]  # a training partition, and any window the planner may be given
    windows.append(
        TimeWindow(windows[0].start + timedelta(hours=shift), windows[0].start + timedelta(hours=shift + hours))
    )
    for window in windows:
        inputs = training_inputs(job, window)
        assert inputs == reference(job, window)
        for _, source in job.dataset.all_sources():
            for start in candidates(source, window):
                # the inverse: a window reads a partition iff it overlaps the span the partition feeds and
                # the rule's other conditions hold (so a retrain of the windows over that span misses none)
                span = training_span_fed_by(job, source, start)
                overlaps = span.start < window.end and window.start < span.end
                assert (start in inputs.get(source.name, [])) == (overlaps and feeds(job, source, start, window))


# ---- (a) the sensors ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def instance():
    with DagsterInstance.ephemeral() as instance:
        yield instance


def test_the_sensors_hold_no_copy_of_the_rule() -> None:
    assert sensors.training_inputs is rule.training_inputs
    assert sensors.complete_at is rule.complete_at
    assert sensors.training_span_fed_by is rule.training_span_fed_by
    assert not hasattr(sensors, "_MODE_KINDS")


@given(jobs(), st.integers(0, 30))
@PROPERTY
def test_the_sensors_view_of_a_training_partition_is_the_rule(instance, job: JobSpec, n: int) -> None:
    window = nth_training_window(job, n)
    plan = TrainingRequests(job, None, instance, now=window.end + timedelta(days=1))
    assert isinstance(plan.partitions, TimeWindowPartitionsDefinition)
    key = plan.partitions.get_partition_key_for_timestamp(window.start.timestamp())
    assert plan.window(key) == window
    seen = {
        name: [plan.source_key(job.dataset.source(name), s) for s in starts]
        for name, starts in sensors.training_inputs(job, plan.window(key)).items()
    }
    expected = {}
    for name, starts in reference(job, window).items():
        source_partitions = time_partitions(job.dataset.source(name).granularity, job.dataset.start, job.dataset.end)
        expected[name] = [source_partitions.get_partition_key_for_timestamp(s.timestamp()) for s in starts]
    assert seen == expected


# ---- (b) the training asset's dependencies ---------------------------------------------------------------------


@given(jobs(), st.integers(0, 30))
@PROPERTY
def test_the_asset_dependencies_hold_the_rule_and_exactly_it_where_dagster_can_say_it(job: JobSpec, n: int) -> None:
    training = training_partitions(job)
    window = nth_training_window(job, n)
    key = training.get_partition_key_for_timestamp(window.start.timestamp())
    first = training.get_first_partition_window()
    assert first is not None and first.start == floor(first_training_start(job), STEP[job.training.partition])
    inputs = training_inputs(job, window)
    step = granularity_step(job.training.partition)
    for dep in source_deps(job):
        source, mapping = job.dataset.source(dep.asset_key.path[-1]), dep.partition_mapping
        assert isinstance(mapping, TimeWindowPartitionMapping)
        upstream = time_partitions(source.granularity, job.dataset.start, job.dataset.end)
        result = mapping.get_upstream_mapped_partitions_result_for_partitions(
            training.empty_subset().with_partition_keys([key]), training, upstream, current_time=FAR
        )
        mapped = sorted(
            upstream.time_window_for_partition_key(k).start for k in result.partitions_subset.get_partition_keys()
        )
        read = inputs.get(source.name, [])
        assert set(read) <= set(mapped)  # at least the rule
        start_offset, end_offset = dependency_offsets(job, source)
        assert (mapping.start_offset, mapping.end_offset) == (start_offset, end_offset)
        rounded = clip_to_dataset(job.dataset, Span(window.start + start_offset * step, window.end + end_offset * step))
        assert mapped == (partition_starts(rounded, source.granularity) if rounded else [])  # and no more than that
        lag = job.training.batch_lag if source.kind == "batch" else timedelta(0)
        unfiltered = clip_to_dataset(job.dataset, Span(window.start - lag, window.end - lag))
        everything = partition_starts(unfiltered, source.granularity) if unfiltered else []
        if lag % step == timedelta(0) and source.kind in mode_kinds(job.training.mode) and read == everything:
            assert mapped == read  # exactly the rule when no cause of (1)-(3) applies


# ---- the mode table: one, read by the training phases ---------------------------------------------------------


def test_one_mode_table_for_the_spec_the_rule_and_the_phases() -> None:
    assert set(MODE_PHASES) == set(typing.get_args(TrainingSpec.model_fields["mode"].annotation))
    for mode, table in MODE_PHASES.items():
        assert [(p.name, p.kinds) for p in modes.phases(mode)] == list(table)
        assert mode_kinds(mode) == {k for p in modes.phases(mode) for k in p.kinds}
    with pytest.raises(ValueError, match="unknown training mode 'online'"):
        mode_kinds("online")


def test_the_rules_examples_hold() -> None:
    result = doctest.testmod(rule)
    assert result.attempted > 10 and result.failed == 0


# ---- (c) the planner, on a small world on disk -----------------------------------------------------------------

HOURS_ON_DISK = 5  # make_job(hours=3): hours 0-4 of both sources (imp: batch, events: stream; hourly)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory) -> dict[str, dict]:
    """One world per model type: mtrm for the two-kind modes, single for batch / stream."""
    root = tmp_path_factory.mktemp("inputs")
    return {
        "mixed": make_job(root / "mtrm", hours=3, rows_per_hour=60),
        "batch": make_job(root / "single", mode="batch", model="single", hours=3, rows_per_hour=60),
    }


@pytest.mark.parametrize(
    "mode,lag,delay,start,hours",
    [
        ("mixed", "0h", "0h", 0, 3),
        ("mixed", "2h", "3h", 2, 3),  # lagged batch hours 0-2; hour 2 is complete only at 06:00
        ("mixed", "90m", "30m", 2, 2),  # a lag of one and a half hours: batch hours 0-2
        ("batch_then_stream", "1h", "2h", 1, 3),
        ("mixed", "1h", "0h", 3, 4),  # stream hours 5-6 are not on disk
        ("batch", "0h", "1h", 0, 4),
        ("stream", "1h", "3h", 1, 2),
    ],
)
def test_the_planner_reads_the_rules_partitions(worlds, mode, lag, delay, start, hours) -> None:
    env = worlds["mixed" if mode in ("mixed", "batch_then_stream") else "batch"]
    job = env["job"].model_copy(deep=True)
    job.training.mode = mode
    job.training.batch_lag = lag
    job.dataset.source("imp").label_delay = delay
    window = TimeWindow(T0 + timedelta(hours=start), T0 + timedelta(hours=start + hours))
    tasks = plan_training_tasks(job, env["context"], window)
    planned = {name: sorted({t.partition for t in tasks if t.read.source == name}) for name in ("imp", "events")}
    on_disk = {T0 + timedelta(hours=h) for h in range(HOURS_ON_DISK)}
    expected = {name: [s for s in starts if s in on_disk] for name, starts in training_inputs(job, window).items()}
    assert {name: starts for name, starts in planned.items() if starts or name in expected} == expected
    for task in tasks:  # a lagged batch task is handed out beside the training time it feeds
        fed = training_span_fed_by(job, job.dataset.source(task.read.source), task.partition)
        assert task.order_key[0] == fed.start.isoformat()

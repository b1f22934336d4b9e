"""Source checks catch bad values, each as a failed check result that names the file.

A partition of two real Parquet files, one of them bad -- fractional ids in a sparse column, a null
event time, event times outside the hour, epoch milliseconds declared as seconds -- is materialised
in-process with its checks: the check of that concern fails (severity ERROR) with the bad file's path,
the rows and example values in its description and metadata, the good file is not named, and the other
checks pass. Dagster then fails the step with ``DagsterAssetCheckFailedError``, which names only the
check; the reason is in the check result and in the run log. Integer-valued float ids and string ids
(hashed) are ids: a partition of them passes every check.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from dagster import AssetCheckSeverity, AssetKey, ExecuteInProcessResult, instance_for_test, materialize

from primus_dagster.dagster_defs import (
    EVENT_TIMES_IN_PARTITION,
    NO_UNREADABLE_FILES,
    SCHEMA_MATCHES_SPEC,
    SOURCE_CHECK_DESCRIPTIONS,
    PrimusStorageResource,
    build_source_assets,
)
from primus_dagster.dagster_defs.source_checks import RULE_CHECKS
from primus_dagster.data import GATED_RULES
from primus_dagster.spec import JobSpec, parse_job_spec

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
HOUR_0 = "2026-11-01-00:00"
CLICKS = AssetKey("clicks")
ROWS = 40


def job_for(columns_extra: str = "", source_extra: str = "") -> JobSpec:
    """One hourly Parquet source ``clicks`` with a numeric id ``user_id`` and a string id ``country``."""
    return parse_job_spec(f"""
name: t
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: 2h
      sources:
        - name: clicks
          type: parquet
          granularity: hour
          path: pq
          {source_extra}
          columns: {{ts: event_time, {columns_extra} label: click, id: sample_id, dense: [d0],
                     sparse: [user_id, country]}}
training:
  partition: hour
  features:
    categorical:
      - {{name: user_id}}
      - {{name: country, buckets: 64, dim: 4}}
""")


def hour_table(n: int = ROWS, seed: int = 0) -> pa.Table:
    """``n`` good rows of the first hour: float ids that are whole, string ids, event times inside the hour."""
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "sample_id": pa.array(np.arange(n) + 1000 * seed, pa.int64()),
            "event_time": pa.array([T0 + timedelta(seconds=60 * i) for i in range(n)], pa.timestamp("us", tz="UTC")),
            "click": pa.array(rng.integers(0, 2, n), pa.int32()),
            "user_id": pa.array(rng.integers(0, 9, n).astype(np.float64)),  # whole floats: ids
            "country": pa.array(rng.choice(["de", "fr", "us"], n)),  # strings: hashed ids
            "d0": pa.array(rng.random(n), pa.float32()),
        }
    )


def write_hour(root: Path, bad: Callable[[pa.Table], pa.Table] | None = None) -> tuple[Path, Path]:
    """Two files of the first hour, the second changed by ``bad``; returns (good file, changed file)."""
    directory = root / "pq" / "dt=2026-11-01" / "hour=00"
    directory.mkdir(parents=True)
    good, changed = directory / "part-0.parquet", directory / "part-1.parquet"
    pq.write_table(hour_table(seed=0), good)
    table = hour_table(seed=1)
    pq.write_table(bad(table) if bad is not None else table, changed)
    (directory / "_SUCCESS").touch()
    return good, changed


def with_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def fractional_ids(table: pa.Table) -> pa.Table:
    ids = table.column("user_id").to_pylist()
    ids[3], ids[7], ids[9] = 3.5, 0.25, 3.5
    return with_column(table, "user_id", pa.array(ids, pa.float64()))


def null_event_times(table: pa.Table) -> pa.Table:
    times = table.column("event_time").to_pylist()
    times[0] = times[5] = None
    return with_column(table, "event_time", pa.array(times, pa.timestamp("us", tz="UTC")))


def times_in_the_next_hour(table: pa.Table) -> pa.Table:
    shifted = pc.add(table.column("event_time"), pa.scalar(timedelta(minutes=30)))  # rows 30..39 in hour 01
    return with_column(table, "event_time", shifted)


def materialize_hour(root: Path, job: JobSpec | None = None, instance=None) -> ExecuteInProcessResult:
    return materialize(
        build_source_assets(job or job_for()),
        partition_key=HOUR_0,
        resources={"storage": PrimusStorageResource(data_root=str(root))},
        instance=instance,
        raise_on_error=False,
    )


def outcomes(result: ExecuteInProcessResult) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def evaluation_of(result: ExecuteInProcessResult, check_name: str):
    (evaluation,) = [e for e in result.get_asset_check_evaluations() if e.check_name == check_name]
    return evaluation


def step_failure_class(result: ExecuteInProcessResult) -> str:
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    return failure.event_specific_data.error.cls_name


def test_every_gated_rule_fails_one_declared_check() -> None:
    assert set(RULE_CHECKS) == set(GATED_RULES) and set(RULE_CHECKS.values()) <= set(SOURCE_CHECK_DESCRIPTIONS)


def test_whole_float_ids_and_string_ids_pass_every_check(tmp_path: Path) -> None:
    write_hour(tmp_path)
    result = materialize_hour(tmp_path)
    assert result.success
    assert outcomes(result) == dict.fromkeys(SOURCE_CHECK_DESCRIPTIONS, True)
    (event,) = result.get_asset_materialization_events()
    assert event.materialization.metadata["rows"].value == 2 * ROWS
    for evaluation in result.get_asset_check_evaluations():
        assert "failing_file" not in evaluation.metadata and "findings" not in evaluation.metadata


# fault -> (how the second file is broken, the check that fails, rows broken, text the file's line names)
FAULTS: dict[str, tuple[Callable[[pa.Table], pa.Table], str, int, str]] = {
    "fractional ids": (fractional_ids, SCHEMA_MATCHES_SPEC, 3, "column 'user_id', e.g. 3.5, 0.25"),
    "null event times": (null_event_times, EVENT_TIMES_IN_PARTITION, 2, "null event time (column 'event_time')"),
    "event times outside the hour": (
        times_in_the_next_hour,
        EVENT_TIMES_IN_PARTITION,
        10,
        "outside the partition [2026-11-01T00:00:00+00:00, 2026-11-01T01:00:00+00:00) "
        "(column 'event_time', e.g. 2026-11-01 01:00:00",
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_bad_value_fails_its_check_naming_the_file(tmp_path: Path, fault: str) -> None:
    breaks, failing, rows, named = FAULTS[fault]
    good, bad = write_hour(tmp_path, breaks)
    with instance_for_test() as instance:
        result = materialize_hour(tmp_path, instance=instance)
        log_lines = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert not result.success and step_failure_class(result) == "DagsterAssetCheckFailedError"
    assert {name for name, passed in outcomes(result).items() if not passed} == {failing}
    evaluation = evaluation_of(result, failing)
    assert evaluation.severity == AssetCheckSeverity.ERROR
    assert f"{bad}: {rows} row(s) with" in evaluation.description and named in evaluation.description
    assert str(good) not in evaluation.description
    metadata = evaluation.metadata
    assert metadata["failing_file"].value == str(bad) and metadata["failing_files"].value == [str(bad)]
    assert metadata["bad_rows"].value == rows and metadata["problem_count"].value == 1
    assert metadata["partition"].value == HOUR_0
    (finding,) = metadata["findings"].value
    assert finding["path"] == str(bad) and finding["rows"] == rows
    # the reason is in the run log too, not only in the check result
    assert any(failing in line and str(bad) in line for line in log_lines)


def test_dropped_and_repaired_rows_still_fail_and_the_action_is_named(tmp_path: Path) -> None:
    _, bad = write_hour(tmp_path, fractional_ids)
    result = materialize_hour(tmp_path, job_for(source_extra="quality: {bad_id: drop}"))
    evaluation = evaluation_of(result, SCHEMA_MATCHES_SPEC)
    assert not evaluation.passed and f"{bad}: 3 row(s)" in evaluation.description
    assert "quality.bad_id: drop" in evaluation.description
    assert evaluation.metadata["findings"].value[0]["action"] == "drop"
    assert result.get_asset_materialization_events()[0].materialization.metadata["rows"].value == 2 * ROWS - 3


def test_a_quality_rule_set_to_fail_fails_its_check_not_readability(tmp_path: Path) -> None:
    good, bad = write_hour(tmp_path, fractional_ids)
    result = materialize_hour(tmp_path, job_for(source_extra="quality: {bad_id: fail}"))
    assert {name for name, passed in outcomes(result).items() if not passed} == {SCHEMA_MATCHES_SPEC}
    evaluation = evaluation_of(result, SCHEMA_MATCHES_SPEC)
    assert evaluation.metadata["failing_file"].value == str(bad) and str(good) not in evaluation.description
    assert "rule bad_id" in evaluation.description and "values 3.5, 0.25" in evaluation.description
    assert evaluation.metadata["findings"].value[0]["error"].startswith(str(bad))
    assert evaluation_of(result, NO_UNREADABLE_FILES).passed


def test_epoch_milliseconds_declared_as_seconds_fail_the_event_time_check(tmp_path: Path) -> None:
    def milliseconds(table: pa.Table) -> pa.Table:
        return with_column(table, "event_time", pc.divide(table.column("event_time").cast(pa.int64()), 1000))

    directory = tmp_path / "pq" / "dt=2026-11-01" / "hour=00"
    directory.mkdir(parents=True)
    path = directory / "part-0.parquet"
    pq.write_table(milliseconds(hour_table()), path)
    (directory / "_SUCCESS").touch()
    result = materialize_hour(tmp_path, job_for(columns_extra="ts_unit: s,"))  # read as years beyond 9999
    assert step_failure_class(result) == "DagsterAssetCheckFailedError"  # a check result, not an OverflowError
    evaluation = evaluation_of(result, EVENT_TIMES_IN_PARTITION)
    assert not evaluation.passed and evaluation.metadata["failing_file"].value == str(path)
    assert evaluation.metadata["bad_rows"].value == ROWS


def test_a_footer_that_cannot_be_read_fails_the_readability_check(tmp_path: Path) -> None:
    _, bad = write_hour(tmp_path)
    bad.write_bytes(b"not parquet" * 100)
    job = job_for(source_extra="split_row_groups: true\n          target_task_bytes: 64")  # split reads footers
    result = materialize_hour(tmp_path, job)
    assert step_failure_class(result) == "DagsterAssetCheckFailedError"
    assert not outcomes(result)[NO_UNREADABLE_FILES]
    evaluation = evaluation_of(result, NO_UNREADABLE_FILES)
    assert evaluation.metadata["failing_file"].value == str(bad)
    assert "cannot read Parquet footer" in evaluation.description

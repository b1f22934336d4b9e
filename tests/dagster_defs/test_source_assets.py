"""Source assets in-process: partitions, metadata, and each fault as a failed blocking check.

A partition that is not ready fails the step; a readable partition with problems (a file with the
wrong schema, an unreadable file, no rows, event times outside the hour) is materialised, fails the
blocking check of that concern, and the assets downstream of it in the same run -- a plain asset
and the training asset -- do not run.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import (
    AssetKey,
    DailyPartitionsDefinition,
    Definitions,
    HourlyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
    instance_for_test,
    materialize,
)

from primus_dagster.dagster_defs import (
    EVENT_TIMES_IN_PARTITION,
    NO_UNREADABLE_FILES,
    NOT_EMPTY,
    SCHEMA_MATCHES_SPEC,
    SOURCE_CHECK_DESCRIPTIONS,
    ExecutorPoolResource,
    MlflowResource,
    PrimusStorageResource,
    build_definitions,
    build_source_assets,
    build_training_asset,
)
from primus_dagster.dagster_defs.source_checks import FRESHNESS, LABEL_RATE_IN_RANGE, NOT_CONFIGURED
from primus_dagster.data import SourceContext, make_adapter, scan_partition, scan_problems
from primus_dagster.spec import JobSpec, parse_job_spec

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
HOUR_0 = "2026-11-01-00:00"
CLICKS = AssetKey("clicks")


def job_yaml(granularity: str = "hour", allow_empty: bool = False, checks: str = "{}") -> str:
    return f"""
name: t
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: {"1d" if granularity == "day" else "2h"}
      sources:
        - name: clicks
          type: parquet
          granularity: {granularity}
          allow_empty: {str(allow_empty).lower()}
          checks: {checks}
          path: pq
          columns: {{ts: event_time, label: click, id: sample_id, dense: [d0], sparse: [user_id]}}
training:
  partition: hour
"""


def job_for(granularity: str = "hour", allow_empty: bool = False, checks: str = "{}") -> JobSpec:
    return parse_job_spec(job_yaml(granularity, allow_empty, checks))


def write_partition(
    root: Path,
    start: datetime,
    n: int,
    rel: str | None = None,
    offset_s: int = 0,
    drop_columns: tuple[str, ...] = (),
    d0_type: pa.DataType | None = None,
) -> Path:
    rel = rel or f"dt={start:%Y-%m-%d}/hour={start:%H}"
    directory = root / "pq" / rel
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(n)
    columns = {
        "sample_id": pa.array(np.arange(n), pa.int64()),
        "event_time": pa.array(
            [start + timedelta(seconds=offset_s + i % 3600) for i in range(n)], pa.timestamp("us", tz="UTC")
        ),
        "click": pa.array(rng.integers(0, 2, n), pa.int32()),
        "user_id": pa.array(rng.integers(0, 9, n), pa.int64()),
        "d0": pa.array(rng.random(n), pa.float32()).cast(d0_type or pa.float32()),
    }
    path = directory / "part-0.parquet"
    pq.write_table(pa.table({name: column for name, column in columns.items() if name not in drop_columns}), path)
    (directory / "_SUCCESS").touch()
    return path


def resources(root: Path) -> dict:
    return {"storage": PrimusStorageResource(data_root=str(root))}


def check_outcomes(result) -> dict[str, bool]:
    return {evaluation.check_name: evaluation.passed for evaluation in result.get_asset_check_evaluations()}


def failed_check(result, check_name: str):
    (evaluation,) = [e for e in result.get_asset_check_evaluations() if e.check_name == check_name]
    assert not evaluation.passed
    return evaluation


def test_partitions_definition_follows_granularity() -> None:
    (hourly,) = build_source_assets(job_for("hour"))
    (daily,) = build_source_assets(job_for("day"))
    assert isinstance(hourly.partitions_def, HourlyPartitionsDefinition)
    assert isinstance(daily.partitions_def, DailyPartitionsDefinition)
    assert hourly.partitions_def.get_first_partition_key() == HOUR_0
    assert hourly.group_names_by_key[hourly.key] == "history"


def test_every_source_asset_declares_the_blocking_checks() -> None:
    (source_asset,) = build_source_assets(job_for())
    specs = {spec.name: spec for spec in source_asset.check_specs}
    assert (
        set(specs)
        == set(SOURCE_CHECK_DESCRIPTIONS)
        == {
            NO_UNREADABLE_FILES,
            SCHEMA_MATCHES_SPEC,
            NOT_EMPTY,
            EVENT_TIMES_IN_PARTITION,
            LABEL_RATE_IN_RANGE,
            FRESHNESS,
        }
    )
    assert all(spec.blocking and spec.asset_key == CLICKS for spec in specs.values())
    assert all(spec.partitions_def == source_asset.partitions_def for spec in specs.values())  # per partition


def test_materialize_records_metadata_and_passes_every_check(tmp_path: Path) -> None:
    write_partition(tmp_path, T0, 500)
    result = materialize(build_source_assets(job_for()), partition_key=HOUR_0, resources=resources(tmp_path))
    assert result.success
    assert {e.partition for e in result.get_asset_check_evaluations()} == {HOUR_0}  # each check, its partition
    (event,) = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    assert metadata["rows"].value == 500
    assert metadata["files"].value == 1 and metadata["tasks"].value == 1 and metadata["failed_tasks"].value == 0
    assert metadata["arrow_bytes"].value > 0 and metadata["storage_bytes"].value > 0
    assert len(metadata["schema_hash"].value) == 16
    assert "sample_id" in metadata["preview"].value
    assert check_outcomes(result) == dict.fromkeys(SOURCE_CHECK_DESCRIPTIONS, True)
    # bounds not configured: the checks pass and say so, with what they measured
    checks = {e.check_name: e.metadata for e in result.get_asset_check_evaluations()}
    assert checks[LABEL_RATE_IN_RANGE]["bound"].value == checks[FRESHNESS]["bound"].value == NOT_CONFIGURED
    assert 0.3 < checks[LABEL_RATE_IN_RANGE]["label_rate"].value < 0.7
    assert checks[FRESHNESS]["staleness_s"].value == 3600 - 499  # newest row at 499 s of the hour


def test_typed_metadata_reads_back_through_the_instance(tmp_path: Path) -> None:
    write_partition(tmp_path, T0, 300)
    with instance_for_test() as instance:
        assert materialize(
            build_source_assets(job_for()), partition_key=HOUR_0, resources=resources(tmp_path), instance=instance
        ).success
        event = instance.get_latest_materialization_event(CLICKS)
    metadata = event.asset_materialization.metadata
    assert metadata["dagster/row_count"] == MetadataValue.int(300)
    schema = metadata["dagster/column_schema"].value
    columns = {column.name: column for column in schema.columns}
    assert list(columns) == ["sample_id", "ts", "label", "dense", "user_id", "source", "kind"]
    assert columns["ts"].type.startswith("timestamp") and columns["ts"].description == "clicks: event_time"
    assert columns["label"].description == "clicks: click" and columns["dense"].description == "clicks: d0"
    assert metadata["location"] == MetadataValue.path(str(tmp_path / "pq" / "dt=2026-11-01" / "hour=00"))


@pytest.mark.parametrize(
    ("checks", "rows", "failing", "named"),
    [
        ("{label_rate: [0.9, 1.0]}", 400, LABEL_RATE_IN_RANGE, "outside checks.label_rate [0.9, 1.0]"),
        ("{label_rate: [0.2, 0.8], max_staleness: 30m}", 400, FRESHNESS, "more than checks.max_staleness 30m"),
        ("{label_rate: [0.2, 0.8], max_staleness: 30m}", 3600, None, ""),
    ],
)
def test_label_rate_and_freshness_checks_use_the_spec_bounds(
    tmp_path: Path, checks: str, rows: int, failing: str | None, named: str
) -> None:
    write_partition(tmp_path, T0, rows)  # rows one second apart from the hour's start; labels ~50 % positive
    result = materialize(
        build_source_assets(job_for(checks=checks)),
        partition_key=HOUR_0,
        resources=resources(tmp_path),
        raise_on_error=False,
    )
    assert result.success == (failing is None)  # blocking: a failed bound fails the step
    assert {name for name, passed in check_outcomes(result).items() if not passed} == ({failing} if failing else set())
    if failing:
        evaluation = failed_check(result, failing)
        assert named in evaluation.description and evaluation.metadata["partition"].value == HOUR_0


def test_daily_partition(tmp_path: Path) -> None:
    write_partition(tmp_path, T0, 50, rel="dt=2026-11-01")
    result = materialize(build_source_assets(job_for("day")), partition_key="2026-11-01", resources=resources(tmp_path))
    assert result.get_asset_materialization_events()[0].materialization.metadata["rows"].value == 50


def test_not_ready_partition_fails_the_step_with_its_reason(tmp_path: Path) -> None:
    path = write_partition(tmp_path, T0, 10)
    (path.parent / "_SUCCESS").unlink()
    result = materialize(
        build_source_assets(job_for()), partition_key=HOUR_0, resources=resources(tmp_path), raise_on_error=False
    )
    assert not result.success
    assert result.get_asset_materialization_events() == []
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    message = str(failure.event_specific_data.error.message) + str(failure.event_specific_data.error.cause)
    assert "not ready" in message and "_SUCCESS" in message


def _missing_label_column(root: Path) -> None:
    write_partition(root, T0, 10, drop_columns=("click",))


def _dense_column_of_strings(root: Path) -> None:
    write_partition(root, T0, 10, d0_type=pa.string())


def _corrupt_file(root: Path) -> None:
    write_partition(root, T0, 10).write_bytes(b"not parquet at all")


def _no_rows(root: Path) -> None:
    directory = root / "pq" / "dt=2026-11-01" / "hour=00"
    directory.mkdir(parents=True)
    (directory / "_SUCCESS").touch()


def _rows_in_the_next_hour(root: Path) -> None:
    write_partition(root, T0, 10, offset_s=3595)


# fault -> (how to inject it, the checks that fail, the check whose description names it, what it names)
FAULTS: dict[str, tuple[Callable[[Path], None], set[str], str, str]] = {
    "missing column": (_missing_label_column, {SCHEMA_MATCHES_SPEC, NOT_EMPTY}, SCHEMA_MATCHES_SPEC, "'click'"),
    "wrong column type": (
        _dense_column_of_strings,
        {SCHEMA_MATCHES_SPEC, NOT_EMPTY},
        SCHEMA_MATCHES_SPEC,
        "expected a number",
    ),
    "corrupt file": (_corrupt_file, {NO_UNREADABLE_FILES, NOT_EMPTY}, NO_UNREADABLE_FILES, "part-0.parquet"),
    "empty partition": (_no_rows, {NOT_EMPTY}, NOT_EMPTY, "allow_empty"),
    "event time outside the hour": (
        _rows_in_the_next_hour,
        {EVENT_TIMES_IN_PARTITION},
        EVENT_TIMES_IN_PARTITION,
        "outside the partition",
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_faulty_partition_materialises_and_fails_the_check_of_its_concern(tmp_path: Path, fault: str) -> None:
    inject, expected_failures, naming_check, named_in_description = FAULTS[fault]
    inject(tmp_path)
    result = materialize(
        build_source_assets(job_for()), partition_key=HOUR_0, resources=resources(tmp_path), raise_on_error=False
    )
    assert not result.success  # a failed blocking check fails the step after the materialisation
    (event,) = result.get_asset_materialization_events()
    assert event.asset_key == CLICKS and "rows" in event.materialization.metadata
    outcomes = check_outcomes(result)
    assert {name for name, passed in outcomes.items() if not passed} == expected_failures
    evaluation = failed_check(result, naming_check)
    assert named_in_description in evaluation.description
    assert evaluation.metadata["partition"].value == HOUR_0
    assert evaluation.metadata["problem_count"].value >= 1

    job = job_for()
    with make_adapter(job.dataset.source("clicks"), SourceContext(str(tmp_path))) as adapter:
        scan = scan_partition(adapter, adapter.partition(T0))
    assert scan_problems(scan, allow_empty=False), "the checks fail exactly where scan_problems finds a problem"


def test_allow_empty_passes_the_not_empty_check(tmp_path: Path) -> None:
    _no_rows(tmp_path)
    result = materialize(
        build_source_assets(job_for(allow_empty=True)), partition_key=HOUR_0, resources=resources(tmp_path)
    )
    assert result.success and all(check_outcomes(result).values())


@asset(partitions_def=HourlyPartitionsDefinition(start_date=HOUR_0, timezone="UTC"), deps=[CLICKS])
def clicks_report() -> MaterializeResult:
    return MaterializeResult(metadata={"ran": True})


def test_a_failed_blocking_check_skips_the_downstream_asset_in_the_same_run(tmp_path: Path) -> None:
    with instance_for_test() as instance:
        _rows_in_the_next_hour(tmp_path)
        blocked = materialize(
            [*build_source_assets(job_for()), clicks_report],
            partition_key=HOUR_0,
            resources=resources(tmp_path),
            instance=instance,
            raise_on_error=False,
        )
        assert [e.asset_key for e in blocked.get_asset_materialization_events()] == [CLICKS]
        assert "clicks_report" not in {e.step_key for e in blocked.all_events if e.event_type_value == "STEP_START"}
        assert instance.get_latest_materialization_event(AssetKey("clicks_report")) is None

        write_partition(tmp_path, T0, 10)
        healthy = materialize(
            [*build_source_assets(job_for()), clicks_report],
            partition_key=HOUR_0,
            resources=resources(tmp_path),
            instance=instance,
        )
        assert {e.asset_key for e in healthy.get_asset_materialization_events()} == {CLICKS, AssetKey("clicks_report")}


def test_a_failed_blocking_check_keeps_the_training_asset_from_running(tmp_path: Path) -> None:
    job_path = tmp_path / "job.yaml"
    job_path.write_text(job_yaml())
    job = job_for()
    training_asset = build_training_asset(job, job_path)
    _dense_column_of_strings(tmp_path)
    with instance_for_test() as instance:
        result = materialize(
            [*build_source_assets(job), training_asset],
            partition_key=HOUR_0,
            resources={
                **resources(tmp_path),
                "mlflow": MlflowResource(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"),
                "executor_pool": ExecutorPoolResource(data_executors=1),
            },
            instance=instance,
            raise_on_error=False,
        )
        assert not check_outcomes(result)[SCHEMA_MATCHES_SPEC]
        started = {e.step_key for e in result.all_events if e.event_type_value == "STEP_START"}
        assert started == {"clicks"}
        assert instance.get_latest_materialization_event(training_asset.key) is None


def test_reference_code_location_loads_with_the_checks() -> None:
    import definitions

    Definitions.validate_loadable(definitions.defs)
    asset_graph = definitions.defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in asset_graph.get_all_asset_keys()}
    sources = {"impressions_parquet", "impressions_delta", "impressions_iceberg", "events_kafka"}
    assert keys == {*sources, "ctr_demo_model", "ctr_demo_live_model"}
    check_keys = {(k.asset_key.to_user_string(), k.name) for k in asset_graph.asset_check_keys}
    assert ("events_kafka", SCHEMA_MATCHES_SPEC) in check_keys and ("ctr_demo_model", "auc_not_regressed") in check_keys
    assert ("ctr_demo_model", "auc_final") in check_keys
    assert len(check_keys) == 4 * len(SOURCE_CHECK_DESCRIPTIONS) + 2


def test_build_definitions_from_a_path_with_extra_assets() -> None:
    defs = build_definitions(
        Path(__file__).resolve().parents[2] / "examples" / "job.yaml", extra_assets=[clicks_report]
    )
    Definitions.validate_loadable(defs)
    assert AssetKey("clicks_report") in defs.resolve_asset_graph().get_all_asset_keys()

"""Source assets in-process: partitions definitions, validation, metadata, failures."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import DailyPartitionsDefinition, Definitions, HourlyPartitionsDefinition, materialize

from primus_dagster.dagster_defs import (
    KafkaResource,
    PrimusStorageResource,
    build_definitions,
    build_source_assets,
)
from primus_dagster.spec import parse_job_spec

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def job_for(granularity: str = "hour", allow_empty: bool = False):
    return parse_job_spec(f"""
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
          path: pq
          columns: {{ts: event_time, label: click, id: sample_id, dense: [d0], sparse: [user_id]}}
""")


def write_partition(root: Path, start: datetime, n: int, rel: str | None = None, offset_s: int = 0) -> Path:
    rel = rel or f"dt={start:%Y-%m-%d}/hour={start:%H}"
    directory = root / "pq" / rel
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(n)
    table = pa.table(
        {
            "sample_id": pa.array(np.arange(n), pa.int64()),
            "event_time": pa.array(
                [start + timedelta(seconds=offset_s + i % 3600) for i in range(n)], pa.timestamp("us", tz="UTC")
            ),
            "click": pa.array(rng.integers(0, 2, n), pa.int32()),
            "user_id": pa.array(rng.integers(0, 9, n), pa.int64()),
            "d0": pa.array(rng.random(n), pa.float32()),
        }
    )
    path = directory / "part-0.parquet"
    pq.write_table(table, path)
    (directory / "_SUCCESS").touch()
    return path


def resources(root: Path) -> dict:
    return {"storage": PrimusStorageResource(data_root=str(root)), "kafka": KafkaResource()}


def test_partitions_definition_follows_granularity() -> None:
    (hourly,) = build_source_assets(job_for("hour"))
    (daily,) = build_source_assets(job_for("day"))
    assert isinstance(hourly.partitions_def, HourlyPartitionsDefinition)
    assert isinstance(daily.partitions_def, DailyPartitionsDefinition)
    assert hourly.partitions_def.get_first_partition_key() == "2026-11-01-00:00"
    assert hourly.group_names_by_key[hourly.key] == "history"


def test_materialize_records_metadata(tmp_path: Path) -> None:
    write_partition(tmp_path, T0, 500)
    result = materialize(
        build_source_assets(job_for()), partition_key="2026-11-01-00:00", resources=resources(tmp_path)
    )
    assert result.success
    (event,) = result.get_asset_materialization_events()
    meta = event.materialization.metadata
    assert meta["rows"].value == 500
    assert meta["files"].value == 1 and meta["tasks"].value == 1
    assert meta["arrow_bytes"].value > 0 and meta["storage_bytes"].value > 0
    assert len(meta["schema_hash"].value) == 16
    assert "sample_id" in meta["preview"].value


def test_daily_partition(tmp_path: Path) -> None:
    write_partition(tmp_path, T0, 50, rel="dt=2026-11-01")
    result = materialize(build_source_assets(job_for("day")), partition_key="2026-11-01", resources=resources(tmp_path))
    assert result.get_asset_materialization_events()[0].materialization.metadata["rows"].value == 50


def _failure_message(result) -> str:
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    return str(failure.event_specific_data.error.message) + str(failure.event_specific_data.error.cause)


def test_not_ready_partition_fails_with_reason(tmp_path: Path) -> None:
    path = write_partition(tmp_path, T0, 10)
    (path.parent / "_SUCCESS").unlink()
    result = materialize(
        build_source_assets(job_for()),
        partition_key="2026-11-01-00:00",
        resources=resources(tmp_path),
        raise_on_error=False,
    )
    assert not result.success
    message = _failure_message(result)
    assert "not ready" in message and "_SUCCESS" in message


def test_corrupt_file_fails_naming_it(tmp_path: Path) -> None:
    path = write_partition(tmp_path, T0, 10)
    path.write_bytes(b"not parquet at all")
    result = materialize(
        build_source_assets(job_for()),
        partition_key="2026-11-01-00:00",
        resources=resources(tmp_path),
        raise_on_error=False,
    )
    assert str(path) in _failure_message(result)


def test_empty_partition_needs_allow_empty(tmp_path: Path) -> None:
    directory = tmp_path / "pq" / "dt=2026-11-01" / "hour=00"
    directory.mkdir(parents=True)
    (directory / "_SUCCESS").touch()
    failed = materialize(
        build_source_assets(job_for()),
        partition_key="2026-11-01-00:00",
        resources=resources(tmp_path),
        raise_on_error=False,
    )
    assert "empty" in _failure_message(failed)
    ok = materialize(
        build_source_assets(job_for(allow_empty=True)), partition_key="2026-11-01-00:00", resources=resources(tmp_path)
    )
    assert ok.success


def test_rows_outside_the_partition_are_rejected(tmp_path: Path) -> None:
    write_partition(tmp_path, T0, 10, offset_s=3595)  # some rows fall into the next hour
    result = materialize(
        build_source_assets(job_for()),
        partition_key="2026-11-01-00:00",
        resources=resources(tmp_path),
        raise_on_error=False,
    )
    assert "outside the partition" in _failure_message(result)


def test_kafka_resource_without_any_broker_names_the_options(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("PRIMUS_KAFKA_BOOTSTRAP_SERVERS", raising=False)
    kafka = KafkaResource(broker_state_file=str(tmp_path / "none.json"))
    with pytest.raises(RuntimeError, match="PRIMUS_KAFKA_BOOTSTRAP_SERVERS"):
        kafka.resolve_bootstrap_servers()


def test_reference_code_location_loads() -> None:
    import definitions

    Definitions.validate_loadable(definitions.defs)
    keys = {k.to_user_string() for k in definitions.defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {"impressions_parquet", "impressions_delta", "impressions_iceberg", "events_kafka", "ctr_demo_model"}


def test_build_definitions_from_a_path() -> None:
    defs = build_definitions(Path(__file__).resolve().parents[2] / "examples" / "job.yaml")
    Definitions.validate_loadable(defs)

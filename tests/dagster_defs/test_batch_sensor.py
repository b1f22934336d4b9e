"""The batch sensor against real Parquet / Delta / Iceberg sources and a real Dagster instance: a new
partition is asked for once, a late one too, a changed partition that was trained on is reported once and
re-run only under ``rerun: retrain``, ``label_delay`` and ``streams[].window`` decide what it looks at, the
training partition follows once its inputs are materialised with their blocking checks passed, and faults
(a bad cursor, a source that cannot be listed) are named."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, MaterializeResult, asset, instance_for_test, materialize
from sensorkit import BATCH, T0, SensorEnv, hour_key, make_env

from primus_dagster.dagster_defs import build_batch_sensor
from primus_dagster.dagster_defs import sensors as sensors_module
from primus_dagster.dagster_defs.sensors import TRAINING_INPUTS_TAG, TRIGGER_TAG
from primus_dagster.dagster_defs.training_asset import training_partitions_def

pytestmark = pytest.mark.integration


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


def skipped(result) -> str:
    return result.skip_reason.skip_message if result.skip_reason else ""


def requested(result) -> list[tuple[str, list[str]]]:
    return [(r.partition_key, sorted(k.path[-1] for k in r.asset_selection)) for r in result.run_requests or []]


def test_a_new_partition_is_asked_for_once(tmp_path: Path, instance: DagsterInstance) -> None:
    env = make_env(tmp_path, instance)
    sensor = build_batch_sensor(env.job, clock=env.clock)
    env.write(range(0, 1))
    env.now = T0 + timedelta(hours=1, minutes=30)
    first = env.tick(sensor)
    assert requested(first) == [(hour_key(0), sorted([*BATCH, "events"]))]  # one run for the hour's sources
    assert first.run_requests[0].job_name == "sense_files_hour_job"
    assert first.run_requests[0].tags[TRIGGER_TAG].startswith("batch sensor")
    again = env.tick(sensor)
    assert not again.run_requests and skipped(again)


def test_a_late_partition_is_still_picked_up(tmp_path: Path, instance: DagsterInstance) -> None:
    env = make_env(tmp_path, instance)
    sensor = build_batch_sensor(env.job, clock=env.clock)
    env.write(range(0, 1))
    env.write(range(2, 3))
    env.now = T0 + timedelta(hours=3, minutes=5)
    assert [key for key, _ in requested(env.tick(sensor))] == [hour_key(0), hour_key(2)]
    env.write(range(1, 2))  # hour 1 lands after hour 2
    assert requested(env.tick(sensor)) == [(hour_key(1), sorted([*BATCH, "events"]))]


def test_a_partition_already_materialised_is_only_recorded(tmp_path: Path, instance: DagsterInstance) -> None:
    env = make_env(tmp_path, instance)
    env.write(range(0, 1), sources=["imp_parquet"])
    assert env.scan(0, ["imp_parquet"])  # materialised before the sensor was turned on
    env.now = T0 + timedelta(hours=1, minutes=5)
    result = env.tick(build_batch_sensor(env.job, clock=env.clock))
    assert not result.run_requests


@pytest.mark.parametrize("changed", ["imp_delta", "imp_iceberg"])
def test_a_new_version_of_a_trained_partition_is_surfaced_once(
    tmp_path: Path, instance: DagsterInstance, changed: str
) -> None:
    env = make_env(tmp_path, instance)  # rerun: never
    sensor = build_batch_sensor(env.job, clock=env.clock)
    env.write(range(0, 3))
    env.now = T0 + timedelta(hours=3, minutes=5)
    env.tick(sensor)
    env.mark_trained(hour_key(1))  # training 01:00 learnt from the batch hour 00:00 (batch_lag 1h)
    env.write(range(0, 1), sources=[changed])  # a new Delta commit / Iceberg snapshot rewriting hour 0
    result = env.tick(sensor)
    (observation,) = result.asset_events
    assert observation.asset_key == AssetKey(changed) and observation.partition == hour_key(0)
    meta = {k: v.value for k, v in observation.metadata.items()}
    assert meta["version"] != meta["previous_version"]
    assert meta["trained_partitions"] == [hour_key(1)] and meta["rerun"] == "never"
    assert not [r for r in result.run_requests or [] if TRAINING_INPUTS_TAG not in r.tags]  # never: no re-scan
    assert not env.tick(sensor).asset_events  # surfaced once


def test_a_changed_partition_nothing_trained_on_is_scanned_again(tmp_path: Path, instance: DagsterInstance) -> None:
    env = make_env(tmp_path, instance)
    sensor = build_batch_sensor(env.job, clock=env.clock)
    env.write(range(0, 2))
    env.now = T0 + timedelta(hours=2, minutes=5)
    env.tick(sensor)
    env.write(range(1, 2), sources=["imp_delta"])
    result = env.tick(sensor)
    assert not result.asset_events
    assert requested(result) == [(hour_key(1), ["imp_delta"])]


def test_rerun_retrain_scans_the_partition_and_retrains_what_it_fed(tmp_path: Path, instance: DagsterInstance) -> None:
    env = make_env(tmp_path, instance, rerun="retrain")
    sensor = build_batch_sensor(env.job, clock=env.clock)
    env.write(range(0, 2))
    env.now = T0 + timedelta(hours=2, minutes=5)
    env.tick(sensor)
    assert env.scan(0, BATCH) and env.scan(1, ["events"])  # the inputs of training 01:00
    env.mark_trained(hour_key(1))
    env.write(range(0, 1), sources=["imp_delta"])
    result = env.tick(sensor)
    assert len(result.asset_events) == 1 and result.asset_events[0].metadata["rerun"].value == "retrain"
    assert requested(result) == [(hour_key(0), ["imp_delta"])]
    assert not env.tick(sensor).run_requests  # the re-scan has not happened yet: training waits
    assert env.scan(0, ["imp_delta"])
    (retrain,) = env.tick(sensor).run_requests
    assert retrain.partition_key == hour_key(1) and retrain.asset_selection == [AssetKey("sense_model")]
    assert retrain.tags[TRIGGER_TAG] == "batch sensor: retrain"


def test_label_delay_holds_a_partition_back_until_its_labels_are_complete(
    tmp_path: Path, instance: DagsterInstance
) -> None:
    env = make_env(tmp_path, instance, label_delay="2h")
    sensor = build_batch_sensor(env.job, clock=env.clock)
    env.write(range(0, 1))
    env.now = T0 + timedelta(hours=1, minutes=30)
    held = requested(env.tick(sensor))
    assert held == [(hour_key(0), ["events", "imp_delta", "imp_iceberg"])]  # imp_parquet: labels not complete
    env.now = T0 + timedelta(hours=3)
    assert requested(env.tick(sensor)) == [(hour_key(0), ["imp_parquet"])]


def test_the_streams_window_bounds_what_the_sensor_looks_at(tmp_path: Path, instance: DagsterInstance) -> None:
    env = make_env(tmp_path, instance, history_window="2h")
    env.write(range(0, 10))
    env.now = T0 + timedelta(hours=10, minutes=5)
    keys = {key: sources for key, sources in requested(env.tick(build_batch_sensor(env.job, clock=env.clock)))}
    # history (2h): hours 8, 9, and hour 0 that the next training partition (01:00) reads; live (1h): 9 and 1.
    assert sorted(keys) == [hour_key(h) for h in (0, 1, 8, 9)]
    assert keys[hour_key(0)] == sorted(BATCH) and keys[hour_key(1)] == ["events"]
    wider = make_env(tmp_path, instance, history_window="6h")  # its own cursor
    wider.now = env.now
    wider_keys = [key for key, _ in requested(wider.tick(build_batch_sensor(wider.job, clock=wider.clock)))]
    assert wider_keys == [hour_key(h) for h in (0, 1, 4, 5, 6, 7, 8, 9)]


def test_the_training_partition_follows_once_its_inputs_are_materialised(
    tmp_path: Path, instance: DagsterInstance
) -> None:
    env = make_env(tmp_path, instance)
    sensor = build_batch_sensor(env.job, clock=env.clock)
    env.write(range(0, 2))
    env.now = T0 + timedelta(hours=2, minutes=5)
    first = env.tick(sensor)
    assert all(
        r.partition_key != hour_key(1) or "sense_model" not in str(r.asset_selection) for r in first.run_requests
    )
    assert "training 2026-11-01-01:00 waits for" in skipped(env.tick(sensor))
    assert env.scan(0, BATCH) and env.scan(1, ["events"])
    (train,) = env.tick(sensor).run_requests
    assert train.partition_key == hour_key(1) and train.job_name == "sense_training_job"
    assert train.tags[TRAINING_INPUTS_TAG].startswith(hour_key(1) + "@")

    # A run on these inputs that failed is not asked for again (re-execute it, or fix an input).
    @asset(key="sense_model", partitions_def=training_partitions_def(env.job))
    def failing_stand_in() -> MaterializeResult:
        raise RuntimeError("training failed")

    materialize(
        [failing_stand_in], partition_key=train.partition_key, instance=instance, tags=train.tags, raise_on_error=False
    )
    assert "already ran on these inputs" in skipped(env.tick(sensor))


def test_a_failed_blocking_check_keeps_training_waiting(tmp_path: Path, instance: DagsterInstance) -> None:
    env = make_env(tmp_path, instance)
    sensor = build_batch_sensor(env.job, clock=env.clock)
    env.write(range(0, 2), sources=["imp_delta", "imp_iceberg", "events"])
    (tmp_path / "parquet/imp/dt=2026-11-01/hour=00").mkdir(parents=True)
    (tmp_path / "parquet/imp/dt=2026-11-01/hour=00/_SUCCESS").touch()  # ready, but empty: not_empty fails
    env.now = T0 + timedelta(hours=2, minutes=5)
    env.tick(sensor)
    assert not env.scan(0, BATCH)  # the run fails on the blocking check; the materialisation is recorded
    assert env.scan(1, ["events"])
    assert "blocking check(s) ['not_empty'] failed" in skipped(env.tick(sensor))


def test_a_source_that_cannot_be_listed_does_not_stop_the_others(
    tmp_path: Path, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(tmp_path, instance)
    env.write(range(0, 1))
    real = sensors_module.make_adapter

    def flaky(spec, context):
        if spec.name == "imp_iceberg":
            raise ConnectionError("catalog unreachable")
        return real(spec, context)

    monkeypatch.setattr(sensors_module, "make_adapter", flaky)
    env.now = T0 + timedelta(hours=1, minutes=5)
    result = env.tick(build_batch_sensor(env.job, clock=env.clock))
    assert requested(result) == [(hour_key(0), ["events", "imp_delta", "imp_parquet"])]
    monkeypatch.setattr(sensors_module, "make_adapter", real)
    assert requested(env.tick(build_batch_sensor(env.job, clock=env.clock))) == [(hour_key(0), ["imp_iceberg"])]


def test_a_bad_cursor_is_an_error_naming_the_sensor(tmp_path: Path, instance: DagsterInstance) -> None:
    env = make_env(tmp_path, instance)
    sensor = build_batch_sensor(env.job, clock=env.clock)
    env.cursors[sensor.name] = "{not json"
    with pytest.raises(ValueError, match="sensor sense_batch_sensor: its cursor is not JSON"):
        env.tick(sensor)
    env.cursors[sensor.name] = '{"offsets": {}}'
    with pytest.raises(ValueError, match=r"expected an object with \('seen', 'retrain'\)"):
        env.tick(sensor)


def test_sensor_env_ticks_use_the_resources(tmp_path: Path, instance: DagsterInstance) -> None:
    env: SensorEnv = make_env(tmp_path, instance)
    assert env.resources["storage"].data_root == str(tmp_path)

"""The training schedule (cron from the partition and the stream's label delay, the partition that just
closed) and the reference deployment's automation: sensors on, the schedule offered but stopped."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Definitions,
    build_schedule_context,
    instance_for_test,
)

from primus_dagster.dagster_defs import (
    MlflowResource,
    PrimusStorageResource,
    build_definitions,
    build_schedules,
    build_sensors,
    default_resources,
)
from primus_dagster.dagster_defs.schedules import schedule_offset
from primus_dagster.run_queue import RUN_KIND_TAG
from primus_dagster.spec import JobSpec, parse_job_spec


def job_for(partition: str, stream_label_delay: str) -> JobSpec:
    return parse_job_spec(f"""
name: sched
dataset:
  start: 2026-11-01
  streams:
    - name: history
      sources: [{{name: imp, type: parquet, kind: batch, label_delay: 24h, path: imp, columns: {{ts: t, dense: [d]}}}}]
    - name: live
      window: 1h
      sources:
        - {{name: ev, type: kafka, kind: stream, topic: ev, label_delay: {stream_label_delay}, columns: {{ts: t, dense: [d]}}}}
training: {{mode: mixed, partition: {partition}, batch_lag: 24h}}
""")


@pytest.mark.parametrize(
    "partition,delay,cron",
    [
        ("day", "15m", "15 0 * * *"),
        ("day", "90m", "30 1 * * *"),
        ("hour", "15m", "15 * * * *"),
        ("hour", "3h", "59 * * * *"),
    ],
)
def test_the_schedule_fires_after_the_stream_label_delay(partition: str, delay: str, cron: str) -> None:
    job = job_for(partition, delay)
    schedule, final = build_schedules(job)
    assert schedule.cron_schedule == cron and schedule.execution_timezone == "UTC"
    assert schedule.default_status == DefaultScheduleStatus.STOPPED and schedule.job_name == "sched_training_job"
    # the final evaluation: hourly, at the minute labels complete (eval_hours 1 + batch label_delay 24h)
    assert (final.cron_schedule, final.job_name, final.default_status) == (
        "0 * * * *",
        "sched_auc_final_job",
        DefaultScheduleStatus.STOPPED,
    )
    assert schedule_offset(job).total_seconds() == int(cron.split()[0]) * 60 + (
        int(cron.split()[1]) * 3600 if partition == "day" else 0
    )


def test_a_tick_asks_for_the_partition_that_just_closed() -> None:
    job = job_for("day", "15m")
    schedule, _ = build_schedules(job)
    with build_schedule_context(scheduled_execution_time=datetime(2026, 11, 5, 0, 15, tzinfo=timezone.utc)) as context:
        request = schedule(context)
    assert request.partition_key == "2026-11-04" and request.tags["primus/trigger"] == "training schedule"
    # The first training partition is 2026-11-02 (24h batch lag): nothing closed before it.
    with build_schedule_context(scheduled_execution_time=datetime(2026, 11, 2, 0, 15, tzinfo=timezone.utc)) as context:
        assert "no training partition has closed yet" in schedule(context).skip_message


def at(day: int, hour: int) -> datetime:
    return datetime(2026, 11, day, hour, tzinfo=timezone.utc)


def test_the_final_auc_tick_asks_for_the_newest_partition_with_complete_labels() -> None:
    job = job_for("day", "15m")
    _, final = build_schedules(job)
    # 2026-11-04 ends 11-05 00:00; its held-out hour 00:00-01:00 has complete batch labels 24h later
    for now, partition in [(at(6, 1), "2026-11-04"), (at(6, 0), "2026-11-03"), (at(4, 1), "2026-11-02")]:
        with build_schedule_context(scheduled_execution_time=now) as context:
            request = final(context)
        assert request.run_key == f"auc_final/{partition}" and request.tags["dagster/partition"] == partition
    with build_schedule_context(scheduled_execution_time=at(4, 0)) as context:
        assert "no training partition has complete labels yet" in final(context).skip_message


def test_the_final_auc_check_does_not_evaluate_before_the_labels_are_complete(tmp_path) -> None:
    job = job_for("hour", "15m")
    spec = tmp_path / "job.yaml"
    spec.write_text(job.model_dump_json())
    defs = build_definitions(
        spec,
        resources=default_resources()
        | {"storage": PrimusStorageResource(data_root=str(tmp_path))}
        | {"mlflow": MlflowResource(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")},
    )
    now = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    recent = (now - timedelta(hours=2)).strftime("%Y-%m-%d-%H:00")  # its labels: complete in ~23 h
    with instance_for_test() as instance:
        # a run as the schedule launches it: the partition as its run tag
        final = defs.resolve_job_def("sched_auc_final_job")
        result = final.execute_in_process(tags={"dagster/partition": recent}, instance=instance)
        # recorded against its partition in the check's history (the UI's "Partition" column)
        key = AssetCheckKey(AssetKey("sched_model"), "auc_final")
        (row,) = instance.event_log_storage.get_asset_check_execution_history(key, limit=10)
    assert row.partition == recent and row.status.value == "FAILED"
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == "auc_final" and not evaluation.passed
    assert evaluation.severity == AssetCheckSeverity.WARN  # not blocking, not an error: not evaluated yet
    complete = now - timedelta(hours=2) + timedelta(hours=1 + 1 + 24)
    assert evaluation.description == f"labels not complete until {complete.isoformat()}"
    assert evaluation.metadata["partition"].value == recent
    with instance_for_test() as instance:
        result = final.execute_in_process(tags={"dagster/partition": "2020-01-01-00:00"}, instance=instance)
    (evaluation,) = result.get_asset_check_evaluations()
    assert "'2020-01-01-00:00' is not a training partition of job sched" in evaluation.description


def test_schedules_and_sensors_load_with_the_job(tmp_path) -> None:
    job = job_for("hour", "15m")
    spec = tmp_path / "job.yaml"
    spec.write_text(job.model_dump_json())
    defs = build_definitions(spec, sensors=build_sensors(job), schedules=build_schedules(job))
    Definitions.validate_loadable(defs)
    repo = defs.get_repository_def()
    assert {j.name for j in repo.get_all_jobs()} >= {
        "sched_training_job",
        "sched_auc_final_job",
        "sched_files_hour_job",
        "sched_ev_hour_job",
    }


def test_every_job_tags_its_runs_with_their_kind_for_the_run_queue(tmp_path) -> None:
    job = job_for("hour", "15m")
    spec = tmp_path / "job.yaml"
    spec.write_text(job.model_dump_json())
    repo = build_definitions(spec, sensors=build_sensors(job), schedules=build_schedules(job)).get_repository_def()
    kinds = {j.name: j.run_tags.get(RUN_KIND_TAG) for j in repo.get_all_jobs() if not j.name.startswith("__")}
    assert kinds == {
        "sched_training_job": "training",  # one at a time (run_queue.py's tag limits)
        "sched_auc_final_job": "check",
        "sched_files_hour_job": "source",
        "sched_ev_hour_job": "source",
        "sched_live_job": "live",
    }


def test_the_reference_deployment_runs_its_sensors_and_offers_the_schedule() -> None:
    import definitions

    from sensors import SCHEDULES, SENSORS

    Definitions.validate_loadable(definitions.defs)
    assert {s.name: s.default_status for s in SENSORS} == {
        "ctr_demo_batch_sensor": DefaultSensorStatus.RUNNING,
        "ctr_demo_events_kafka_stream_sensor": DefaultSensorStatus.RUNNING,
    }
    assert [(s.name, s.default_status) for s in SCHEDULES] == [
        ("ctr_demo_training_schedule", DefaultScheduleStatus.STOPPED),
        ("ctr_demo_auc_final_schedule", DefaultScheduleStatus.STOPPED),
    ]
    assert all(s.minimum_interval_seconds == 30 for s in SENSORS)  # automation.sensor_interval

"""A small job for the sensor tests: Parquet, Delta and Iceberg batch sources and a Parquet stream source,
hourly training with a one-hour batch lag, written hour by hour from the synthetic world, and a clock
the test moves."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from dagster import AssetKey, AssetMaterialization, DagsterInstance, SensorDefinition, build_sensor_context, materialize

from primus_dagster.dagster_defs import PrimusStorageResource, build_source_assets
from primus_dagster.data import SourceContext
from primus_dagster.spec import JobSpec, parse_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
BATCH = ["imp_parquet", "imp_delta", "imp_iceberg"]
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}

JOB = """
name: sense
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: {history_window}
      sources:
        - name: imp_parquet
          type: parquet
          kind: batch
          label_delay: {label_delay}
          path: parquet/imp
          columns: &cols {{ts: event_time, label: click, id: sample_id, dense: [d0, d1, d2], sparse: [user_id]}}
        - {{name: imp_delta, type: delta, kind: batch, uri: delta/imp, columns: *cols}}
        - {{name: imp_iceberg, type: iceberg, kind: batch, table: synth.imp, columns: *cols}}
    - name: live
      window: 1h
      sources:
        - {{name: events, type: parquet, kind: stream, path: parquet/events, columns: *cols}}
training:
  mode: mixed
  partition: hour
  batch_lag: 1h
automation: {{rerun: {rerun}}}
"""


def hour_key(h: int) -> str:
    return f"{T0 + timedelta(hours=h):%Y-%m-%d-%H:%M}"


@dataclass
class SensorEnv:
    """The job, its data root, a Dagster instance and the sensors' clock (``now``, moved by the test)."""

    root: Path
    job: JobSpec
    instance: DagsterInstance
    now: datetime = T0
    cursors: dict[str, str | None] = field(default_factory=dict)

    @property
    def resources(self) -> dict[str, Any]:
        return {"storage": PrimusStorageResource(data_root=str(self.root))}

    def clock(self) -> datetime:
        return self.now

    def write(self, hours: range, sources: list[str] | None = None) -> None:
        world = SyntheticWorld(WorldConfig(seed=3, rows_per_hour=40, n_dense=3, users=200, items=50), T0)
        write_world(self.job, SourceContext(str(self.root)), world, hours, sources=sources, progress=False)

    def tick(self, sensor: SensorDefinition) -> Any:
        """One evaluation of ``sensor`` with the cursor it left last time."""
        cursor = self.cursors.get(sensor.name)
        with build_sensor_context(instance=self.instance, cursor=cursor, resources=self.resources) as context:
            result = sensor(context)
        self.cursors[sensor.name] = result.cursor
        return result

    def scan(self, hour: int, sources: list[str]) -> bool:
        """Materialise the source assets ``sources`` at ``hour`` (real scans and checks)."""
        assets = [a for a in build_source_assets(self.job) if a.key.path[-1] in sources]
        result = materialize(
            assets,
            partition_key=hour_key(hour),
            instance=self.instance,
            resources=self.resources,
            run_config=QUIET,
            raise_on_error=False,
        )
        return result.success

    def mark_trained(self, key: str) -> None:
        """Record a materialisation of the training partition ``key`` (as if it had trained)."""
        self.instance.report_runless_asset_event(AssetMaterialization(asset_key=AssetKey("sense_model"), partition=key))


def make_env(
    root: Path, instance: DagsterInstance, history_window: str = "6h", label_delay: str = "0s", rerun: str = "never"
) -> SensorEnv:
    job = parse_job_spec(JOB.format(history_window=history_window, label_delay=label_delay, rerun=rerun))
    return SensorEnv(root, job, instance)

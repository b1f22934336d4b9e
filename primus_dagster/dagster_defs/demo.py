"""``make demo``: the reference job on embedded defaults, end to end, leaving nothing running.

Today: start the embedded Kafka-compatible broker, write the synthetic world for the first
day to every source of the spec, materialise each source asset for every hour of that day
into the project's Dagster instance (visible in ``dagster dev`` afterwards), print a summary
and stop the broker.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

from dagster import DagsterInstance, materialize
from rich.console import Console
from rich.table import Table

from primus_dagster import paths
from primus_dagster.dagster_defs.resources import KAFKA_ENV, KafkaResource, PrimusStorageResource
from primus_dagster.dagster_defs.source_assets import build_source_assets
from primus_dagster.data.sources import SourceContext
from primus_dagster.spec import load_job_spec

# Dagster's console logger prints every step event; the demo prints its own progress instead.
_QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def run_demo(args: argparse.Namespace) -> int:
    from primus_dagster.kafka_broker import EmbeddedBroker
    from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world

    console = Console()
    os.environ["DAGSTER_HOME"] = str(paths.dagster_home())
    job = load_job_spec(args.spec)
    data_root = str(paths.data_root())
    state_file = str(paths.broker_state_file())
    bootstrap = os.environ.get(KAFKA_ENV)
    started_broker = False
    if not bootstrap:
        state = EmbeddedBroker.read_state(state_file) or EmbeddedBroker.start_detached(state_file)
        started_broker = True
        bootstrap = str(state["bootstrap_servers"])
    console.print(f"[bold]primus-dagster demo[/]: job {job.name!r}, data root {data_root}, Kafka {bootstrap}, "
                  f"DAGSTER_HOME {os.environ['DAGSTER_HOME']}")
    try:
        context = SourceContext(data_root, bootstrap)
        world = SyntheticWorld(WorldConfig(rows_per_hour=args.rows_per_hour), job.dataset.start)
        # One hour more than materialised, so the stream has moved past the last hour (ready).
        write_world(job, context, world, range(args.hours + 1))
        summary = _materialize_hours(job, data_root, bootstrap, args.hours, console)
    finally:
        if started_broker:
            EmbeddedBroker.stop_detached(state_file)
    console.print(summary)
    console.print("Browse the runs: [bold]DAGSTER_HOME=.primus/dagster_home .venv/bin/dagster dev[/] "
                  "(workspace.yaml), or materialise one partition: [bold].venv/bin/dagster asset materialize "
                  "-m definitions --select impressions_parquet --partition "
                  f"{job.dataset.start:%Y-%m-%d-%H:%M}[/] (needs the broker for Kafka assets).")
    return 0


def _materialize_hours(job, data_root: str, bootstrap: str, hours: int, console: Console) -> Table:
    assets = build_source_assets(job)
    resources = {"storage": PrimusStorageResource(data_root=data_root),
                 "kafka": KafkaResource(bootstrap_servers=bootstrap)}
    instance = DagsterInstance.get()
    totals: dict[str, dict[str, object]] = {}
    began = time.perf_counter()
    for hour in range(hours):
        key = (job.dataset.start + timedelta(hours=hour)).strftime("%Y-%m-%d-%H:%M")
        result = materialize(assets, partition_key=key, instance=instance, resources=resources,
                             run_config=_QUIET)
        for event in result.get_asset_materialization_events():
            name = event.asset_key.to_user_string()
            meta = event.materialization.metadata
            row = totals.setdefault(name, {"partitions": 0, "rows": 0, "bytes": 0, "version": "-"})
            row["partitions"] = int(row["partitions"]) + 1
            row["rows"] = int(row["rows"]) + meta["rows"].value
            row["bytes"] = int(row["bytes"]) + meta["arrow_bytes"].value
            if "version" in meta:
                row["version"] = meta["version"].value
            if "kafka_offsets" in meta:
                row["version"] = f"offsets up to hour {key}"
        console.print(f"materialised partition {key} ({hour + 1}/{hours})")
    table = Table(title=f"source assets materialised in {time.perf_counter() - began:.1f}s")
    for column in ("asset", "partitions", "rows", "arrow MB", "version / offsets"):
        table.add_column(column)
    for name, row in totals.items():
        table.add_row(name, str(row["partitions"]), f"{row['rows']:,}", f"{int(row['bytes']) / 2**20:.1f}",
                      str(row["version"]))
    return table

"""``make demo``: the reference job on embedded defaults, end to end, leaving nothing running.

Start the embedded Kafka-compatible broker; write two days (and two hours) of the synthetic
world to every source of the spec; materialise each source asset for the hours of the first day
into the project's Dagster instance (visible in ``dagster dev`` afterwards); then materialise the
training asset for the second day -- MTRM in ``batch_then_stream`` mode: pre-trained on the first
day's complete batch data (``batch_lag: 24h``), then following the second day's Kafka stream,
checkpointed to MLflow -- and print the AUC table and the MLflow run; stop the broker.
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
from primus_dagster.dagster_defs.resources import (
    KAFKA_ENV,
    ExecutorPoolResource,
    KafkaResource,
    MlflowResource,
    PrimusStorageResource,
)
from primus_dagster.dagster_defs.source_assets import build_source_assets
from primus_dagster.data.sources import SourceContext
from primus_dagster.spec import load_job_spec
from primus_dagster.training.tracking import default_tracking_uri

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
    console.print(
        f"[bold]primus-dagster demo[/]: job {job.name!r}, data root {data_root}, Kafka {bootstrap}, "
        f"DAGSTER_HOME {os.environ['DAGSTER_HOME']}"
    )
    try:
        context = SourceContext(data_root, bootstrap)
        world = SyntheticWorld(WorldConfig(rows_per_hour=args.rows_per_hour), job.dataset.start)
        # Two days, the evaluation hour after them, and one more (so Kafka's last hour is complete).
        write_world(job, context, world, range(max(args.hours, 48) + 2))
        summary = _materialize_hours(job, data_root, bootstrap, args.hours, console)
        console.print(summary)
        if not args.no_train:
            console.print(_train_day(job, args.spec, data_root, bootstrap, console))
    finally:
        if started_broker:
            EmbeddedBroker.stop_detached(state_file)
    console.print(
        "Browse the runs: [bold]DAGSTER_HOME=.primus/dagster_home .venv/bin/dagster dev[/] "
        "(workspace.yaml), or materialise one partition: [bold].venv/bin/dagster asset materialize "
        "-m definitions --select impressions_parquet --partition "
        f"{job.dataset.start:%Y-%m-%d-%H:%M}[/] (needs the broker for Kafka assets)."
    )
    return 0


def _train_day(job, spec_path: str, data_root: str, bootstrap: str, console: Console) -> Table:
    """Materialise the training asset's partition of the second day; the AUC table."""
    from primus_dagster.dagster_defs.training_asset import build_training_asset

    partition = (job.dataset.start + timedelta(days=1)).strftime("%Y-%m-%d")
    console.print(f"training {job.training.model.type} ({job.training.mode}) on partition {partition} ...")
    resources = {
        "storage": PrimusStorageResource(data_root=data_root),
        "kafka": KafkaResource(bootstrap_servers=bootstrap),
        "mlflow": MlflowResource(),
        "executor_pool": ExecutorPoolResource(),
    }
    began = time.perf_counter()
    result = materialize(
        [build_training_asset(job, spec_path)],
        partition_key=partition,
        instance=DagsterInstance.get(),
        resources=resources,
        run_config=_QUIET,
    )
    (event,) = result.get_asset_materialization_events()
    meta = {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
    checks = result.get_asset_check_evaluations()
    table = Table(
        title=f"training asset {event.asset_key.to_user_string()} [{partition}] in {time.perf_counter() - began:.1f}s"
    )
    for column in ("model", "mode", "next-hour AUC", "log loss", "samples", "samples/s", "checkpoints", "AUC check"):
        table.add_column(column)
    table.add_row(
        job.training.model.type,
        job.training.mode,
        f"{meta.get('eval_auc', float('nan')):.4f}",
        f"{meta.get('eval_log_loss', float('nan')):.4f}",
        f"{meta['samples']:,}",
        f"{meta['samples_per_s']:,.0f}",
        str(meta["checkpoints"]),
        "passed" if checks and checks[0].passed else "failed",
    )
    table.caption = (
        f"MLflow run {meta['mlflow_run_id']} ({meta['mlflow_run_url']}); model {meta['model_uri']}; "
        f"browse: .venv/bin/mlflow ui --backend-store-uri {default_tracking_uri()}"
    )
    return table


def _materialize_hours(job, data_root: str, bootstrap: str, hours: int, console: Console) -> Table:
    assets = build_source_assets(job)
    resources = {
        "storage": PrimusStorageResource(data_root=data_root),
        "kafka": KafkaResource(bootstrap_servers=bootstrap),
    }
    instance = DagsterInstance.get()
    totals: dict[str, dict[str, object]] = {}
    began = time.perf_counter()
    for hour in range(hours):
        key = (job.dataset.start + timedelta(hours=hour)).strftime("%Y-%m-%d-%H:%M")
        result = materialize(assets, partition_key=key, instance=instance, resources=resources, run_config=_QUIET)
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
        table.add_row(
            name, str(row["partitions"]), f"{row['rows']:,}", f"{int(row['bytes']) / 2**20:.1f}", str(row["version"])
        )
    return table

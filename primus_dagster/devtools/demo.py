"""``make demo``: the reference job on embedded defaults, end to end, leaving nothing running.

Start the embedded Kafka-compatible broker; write two days (and two hours) of the synthetic
world to every source of the spec; materialise each source asset for the hours of the first day
into the project's Dagster instance (visible in ``dagster dev`` afterwards); then materialise the
training asset for the second day -- MTRM in ``batch_then_stream`` mode: pre-trained on the first
day's complete batch data (``batch_lag: 24h``), then following the second day's Kafka stream,
checkpointed to MLflow -- and print the AUC table and the MLflow run; stop the broker if the demo
started it. Source partitions go through the assets' blocking checks; the table counts those passed.

Example::

    primus-dagster-dev demo --hours 2 --rows-per-hour 200      # what `make demo` runs, smaller
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

from dagster import ConfigurableResource, DagsterInstance, materialize
from rich.console import Console
from rich.table import Table

from primus_dagster import paths
from primus_dagster.broker_discovery import KAFKA_ENV
from primus_dagster.dagster_defs import (
    ExecutorPoolResource,
    KafkaResource,
    MlflowResource,
    PrimusStorageResource,
    build_source_assets,
    build_training_asset,
    live_asset_name,
)
from primus_dagster.data import SourceContext
from primus_dagster.spec import JobSpec, load_job_spec
from primus_dagster.training.tracking import default_tracking_uri

# Dagster's console logger prints every step event; the demo prints its own progress instead.
_QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def run_demo(args: argparse.Namespace) -> int:
    from primus_dagster.devtools.kafka_broker import EmbeddedBroker
    from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world

    console = Console()
    os.environ["DAGSTER_HOME"] = str(paths.dagster_home())
    job = load_job_spec(args.spec)
    data_root = str(paths.data_root())
    state_file = str(paths.broker_state_file())
    bootstrap = os.environ.get(KAFKA_ENV)
    started_broker = False
    if not bootstrap:
        broker_state = EmbeddedBroker.read_state(state_file)
        if broker_state is None:
            broker_state = EmbeddedBroker.start_detached(state_file)
            started_broker = True
        bootstrap = str(broker_state["bootstrap_servers"])
    console.print(
        f"[bold]primus-dagster demo[/]: job {job.name!r}, data root {data_root}, Kafka {bootstrap}, "
        f"DAGSTER_HOME {os.environ['DAGSTER_HOME']}"
    )
    try:
        context = SourceContext(data_root, bootstrap)
        world = SyntheticWorld(WorldConfig(rows_per_hour=args.rows_per_hour), job.dataset.start)
        # Two days, the evaluation hour after them, and one more (so Kafka's last hour is complete).
        write_world(job, context, world, range(max(args.hours, 48) + 2))
        resources = _demo_resources(data_root, bootstrap)
        console.print(_materialize_hours(job, resources, args.hours, console))
        if not args.no_train:
            console.print(_train_day(job, args.spec, resources, console))
    finally:
        if started_broker:
            EmbeddedBroker.stop_detached(state_file)
    console.print(
        "Browse the runs: [bold]DAGSTER_HOME=.primus/dagster_home .venv/bin/dagster dev[/] "
        "(workspace.yaml), or materialise one partition: [bold].venv/bin/dagster asset materialize "
        "-m definitions --select impressions_parquet --partition "
        f"{job.dataset.start:%Y-%m-%d-%H:%M}[/] (needs the broker for Kafka assets)."
    )
    next_day = job.dataset.start + timedelta(days=2)
    console.print(
        "Watch training follow new data: [bold]make dev[/] (UI and daemon; the batch and stream sensors are on), "
        "then, with the broker running ([bold].venv/bin/primus-dagster-dev broker --detach[/]), write more hours: "
        f"[bold].venv/bin/primus-dagster synth --spec {args.spec} --start {next_day:%Y-%m-%d} --days 1[/] -- the "
        f"source partitions are scanned, the live model ({live_asset_name(job)}) follows the new Kafka records "
        "within seconds, and the training partitions materialise by themselves, in order."
    )
    return 0


def _demo_resources(data_root: str, bootstrap: str) -> dict[str, ConfigurableResource]:
    """The embedded defaults with the demo's own broker (the spec's MLflow, else SQLite under the home)."""
    return {
        "storage": PrimusStorageResource(data_root=data_root, kafka=KafkaResource(bootstrap_servers=bootstrap)),
        "mlflow": MlflowResource(),
        "executor_pool": ExecutorPoolResource(),
    }


def _train_day(job: JobSpec, spec_path: str, resources: dict[str, ConfigurableResource], console: Console) -> Table:
    """Materialise the training asset's partition of the second day; the AUC table."""
    partition = (job.dataset.start + timedelta(days=1)).strftime("%Y-%m-%d")
    console.print(f"training {job.training.model.type} ({job.training.mode}) on partition {partition} ...")
    began = time.perf_counter()
    result = materialize(
        [build_training_asset(job, spec_path)],
        partition_key=partition,
        instance=DagsterInstance.get(),
        resources=resources,
        run_config=_QUIET,
    )
    (event,) = result.get_asset_materialization_events()
    meta = {name: getattr(value, "value", value) for name, value in event.materialization.metadata.items()}
    auc_check_passed = any(check.passed for check in result.get_asset_check_evaluations())
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
        "passed" if auc_check_passed else "failed",
    )
    table.caption = (
        f"MLflow run {meta['mlflow_run_id']} ({meta['mlflow_run_url']}); model {meta['model_uri']}; "
        f"browse: .venv/bin/mlflow ui --backend-store-uri {default_tracking_uri()}"
    )
    return table


def _materialize_hours(job: JobSpec, resources: dict[str, ConfigurableResource], hours: int, console: Console) -> Table:
    """Materialise every source asset for the first ``hours`` hours; rows, bytes, versions and checks per asset."""
    source_assets = build_source_assets(job)
    instance = DagsterInstance.get()
    totals_by_asset: dict[str, dict[str, object]] = {}
    began = time.perf_counter()
    for hour in range(hours):
        partition_key = (job.dataset.start + timedelta(hours=hour)).strftime("%Y-%m-%d-%H:%M")
        result = materialize(
            source_assets, partition_key=partition_key, instance=instance, resources=resources, run_config=_QUIET
        )
        for event in result.get_asset_materialization_events():
            metadata = event.materialization.metadata
            totals = totals_by_asset.setdefault(
                event.asset_key.to_user_string(),
                {"partitions": 0, "rows": 0, "bytes": 0, "version": "-", "checks_passed": 0, "checks": 0},
            )
            totals["partitions"] = int(totals["partitions"]) + 1
            totals["rows"] = int(totals["rows"]) + metadata["rows"].value
            totals["bytes"] = int(totals["bytes"]) + metadata["arrow_bytes"].value
            if "version" in metadata:
                totals["version"] = metadata["version"].value
            if "kafka_offsets" in metadata:
                totals["version"] = f"offsets up to hour {partition_key}"
        for evaluation in result.get_asset_check_evaluations():
            totals = totals_by_asset[evaluation.asset_key.to_user_string()]
            totals["checks"] = int(totals["checks"]) + 1
            totals["checks_passed"] = int(totals["checks_passed"]) + int(evaluation.passed)
        console.print(f"materialised partition {partition_key} ({hour + 1}/{hours})")
    table = Table(title=f"source assets materialised in {time.perf_counter() - began:.1f}s")
    for column in ("asset", "partitions", "rows", "arrow MB", "version / offsets", "checks passed"):
        table.add_column(column)
    for name, totals in totals_by_asset.items():
        table.add_row(
            name,
            str(totals["partitions"]),
            f"{totals['rows']:,}",
            f"{int(totals['bytes']) / 2**20:.1f}",
            str(totals["version"]),
            f"{totals['checks_passed']}/{totals['checks']}",
        )
    return table

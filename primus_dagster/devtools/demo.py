"""``make demo``: the reference job on embedded defaults, end to end, leaving nothing running.

Start the embedded Kafka-compatible broker; write the synthetic world to every source of the spec, up to
the hour after the first training partition's evaluation hour (two days and two hours for the daily
``examples/job.yaml``); serve the reference code location (``workspace.yaml``) with ``dagster-webserver``
on the project's Dagster instance and launch, through it, runs of the location's own jobs: the source jobs
(the ones the sensors launch) for every source partition the first training partition reads
(:func:`~primus_dagster.spec.training_inputs`: for ``examples/job.yaml`` the first day's batch hours and the
second day's Kafka hours), then the training job for that partition -- MTRM in ``batch_then_stream`` mode:
pre-trained on the first day's complete batch data (``batch_lag: 24h``), then following the second day's
Kafka stream, checkpointed to MLflow. So the lineage adds up: every input of the trained partition is
Materialized (checked and printed, :func:`~primus_dagster.dagster_defs.sensors.unmaterialized_inputs`), as
when the sensors train. Print the AUC table and the MLflow run; stop the webserver, and the broker if the
demo started it -- saving its records in ``.primus/broker_records`` first, which ``make dev`` replays into a
new broker with the same offsets (:mod:`~primus_dagster.devtools.broker_records`), so the UI re-executes the
demo's Kafka runs. Source partitions go through the assets' blocking checks; the table counts those passed.

The runs belong to the code location (job, repository and location recorded on each run), so ``dagster
dev`` shows them on the Overview timeline and re-executes them. They are launched at once (the
instance's run launcher, no queue) and no daemon runs meanwhile, so the location's sensors stay idle.

Example::

    primus-dagster-dev demo --rows-per-hour 200      # what `make demo` runs, smaller
    primus-dagster-dev demo --hours 24               # also every source's first 24 hours
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus
from rich.console import Console
from rich.table import Table

from primus_dagster import paths
from primus_dagster.broker_discovery import KAFKA_ENV
from primus_dagster.console import report_console
from primus_dagster.dagster_defs import live_asset_name, training_asset_job, training_asset_name
from primus_dagster.dagster_defs.live_asset import live_pool
from primus_dagster.dagster_defs.sensors import source_asset_jobs, unmaterialized_inputs
from primus_dagster.dagster_defs.training_asset import training_partitions_def, training_pool
from primus_dagster.data import SourceContext, TimeWindow
from primus_dagster.devtools.dev import STRAGGLER_ENV, stop_stragglers
from primus_dagster.devtools.freshness import FreshnessError, graphql
from primus_dagster.devtools.processes import stop_process_tree
from primus_dagster.ports import free_port
from primus_dagster.spec import JobSpec, load_job_spec, training_inputs
from primus_dagster.training.tracking import default_tracking_uri

REPO = Path(__file__).resolve().parents[2]
_BIN = Path(sys.executable).parent

_DONE = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
# Source runs side by side: those of one hour (files job + Kafka job) on 2 cores, a few hours on more.
_CONCURRENT_RUNS = max(2, min(8, (os.cpu_count() or 2) // 2))

WORKSPACE_QUERY = """{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on RepositoryLocation { repositories { name } }
  ... on PythonError { message } } } } } }"""


class DemoError(RuntimeError):
    """The demo could not serve the code location or a run of it failed (with what was seen)."""


@dataclass
class LaunchedRun:
    """A run the demo launched: its job, partition, id and final status (None while it runs)."""

    job_name: str
    partition_key: str
    run_id: str = ""
    status: DagsterRunStatus | None = None


def launch_at_once_config(dagster_home: Path) -> dict[str, Any]:
    """``dagster_home``'s instance configuration with its storages, artifacts and compute logs pinned to
    ``dagster_home`` (explicitly, so that it can live in another directory) and the default run coordinator,
    which hands each submitted run to the run launcher at once instead of queueing it for a daemon (the
    queue's and the pools' limits are left out)."""
    config_file = dagster_home / "dagster.yaml"
    config = (yaml.safe_load(config_file.read_text()) if config_file.exists() else None) or {}
    if not {"storage", "run_storage", "event_log_storage", "schedule_storage"} & set(config):
        config["storage"] = {"sqlite": {"base_dir": str(dagster_home)}}
    config.setdefault(
        "local_artifact_storage",
        {
            "module": "dagster._core.storage.root",
            "class": "LocalArtifactStorage",
            "config": {"base_dir": str(dagster_home)},
        },
    )
    config.setdefault(
        "compute_logs",
        {
            "module": "dagster._core.storage.local_compute_log_manager",
            "class": "LocalComputeLogManager",
            "config": {"base_dir": str(dagster_home / "storage")},
        },
    )
    config.pop("run_queue", None)
    config.pop("concurrency", None)  # the queue's limits and the pools': nothing waits
    config["run_coordinator"] = {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}
    return config


class ReferenceLocation:
    """The reference code location (``workspace.yaml``) served by ``dagster-webserver`` on the Dagster instance
    in ``dagster_home``, its runs launched at once (:func:`launch_at_once_config`) and no daemon running, so
    that the location's sensors stay idle. Its UI is the one ``dagster dev`` serves, on :attr:`url`.
    ``daemon=True`` serves it with ``dagster dev`` itself (webserver and daemon; the sensors tick unless
    ``PRIMUS_SENSORS=stopped`` is in ``env``).

    Example::

        with ReferenceLocation(paths.dagster_home(), env, log_path=Path("webserver.log")) as location:
            runs = location.run_all([LaunchedRun("ctr_demo_training_job", "2026-11-02")])
            runs[0].status                                        # DagsterRunStatus.SUCCESS
    """

    def __init__(
        self,
        dagster_home: Path,
        env: dict[str, str],
        log_path: Path,
        workspace: Path = REPO / "workspace.yaml",
        *,
        daemon: bool = False,
    ) -> None:
        if not workspace.exists():
            raise DemoError(f"no {workspace}: the demo serves the reference code location of a source checkout")
        self.dagster_home, self.env, self.log_path, self.workspace = dagster_home, env, log_path, workspace
        self.daemon = daemon
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.location_name = self.repository_name = ""
        self._launcher_home = tempfile.TemporaryDirectory(prefix="primus-launch-at-once-")
        self._proc: subprocess.Popen[bytes] | None = None
        self._token = uuid.uuid4().hex
        self.instance = DagsterInstance.from_config(str(dagster_home))  # where the runs are recorded

    def __enter__(self) -> ReferenceLocation:
        home = Path(self._launcher_home.name)
        (home / "dagster.yaml").write_text(yaml.safe_dump(launch_at_once_config(self.dagster_home)))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            server = [str(_BIN / "dagster"), "dev"] if self.daemon else [str(_BIN / "dagster-webserver")]
            self._proc = subprocess.Popen(
                [*server, "-w", str(self.workspace), "-h", "127.0.0.1", "-p", str(self.port)],
                cwd=self.workspace.parent,
                env={**self.env, "DAGSTER_HOME": str(home), STRAGGLER_ENV: self._token},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its code server and run workers in its process group
            )
        try:
            self._wait_loaded(timeout_s=180)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_loaded(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        seen: object = "no answer"
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise DemoError(
                    f"{'dagster dev' if self.daemon else 'dagster-webserver'} exited ({self._proc.returncode}); log {self.log_path}:\n{self._tail()}"
                )
            try:
                found = graphql(self.port, WORKSPACE_QUERY, {})["workspaceOrError"]
            except (OSError, FreshnessError) as exc:
                seen = exc
                time.sleep(0.5)
                continue
            entries = found.get("locationEntries") or []
            if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                (entry,) = entries
                loaded = entry["locationOrLoadError"]
                if loaded["__typename"] == "PythonError":
                    raise DemoError(f"code location {entry['name']!r} failed to load: {loaded['message']}")
                self.location_name = entry["name"]
                (repository,) = loaded["repositories"]
                self.repository_name = repository["name"]
                return
            seen = found
            time.sleep(0.5)
        raise DemoError(f"the code location did not load within {timeout_s:g}s (last: {seen}); log:\n{self._tail()}")

    def _tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            stop_process_tree(self._proc)
            self._proc = None
            stop_stragglers(self._token)
        self._launcher_home.cleanup()

    def launch(self, run: LaunchedRun, run_config: dict[str, Any] | None = None) -> LaunchedRun:
        """Launch ``run.job_name`` of the location for ``run.partition_key`` (none for an unpartitioned job:
        ``""``); ``run`` with its id."""
        from dagster_graphql import DagsterGraphQLClient

        client = DagsterGraphQLClient("127.0.0.1", port_number=self.port, timeout=120)
        run.run_id = client.submit_job_execution(
            run.job_name,
            repository_location_name=self.location_name,
            repository_name=self.repository_name,
            # none: the location's executor as configured (a local run's steps in its run worker: resources/)
            run_config=run_config if run_config is not None else {},
            tags={"dagster/partition": run.partition_key, "primus/trigger": "demo"}
            if run.partition_key
            else {"primus/trigger": "demo"},
        )
        return run

    def run_all(
        self,
        runs: Sequence[LaunchedRun],
        concurrent: int = 1,
        on_done: Callable[[LaunchedRun], None] | None = None,
        timeout_s: float = 1800,
    ) -> list[LaunchedRun]:
        """Launch ``runs``, at most ``concurrent`` at a time, in order; wait for all. ``on_done(run)`` after each."""
        from dagster_graphql import DagsterGraphQLClient

        client = DagsterGraphQLClient("127.0.0.1", port_number=self.port, timeout=120)
        pending, running = list(runs), []
        deadline = time.monotonic() + timeout_s
        while pending or running:
            while pending and len(running) < concurrent:
                running.append(self.launch(pending.pop(0)))
            time.sleep(0.5)
            for run in list(running):
                status = client.get_run_status(run.run_id)
                if status in _DONE:
                    run.status = status
                    running.remove(run)
                    if on_done is not None:
                        on_done(run)
            if time.monotonic() > deadline:
                raise DemoError(f"runs not done within {timeout_s:g}s: {[(r.job_name, r.run_id) for r in running]}")
        return list(runs)


def run_demo(args: argparse.Namespace) -> int:
    from primus_dagster.devtools.kafka_broker import EmbeddedBroker
    from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world

    console = report_console()
    dagster_home = paths.dagster_home()
    os.environ["DAGSTER_HOME"] = str(dagster_home)
    spec_path = Path(args.spec).resolve()
    job = load_job_spec(spec_path)
    data_root = str(paths.data_root())
    state_file = str(paths.broker_state_file())
    records_dir = paths.broker_records_dir()
    bootstrap = os.environ.get(KAFKA_ENV)
    started_broker = False
    if not bootstrap:
        broker_state = EmbeddedBroker.read_state(state_file)
        if broker_state is None:
            # a fresh one: the demo writes its world again (a replay of the last save would double it)
            broker_state = EmbeddedBroker.start_detached(state_file)
            started_broker = True
        bootstrap = str(broker_state["bootstrap_servers"])
    console.print(
        f"[bold]primus-dagster demo[/]: job {job.name!r}, data root {data_root}, Kafka {bootstrap}, "
        f"DAGSTER_HOME {dagster_home}"
    )
    # The code location resolves the same home, data root and Kafka (its resources fall back to the broker's
    # state file when no bootstrap servers are set), and serves the demo's spec.
    env = {**os.environ, "PRIMUS_HOME": str(paths.primus_home()), "PRIMUS_JOB_SPEC": str(spec_path)}
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    failed: list[LaunchedRun] = []
    instance = DagsterInstance.from_config(str(dagster_home))
    # The pools' limits in the instance now: the run queue would set them the first time it sees a run of a
    # pool, after that pass already let two of them through.
    for pool in (training_pool(job), live_pool(job)):
        instance.event_log_storage.initialize_concurrency_limit_to_default(pool)
    partition = demo_partition(job)
    try:
        context = SourceContext(data_root, bootstrap)
        world = SyntheticWorld(WorldConfig(rows_per_hour=args.rows_per_hour), job.dataset.start)
        write_world(job, context, world, range(max(args.hours, world_hours(job, partition))))
        console.print("serving the reference code location (dagster-webserver) ...")
        with ReferenceLocation(dagster_home, env, paths.primus_home() / "demo_webserver.log") as location:
            console.print(f"code location {location.location_name!r} loaded; launching its jobs' runs")
            runs = merged_runs(source_jobs(job, args.hours), input_runs(job, partition))
            console.print(f"{len(runs)} source runs: every source partition training partition {partition} reads")
            table, failed = materialize(job, location, runs, console)
            console.print(table)
            if not args.no_train and not failed:
                table, failed = train_partition(job, location, console, partition)
                console.print(table)
                missing = unmaterialized_inputs(job, location.instance)
                console.print(
                    "lineage: every source partition a trained partition read is Materialized"
                    if not missing
                    else f"[red]lineage: inputs not Materialized[/]: {missing}"
                )
    finally:
        if started_broker:
            # its records are saved for `make dev` (and the next demo) to replay: the UI re-executes Kafka runs
            EmbeddedBroker.stop_detached(state_file, records_dir=records_dir)
    if failed:
        for run in failed:
            console.print(f"[red]run {run.run_id} of {run.job_name} [{run.partition_key}]: {run.status}[/]")
            console.print(failure_message(instance, run.run_id))
        console.print("[red]the demo's runs failed[/]: open them in the UI (below) for their logs")
    console.print(
        "Browse the runs (re-execute them from the UI): [bold]make dev[/] (it starts the broker again with the "
        f"demo's Kafka records, saved in {records_dir}), or materialise one partition: [bold].venv/bin/dg launch -m "
        f"definitions --assets impressions_parquet --partition {job.dataset.start:%Y-%m-%d-%H:%M}[/]"
        " (for Kafka assets with the broker running: [bold].venv/bin/primus-dagster-dev broker --detach[/])."
    )
    next_day = job.dataset.start + timedelta(days=2)
    console.print(
        "Watch training follow new data: [bold]make dev[/] (UI and daemon; the batch and stream sensors are on; "
        "the broker with the demo's records), then write more hours: "
        f"[bold].venv/bin/primus-dagster synth --spec {args.spec} --start {next_day:%Y-%m-%d} --days 1[/] -- the "
        f"source partitions are scanned, the live model ({live_asset_name(job)}) follows the new Kafka records "
        "within seconds, and the training partitions materialise by themselves, in order."
    )
    return 1 if failed else 0


def demo_partition(job: JobSpec) -> str:
    """The training partition the demo trains: the job's first (``2026-11-02`` for ``examples/job.yaml``)."""
    return str(training_partitions_def(job).get_first_partition_key())


def _training_window(job: JobSpec, partition: str) -> TimeWindow:
    span = training_partitions_def(job).time_window_for_partition_key(partition)  # type: ignore[attr-defined]
    return TimeWindow(span.start, span.end)


def world_hours(job: JobSpec, partition: str) -> int:
    """Hours of the world the demo writes: through ``partition``'s window, its evaluation hours and one more
    (so that the stream's last hour is complete: a record after it exists)."""
    hours = (_training_window(job, partition).end - job.dataset.start) / timedelta(hours=1)
    return math.ceil(hours) + job.training.eval_hours + 1


def _source_job_names(job: JobSpec) -> list[tuple[str, str, list[str]]]:
    """The source jobs (those the sensors launch: one for the file and table sources, one per Kafka source,
    per granularity): ``(job name, granularity, its sources)``."""
    batch = [source for _, source in job.dataset.all_sources() if source.type != "kafka"]
    jobs = [
        (asset_job.name, granularity, [s.name for s in batch if s.granularity == granularity])
        for granularity, asset_job in (source_asset_jobs(job, batch, "files").items() if batch else [])
    ]
    for _, source in job.dataset.all_sources():
        if source.type == "kafka":
            jobs += [(j.name, g, [source.name]) for g, j in source_asset_jobs(job, [source], source.name).items()]
    return jobs


def _partition_key(granularity: str, start: datetime) -> str:
    return start.strftime("%Y-%m-%d-%H:%M" if granularity == "hour" else "%Y-%m-%d")


def input_runs(job: JobSpec, partition: str) -> list[LaunchedRun]:
    """The source jobs' runs that materialise every source partition training ``partition`` reads
    (:func:`~primus_dagster.spec.training_inputs`), in time order; sources that share a job share its run."""
    by_source = {
        source: (name, granularity) for name, granularity, sources in _source_job_names(job) for source in sources
    }
    wanted: dict[tuple[str, str], datetime] = {}
    for source, starts in training_inputs(job, _training_window(job, partition)).items():
        job_name, granularity = by_source[source]
        for start in starts:
            wanted.setdefault((job_name, _partition_key(granularity, start)), start)
    return [LaunchedRun(name, key) for (name, key), _ in sorted(wanted.items(), key=lambda item: (item[1], item[0]))]


def merged_runs(*groups: Sequence[LaunchedRun]) -> list[LaunchedRun]:
    """The runs of ``groups`` without repeats (job and partition), ordered by partition key, then job."""
    seen = {(run.job_name, run.partition_key): run for group in groups for run in group}
    return [seen[key] for key in sorted(seen, key=lambda key: (key[1], key[0]))]


def source_jobs(job: JobSpec, hours: int) -> list[LaunchedRun]:
    """The runs of the reference location's source jobs (those the sensors launch: one for the file and table
    sources, one per Kafka source, per granularity) covering the first ``hours`` hours, hour by hour."""
    jobs = [(granularity, name) for name, granularity, _ in _source_job_names(job)]
    runs: list[LaunchedRun] = []
    seen: set[tuple[str, str]] = set()
    for hour in range(hours):
        start = job.dataset.start + timedelta(hours=hour)
        for granularity, name in jobs:
            key = _partition_key(granularity, start)
            if (name, key) not in seen:
                seen.add((name, key))
                runs.append(LaunchedRun(name, key))
    return runs


def _events(instance: DagsterInstance, run_id: str, event_type: DagsterEventType) -> list[Any]:
    """The run's event log records of ``event_type``."""
    return [record for record in instance.all_logs(run_id, of_type=event_type) if record.dagster_event]


def failure_message(instance: DagsterInstance, run_id: str) -> str:
    """The first step (else run) failure of the run: its error and the error that caused it."""
    for event_type in (DagsterEventType.STEP_FAILURE, DagsterEventType.RUN_FAILURE):
        for record in _events(instance, run_id, event_type):
            error = getattr(record.dagster_event.event_specific_data, "error", None)
            if error is not None:
                lines = [error.message.strip()]
                while error.cause is not None:
                    error = error.cause
                    lines.append(f"caused by {error.message.strip()}")
                return "\n".join(f"  {line}" for line in lines)
    return "  (no failure event recorded)"


def train_partition(
    job: JobSpec, location: ReferenceLocation, console: Console, partition: str
) -> tuple[Table, list[LaunchedRun]]:
    """Run the training job for ``partition``; the AUC table (and the run if it failed)."""
    job_name = training_asset_job(job).name
    console.print(f"training {job.training.model.type} ({job.training.mode}) on partition {partition}: {job_name} ...")
    began = time.perf_counter()
    (run,) = location.run_all([LaunchedRun(job_name, partition)])
    name = training_asset_name(job)
    table = Table(title=f"training asset {name} [{partition}] in {time.perf_counter() - began:.1f}s, run {run.run_id}")
    if run.status != DagsterRunStatus.SUCCESS:
        return table, [run]
    (record,) = _events(location.instance, run.run_id, DagsterEventType.ASSET_MATERIALIZATION)
    meta = {label: getattr(value, "value", value) for label, value in record.asset_materialization.metadata.items()}
    checks = [
        r.dagster_event.event_specific_data
        for r in _events(location.instance, run.run_id, DagsterEventType.ASSET_CHECK_EVALUATION)
    ]
    table.add_column("", no_wrap=True)  # one row per figure: readable in 80 columns
    table.add_column("", overflow="fold")
    rows = {
        "model": job.training.model.type,
        "mode": job.training.mode,
        "next-hour AUC": f"{meta.get('eval_auc', float('nan')):.4f}",
        "log loss": f"{meta.get('eval_log_loss', float('nan')):.4f}",
        "samples": f"{meta['samples']:,}",
        "samples/s": f"{meta['samples_per_s']:,.0f}",
        "checkpoints": str(meta["checkpoints"]),
        "AUC check": "passed" if any(check.passed for check in checks) else "failed",
    }
    for label, value in rows.items():
        table.add_row(label, value)
    table.caption = (
        f"MLflow run {meta['mlflow_run_id']} ({meta['mlflow_run_url']}); model {meta['model_uri']}; "
        f"browse: .venv/bin/mlflow ui --backend-store-uri {default_tracking_uri()}"
    )
    return table, []


def materialize_hours(
    job: JobSpec, location: ReferenceLocation, hours: int, console: Console
) -> tuple[Table, list[LaunchedRun]]:
    """Run the source jobs for the first ``hours`` hours (:func:`materialize`)."""
    return materialize(job, location, source_jobs(job, hours), console)


def materialize(
    job: JobSpec, location: ReferenceLocation, runs: Sequence[LaunchedRun], console: Console
) -> tuple[Table, list[LaunchedRun]]:
    """Run the source jobs' ``runs``; rows, bytes, versions and checks per asset (and the runs that failed)."""
    per_key: dict[str, list[LaunchedRun]] = {}
    for run in runs:
        per_key.setdefault(run.partition_key, []).append(run)
    keys = list(per_key)
    reported = [0]

    def report(_: LaunchedRun) -> None:  # partitions in order, each once all its runs are done
        while reported[0] < len(keys) and all(r.status is not None for r in per_key[keys[reported[0]]]):
            reported[0] += 1
            console.print(f"materialised partition {keys[reported[0] - 1]} ({reported[0]}/{len(keys)})")

    began = time.perf_counter()
    location.run_all(runs, concurrent=_CONCURRENT_RUNS, on_done=report)
    totals_by_asset = _totals(location.instance, runs)
    table = Table(title=f"source assets materialised in {time.perf_counter() - began:.1f}s, {len(runs)} runs")
    # in 80 columns: the asset names whole, the other cells wrapped (never cut to "…")
    table.add_column("asset", no_wrap=True, min_width=max(map(len, totals_by_asset), default=5))
    for column in ("partitions", "rows", "arrow MB", "version / offsets", "checks passed"):
        table.add_column(column, overflow="fold")
    for name, totals in totals_by_asset.items():
        table.add_row(
            name,
            str(totals["partitions"]),
            f"{totals['rows']:,}",
            f"{int(totals['bytes']) / 2**20:.1f}",
            str(totals["version"]),
            f"{totals['checks_passed']}/{totals['checks']}",
        )
    return table, [run for run in runs if run.status != DagsterRunStatus.SUCCESS]


def _totals(instance: DagsterInstance, runs: Iterable[LaunchedRun]) -> dict[str, dict[str, Any]]:
    totals_by_asset: dict[str, dict[str, Any]] = {}
    for run in runs:
        for record in _events(instance, run.run_id, DagsterEventType.ASSET_MATERIALIZATION):
            materialization = record.asset_materialization
            metadata = materialization.metadata
            totals = totals_by_asset.setdefault(
                materialization.asset_key.to_user_string(),
                {"partitions": 0, "rows": 0, "bytes": 0, "version": "-", "checks_passed": 0, "checks": 0},
            )
            totals["partitions"] += 1
            totals["rows"] += metadata["rows"].value
            totals["bytes"] += metadata["arrow_bytes"].value
            if "version" in metadata:
                totals["version"] = metadata["version"].value
            if "kafka_offsets" in metadata:
                totals["version"] = f"offsets up to hour {run.partition_key}"
        for record in _events(instance, run.run_id, DagsterEventType.ASSET_CHECK_EVALUATION):
            evaluation = record.dagster_event.event_specific_data
            totals = totals_by_asset.setdefault(
                evaluation.asset_key.to_user_string(),
                {"partitions": 0, "rows": 0, "bytes": 0, "version": "-", "checks_passed": 0, "checks": 0},
            )
            totals["checks"] += 1
            totals["checks_passed"] += int(evaluation.passed)
    return totals_by_asset

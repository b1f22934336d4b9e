"""The run log never goes quiet: stage lines and heartbeats (unit), and the cadence of a real
``primus-dagster train`` measured from the arrival times of its stderr lines; MLflow's loss curve
has a point per step."""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import mlflow
import pytest
from jobkit import make_job

from primus_dagster.training.progress import Heartbeat

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.monotonic(), record.getMessage()))


def test_a_silent_stage_gets_heartbeats_and_a_busy_one_does_not() -> None:
    logger = logging.getLogger("primus_dagster.test_progress")
    logger.setLevel(logging.INFO)
    lines = Lines()
    logger.addHandler(lines)
    try:
        with Heartbeat(interval_s=0.2, logger=logger) as beat:
            beat.stage("starting %d executors", 3)
            time.sleep(1.0)  # silent: a heartbeat every 0.2 s
            silent = len(lines.lines)
            beat.quiet_stage("training")
            for _ in range(10):  # a progress line every 0.1 s: no heartbeat needed
                beat.touch()
                time.sleep(0.1)
            busy = len(lines.lines) - silent
    finally:
        logger.removeHandler(lines)
    assert lines.lines[0][1] == "starting 3 executors"
    assert silent >= 4 and all(text.startswith("starting 3 executors (") for _, text in lines.lines[1:silent])
    assert busy <= 1  # at most the one due when the stage changed
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        Heartbeat(interval_s=0)


@pytest.mark.integration
def test_the_cli_run_log_has_a_line_every_5_s_and_mlflow_a_loss_per_step(tmp_path: Path) -> None:
    env = make_job(tmp_path, mode="batch_then_stream", model="single", every=10)
    command = [sys.executable, "-m", "primus_dagster.cli", "train", str(env["job_path"]), "--hours", "3"]
    command += ["--data-root", str(env["root"]), "--executors", "2", "--json"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            lines.append((time.monotonic(), line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    stdout = proc.stdout.readline()  # type: ignore[union-attr]  # the result: the run's last line
    ended = time.monotonic()
    proc.stdout.read()  # type: ignore[union-attr]
    assert proc.wait(300) == 0, "\n".join(text for _, text in lines[-40:])
    exit_s = time.monotonic() - ended  # no interpreter teardown after the result (cli.exit_without_teardown)
    reader.join(10)
    engine = [(t, text) for t, text in lines if " primus_dagster." in text or text.startswith("[")]
    first = next(t for t, text in engine if "planning window" in text)
    times = [t for t, _ in engine if t >= first] + [ended]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    text = "\n".join(text for _, text in lines)
    assert max(gaps) <= 5.0, f"a {max(gaps):.1f} s silence in the run log:\n{text}"
    assert exit_s <= 5.0, f"the command took {exit_s:.1f} s to exit after printing its result"
    for stage in (
        "planned ",
        "data executors up",
        "training (first step of rank 0 after",
        "checkpoint at step",
        "evaluation: ",
    ):
        assert stage in text, f"no {stage!r} line:\n{text}"
    assert "MLflow run " in text and "model logged: " in text

    run_id = json.loads(stdout)["mlflow_run_id"]
    client = mlflow.MlflowClient(env["job"].tracking.tracking_uri)
    steps = int(client.get_run(run_id).data.metrics["checkpoint_step"])
    losses = client.get_metric_history(run_id, "loss")
    assert len(losses) >= steps / 10  # criterion: >= 1 loss point per 10 steps (we log every step)
    inputs = client.get_run(run_id).inputs.dataset_inputs
    assert sorted(i.dataset.name for i in inputs) == ["events", "imp"]
    # each dataset says what it holds without opening its raw JSON: the canonical columns, partitions, bytes
    for item in inputs:
        columns = {c["name"]: c["type"] for c in json.loads(item.dataset.schema)["mlflow_colspec"]}
        assert columns["ts"] == "datetime" and columns["label"] == "float", columns
        profile = json.loads(item.dataset.profile)
        assert profile["partitions"] >= 1 and profile["tasks"] >= 1, profile
    run = client.get_run(run_id)
    assert run.data.tags["mlflow.user"] and run.data.tags["mlflow.source.type"] == "LOCAL", run.data.tags

"""Training partitions in order: the asset depends on its own previous partition; three consecutive
partitions materialised through one instance each continue the model of the one before; a partition
whose predecessor never trained fails naming it, or starts fresh (logged, in metadata) under
``automation.cold_start: allow``."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, TimeWindowPartitionMapping, instance_for_test, materialize

from primus_dagster.dagster_defs import (
    ExecutorPoolResource,
    MlflowResource,
    PrimusStorageResource,
    build_training_asset,
)
from primus_dagster.devtools.processes import stop_process_tree
from primus_dagster.ports import free_port
from primus_dagster.spec import load_job_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from jobkit import make_job

pytestmark = pytest.mark.integration
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
KEY = AssetKey("train_test_model")
DAGSTER = str(Path(sys.executable).with_name("dagster"))


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


def train(env: dict, instance: DagsterInstance, partition: str, job_path: Path | None = None):
    job_path = job_path or env["job_path"]
    asset = build_training_asset(load_job_spec(job_path), job_path)
    resources = {
        "storage": PrimusStorageResource(data_root=str(env["root"])),
        "mlflow": MlflowResource(),
        "executor_pool": ExecutorPoolResource(data_executors=1),
    }
    return materialize(
        [asset], partition_key=partition, instance=instance, resources=resources, run_config=QUIET, raise_on_error=False
    )


def metadata(result) -> dict:
    (event,) = result.get_asset_materialization_events()
    return {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}


def test_the_training_asset_depends_on_its_previous_partition(tmp_path: Path) -> None:
    env = make_job(tmp_path, hours=0, extra_training="partition: hour\nbatch_lag: 1h\nauc_tolerance: 1")
    asset = build_training_asset(env["job"], env["job_path"])
    mapping = asset.get_partition_mapping(KEY)
    assert isinstance(mapping, TimeWindowPartitionMapping)
    assert (mapping.start_offset, mapping.end_offset) == (-1, -1)


def test_partitions_train_in_order_and_a_missing_predecessor_is_never_silent(
    tmp_path: Path, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    env = make_job(
        tmp_path / "data",
        hours=4,
        rows_per_hour=600,
        # 600 rows an hour teach the model nothing: the order is under test, not what it learns
        extra_training="partition: hour\nbatch_lag: 1h\nauc_tolerance: 1\nbaseline_guard: warn",
    )
    runs = []
    for partition in ("2026-11-01-01:00", "2026-11-01-02:00", "2026-11-01-03:00"):
        result = train(env, instance, partition)
        assert result.success
        runs.append(metadata(result))
    assert runs[0]["cold_start"] == "first training partition" and "warm_started_from" not in runs[0]
    assert runs[1]["warm_started_from"] == runs[0]["mlflow_run_id"]  # each continues the one before
    assert runs[2]["warm_started_from"] == runs[1]["mlflow_run_id"]

    # 05:00 out of order: 04:00 never trained, and cold_start defaults to first_partition.
    skipped = train(env, instance, "2026-11-01-05:00")
    assert not skipped.success
    (failure,) = [e for e in skipped.all_events if e.is_step_failure]
    cause = failure.step_failure_data.error.cause
    message = cause.message
    assert cause.cls_name == "MissingPredecessorError"
    assert "no finished run 'train-test/2026-11-01-04:00'" in message and "automation.cold_start: allow" in message
    assert "2026-11-01-05:00" not in instance.get_materialized_partitions(KEY)

    allowing = env["job_path"].with_name("job_allow.yaml")
    allowing.write_text(env["job_path"].read_text() + "automation: {cold_start: allow}\n")
    fresh = train(env, instance, "2026-11-01-05:00", allowing)
    assert fresh.success
    meta = metadata(fresh)
    assert "warm_started_from" not in meta
    assert meta["cold_start"] == "no finished run 'train-test/2026-11-01-04:00' with a checkpoint to warm-start from"


DEFS_MODULE = """
from dagster import Definitions, in_process_executor

from primus_dagster.dagster_defs import ExecutorPoolResource, MlflowResource, PrimusStorageResource, build_training_asset
from primus_dagster.ports import free_port
from primus_dagster.spec import load_job_spec

defs = Definitions(
    assets=[build_training_asset(load_job_spec({job_path!r}), {job_path!r})],
    resources={{
        "storage": PrimusStorageResource(data_root={root!r}),
        "mlflow": MlflowResource(),
        "executor_pool": ExecutorPoolResource(data_executors=1),
    }},
    executor=in_process_executor,
)
"""

LAUNCH = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
STATUS = """query($id: String!) { partitionBackfillOrError(backfillId: $id) {
  ... on PartitionBackfill { status } ... on PythonError { message } } }"""

READ_RUNS = """
import json
from dagster import AssetKey, DagsterInstance
instance = DagsterInstance.get()
out = []
for record in instance.fetch_materializations(AssetKey("train_test_model"), limit=10, ascending=True).records:
    run = instance.get_run_record_by_id(record.run_id)
    meta = {k: getattr(v, "value", None) for k, v in record.asset_materialization.metadata.items()
            if k != "dagster/column_schema"}  # a TableSchema is not JSON
    out.append({"partition": record.partition_key, "start": run.start_time, "end": run.end_time, "meta": meta,
                "backfill": run.dagster_run.tags.get("dagster/backfill")})
print(json.dumps(out, default=str))
"""


def graphql(port: int, query: str, variables: dict) -> dict:
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=body, headers={"Content-Type": "application/json"}
    )
    return json.loads(urllib.request.urlopen(request, timeout=30).read())["data"]


def test_a_backfill_through_the_daemon_trains_partitions_in_order(tmp_path: Path) -> None:
    """`dagster dev` (webserver + daemon): a backfill of three training partitions, launched over GraphQL,
    runs them one after the other (the self-dependency), each warm-started from the one before."""
    env = make_job(
        tmp_path / "data", hours=4, rows_per_hour=600, extra_training="partition: hour\nbatch_lag: 1h\nauc_tolerance: 1"
    )
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    module = tmp_path / "order_defs.py"
    module.write_text(DEFS_MODULE.format(job_path=str(env["job_path"]), root=str(env["root"])))
    (tmp_path / "tmp").mkdir()
    # TMPDIR: `dagster dev` leaves its workspace temp dirs behind when it is stopped under load
    proc_env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "PRIMUS_HOME": str(tmp_path / "primus"),
        "TMPDIR": str(tmp_path / "tmp"),
    }
    port = free_port()
    proc = subprocess.Popen(
        [DAGSTER, "dev", "-f", str(module), "-p", str(port), "-h", "127.0.0.1"],
        cwd=tmp_path,
        env=proc_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    partitions = ["2026-11-01-01:00", "2026-11-01-02:00", "2026-11-01-03:00"]
    try:
        deadline = time.monotonic() + 120
        launched = None
        while launched is None and time.monotonic() < deadline:
            try:
                params = {"assetSelection": [{"path": ["train_test_model"]}], "partitionNames": partitions}
                launched = graphql(port, LAUNCH, {"params": params})["launchPartitionBackfill"]
            except (OSError, KeyError, TypeError):
                time.sleep(1)
        assert launched and launched["__typename"] == "LaunchBackfillSuccess", launched
        status = None
        deadline = time.monotonic() + 420  # the backfill daemon ticks every 30 s: one partition per tick
        while time.monotonic() < deadline:
            status = graphql(port, STATUS, {"id": launched["backfillId"]})["partitionBackfillOrError"]
            if status.get("status") not in ("REQUESTED", None):
                break
            time.sleep(3)
        assert status and status["status"] in ("COMPLETED", "COMPLETED_SUCCESS"), status
    finally:
        stop_process_tree(proc)
    out = subprocess.run(
        [sys.executable, "-c", READ_RUNS], env=proc_env, capture_output=True, text=True, check=True
    ).stdout
    runs = json.loads(out.strip().splitlines()[-1])
    assert [r["partition"] for r in runs] == partitions and all(r["backfill"] == launched["backfillId"] for r in runs)
    for before, after in itertools.pairwise(runs):
        assert float(before["end"]) <= float(after["start"])  # one after the other
        assert after["meta"]["warm_started_from"] == before["meta"]["mlflow_run_id"]
    assert runs[0]["meta"]["cold_start"] == "first training partition"

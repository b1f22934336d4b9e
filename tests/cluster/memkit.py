"""Test-only memory growth of data executors, injected from outside the product (no fault knob in it).

Example::

    ids, spec, tasks = small_job(tmp_path, "memory: 1Gi, restart: on_failure")
    factory = growing_pool(tmp_path, "data-0", ballast_mb=400, trigger=tmp_path / "grow-now")
    with PooledDataPlane(spec, root, tasks, pool_factory=factory) as plane:
        ...
        (tmp_path / "grow-now").touch()        # data-0 (every attempt of it) grows by 400 MiB now
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

from primus_dagster.cluster.local import LaunchRequest, LocalPool
from primus_dagster.cluster.pool import ExecutorPool
from primus_dagster.cluster.pooled_plane import PooledDataPlane, PoolFactory
from primus_dagster.data import wait_ready
from primus_dagster.data.tasks import DataTask
from primus_dagster.spec import parse_job_spec
from tests.data.executor.datakit import job_text, plan, write_tree

# Test-only memory growth, injected from outside the product: a ``sitecustomize`` on the executor's
# PYTHONPATH starts a thread that, once the trigger file exists, allocates (and touches) BALLAST_MB
# in 32 MiB steps -- like buffers that grow -- and keeps it. The real executor runs unchanged.
SITECUSTOMIZE = """
import os, threading, time
_mb = int(os.environ.get("PRIMUS_TEST_BALLAST_MB", "0"))
_trigger = os.environ.get("PRIMUS_TEST_BALLAST_TRIGGER")
if _mb and _trigger:
    def _grow():
        while not os.path.exists(_trigger):
            time.sleep(0.02)
        hog = []
        while len(hog) * 32 < _mb:
            hog.append(bytearray(b"\\x01") * (32 << 20))
            time.sleep(0.02)
        globals()["_hog"] = hog
    threading.Thread(target=_grow, daemon=True).start()
"""


def growing_pool(tmp_path: Path, executor_id: str | None, ballast_mb: int, trigger: Path) -> PoolFactory:
    """A pool factory: the plane's own local pool, whose ``executor_id`` (every attempt; None: every
    executor) grows by ``ballast_mb`` once ``trigger`` exists."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    extra = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "PRIMUS_TEST_BALLAST_MB": str(ballast_mb),
        "PRIMUS_TEST_BALLAST_TRIGGER": str(trigger),
    }

    def factory(plane: PooledDataPlane) -> ExecutorPool:
        def launch(request: LaunchRequest) -> subprocess.Popen[str]:
            if executor_id is None or request.executor_id == executor_id:
                request = dataclasses.replace(request, env={**request.env, **extra})
            return plane.launch_local(request)

        return LocalPool("data", plane.job.pools.data, launch, ready=wait_ready)

    return factory


def small_job(tmp_path: Path, data_pool: str) -> tuple[list[int], Path, list[DataTask]]:
    """Two hours of six 400-row files under ``tmp_path``, a job of 50-row batches on two data executors
    (lease 3 s, ``data_pool`` their pool's keys) at ``tmp_path / "job.yaml"``, and its read tasks:
    (every sample id, the spec's path, the tasks)."""
    ids = write_tree(tmp_path, hours=2, files=6, rows=400)
    spec = tmp_path / "job.yaml"
    text = job_text(batch_rows=50, buffer_batches=2, task_runners=1, lease="3s", replicas=2, data_pool=data_pool)
    spec.write_text(text)
    return ids, spec, plan(parse_job_spec(text), tmp_path, hours=2)

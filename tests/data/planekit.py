"""Shared test kit for data-plane tests: a plane of real executor processes, and what tests do to it.

Imported as ``tests.data.planekit`` (the project root is on ``pythonpath``). The plane of executor
processes is the product's: a :class:`PooledDataPlane` over a :class:`LocalPool` (supervised: an
executor killed here is restarted as the job's ``pools.data`` restart policy says).

Example::

    with local_plane(job_path, data_root, tasks, executors=2, slow_ms_per_batch={0: 30}) as plane:
        running = kill_mid_serving(plane, got.extend, claims=6)      # SIGKILLs data-0 mid-serving
        assert plane.wait_executors(30) == [0, 0]
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from primus_dagster.cluster.local import LocalPool
from primus_dagster.cluster.pooled_plane import PooledDataPlane, local_data_pool
from primus_dagster.data import Batch, DataPlane, DataTask


def local_plane(
    job_path: str | Path, data_root: str | Path, tasks: Iterable[DataTask] = (), *, executors: int = 2, **kwargs: Any
) -> PooledDataPlane:
    """A :class:`PooledDataPlane` over a :class:`LocalPool` of ``executors`` executor processes on this
    machine (no autoscaler); ``kwargs`` go to the plane (``slow_ms_per_batch``, ``shm``, ``fields``, ...)."""
    return PooledDataPlane(job_path, data_root, tasks, executors=executors, pool_factory=local_data_pool, **kwargs)


def local_pool(plane: PooledDataPlane) -> LocalPool:
    """The started plane's pool, a :class:`LocalPool`."""
    assert isinstance(plane.pool, LocalPool), f"not a local pool: {plane.pool!r}"
    return plane.pool


def executor_pid(plane: PooledDataPlane, index: int) -> int:
    """The process id of executor ``data-<index>``'s current attempt."""
    return local_pool(plane).pid(f"data-{index}")


def kill_executor(plane: PooledDataPlane, index: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to executor ``data-<index>`` (SIGKILL: a crash; SIGSTOP: a frozen node)."""
    local_pool(plane).send_signal(f"data-{index}", sig)


def read_everything(plane: DataPlane, timeout: float = 30.0) -> list[int]:
    """Every sample id the trainer-side reader yields until the data ends."""
    got: list[int] = []
    with plane.reader(0, refresh_s=0.1) as reader:
        while (batch := reader.next_batch(timeout=timeout)) is not None:
            got += batch.sample_id.tolist()
    return got


def kill_mid_serving(plane: PooledDataPlane, collect: Callable[[Batch], None], claims: int, victim: int = 0) -> int:
    """Read every batch of ``plane`` in a thread (each handed to ``collect``); once ``claims`` batches are
    claimed, SIGKILL executor ``victim``, then wait for the reader to end by itself. The tasks running
    at the kill."""
    with plane.reader(0, refresh_s=0.1) as reader:
        done = threading.Event()

        def consume() -> None:
            for batch in reader:
                collect(batch)
            done.set()

        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while plane.driver.status()["claimed_batches"] < claims and time.monotonic() < deadline:
            time.sleep(0.02)
        running = int(plane.driver.status()["counts"]["running"])
        kill_executor(plane, victim)  # it holds leased, half-served tasks
        assert done.wait(90), "the reader did not finish after the kill"
        thread.join(5)
    return running

"""The in-trainer data plane: the driver served over Flight and N data executors as threads of this process.

A trainer co-located with its data (``pools.backend: in_trainer``): readers take their batches by
calling the executors -- no executor process, no Flight stream, no shared-memory copy, no executor
start-up --, at the price of the isolation a process gives (a crashed executor is a crashed trainer,
and its decoding shares the trainer's cores and interpreter) and of a pool's supervision (no
restarts, no scaling). Leases, claims, shuffles, checkpoints and quality counts are the same as on
:class:`~primus_dagster.cluster.pooled_plane.PooledDataPlane`, which runs the executors as supervised
processes (or pods) instead.

Example::

    with InTrainerDataPlane(job_path, data_root, tasks, executors=2, trainers=1) as plane:
        with plane.reader(0) as reader:
            for batch in reader:
                ...
        plane.raise_if_failed()
        print(plane.wait_executors(10), plane.summary())     # [0, 0] {"data_executors_launched": 2, ...}

It implements :class:`~primus_dagster.data.DataPlane`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primus_dagster.data.driver import DataDriver
from primus_dagster.data.executor import DataExecutor
from primus_dagster.data.plane import DataPlane, DataPlaneBase
from primus_dagster.data.reader.remote_reader import RemoteReader
from primus_dagster.data.tasks import DataTask


class InTrainerDataPlane(DataPlaneBase):
    """Driver (Flight, loopback) + ``executors`` data executors as threads of this process; see the
    module docstring (``fields``, ``heartbeat_s``: :class:`~primus_dagster.data.DataPlaneBase`).

    :attr:`data_executors` holds the executors by location (``inproc://data-<i>``) once started.
    """

    def __init__(
        self,
        job_path: str | Path,
        data_root: str | Path,
        tasks: Iterable[DataTask] = (),
        *,
        executors: int = 2,
        trainers: int = 1,
        token: str | None = None,
        kafka_bootstrap: str | None = None,
        driver: DataDriver | None = None,
        heartbeat_s: float | None = None,
        fields: Sequence[str] | None = None,
    ):
        super().__init__(
            job_path,
            data_root,
            tasks,
            trainers=trainers,
            token=token,
            kafka_bootstrap=kafka_bootstrap,
            driver=driver,
            heartbeat_s=heartbeat_s,
            fields=fields,
        )
        self.executors = executors
        self.data_executors: dict[str, DataExecutor] = {}  # location -> executor, once started
        self._closed = False

    def __enter__(self) -> InTrainerDataPlane:
        self.server.serve_in_thread()
        self.started_at = time.monotonic()
        try:
            for index in range(self.executors):
                executor = DataExecutor(
                    self.driver,
                    self.job,
                    f"data-{index}",
                    self.data_root,
                    executor_index=index,
                    trainers=self.trainers,
                    kafka_bootstrap=self.kafka_bootstrap,
                    heartbeat_s=self.heartbeat_s,
                    serve=False,
                    fields=self.fields,
                )
                self.data_executors[executor.location] = executor.start()
        except BaseException:
            self.close()
            raise
        return self

    def reader(self, trainer_id: int, *, in_process: bool = True, **kwargs: Any) -> RemoteReader:
        """A trainer-side reader of this plane that takes its batches from the executors by calling
        them (``feeds``); see :meth:`~primus_dagster.data.DataPlaneBase.reader`."""
        kwargs.setdefault("feeds", self.data_executors)
        return super().reader(trainer_id, in_process=in_process, **kwargs)

    def summary(self) -> dict[str, Any]:
        """What its executors did, with :class:`~primus_dagster.cluster.pooled_plane.PooledDataPlane`'s
        keys: ``data_executors_launched``, ``data_executors_running``, ``cpu_seconds`` (0: see
        :meth:`cpu_seconds`), ``executors_in_process`` (True); nothing restarts or scales them
        (``restarts`` 0, ``scaling`` None, ``timeline`` empty), no supervisor (``oom_restarts`` 0, no
        blacklist, ``error`` None)."""
        return {
            "scaling": None,
            "timeline": [],
            "data_executors_launched": len(self.data_executors),
            "data_executors_running": sum(not e.finished() for e in self.data_executors.values()),
            "restarts": 0,
            "oom_restarts": 0,
            "blacklisted_nodes": [],
            "error": None,
            "cpu_seconds": self.cpu_seconds(),
            "executors_in_process": True,
        }

    def wait_executors(self, timeout: float = 60.0) -> list[int | None]:
        """Once the executors stopped by themselves (the run's tasks are done or failed): 0 for each
        that finished within ``timeout``, else None; in launch order."""
        deadline = time.monotonic() + timeout
        return [0 if e.wait(max(0.0, deadline - time.monotonic())) else None for e in self.data_executors.values()]

    def cpu_seconds(self) -> float:
        """0.0: the executors' CPU is this process's (count it with the trainer's)."""
        return 0.0

    def close(self) -> None:
        """Stop the executors and the driver server (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for executor in self.data_executors.values():
            executor.close()
        self.server.shutdown()


if TYPE_CHECKING:

    def _implements_data_plane(plane: InTrainerDataPlane) -> DataPlane:
        return plane  # mypy checks InTrainerDataPlane against the protocol here

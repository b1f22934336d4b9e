"""The data plane of a training run on an executor pool: driver + supervised data executors.

A :class:`PooledDataPlane` serves the data driver over Flight and runs the data executors in an
:class:`~primus_dagster.cluster.pool.ExecutorPool` (local processes by default) sized and limited
by the job's ``pools.data`` spec. A control thread keeps it healthy while the run goes on: the
:class:`~primus_dagster.cluster.supervisor.Supervisor` restarts failed executors as the restart
policy says (an executor out of restarts aborts the run's tasks with its last error: readers end,
the run fails with that message), and an optional scaling controller's decisions are applied
(scale out / in, resize). A stopped or killed executor's leased tasks go back to the driver and
are read again; the claim ledger keeps delivery exactly once.

Teardown (``close``, also on an exception or a cancellation unwinding the ``with`` block) stops
every executor: gracefully once the run's tasks are done (they have exited already), and with a short
``cancel_grace_s`` before SIGKILL when it is not (a cancelled or failed run: no trainer will take
what the executors buffered, so their drain on SIGTERM would only delay the end of the run) or when
a live executor is silent (the driver no longer hears from it: frozen or wedged, it would not act
on SIGTERM).

It implements :class:`~primus_dagster.data.DataPlane`, as :class:`~primus_dagster.data.InTrainerDataPlane`
(executors as threads of the trainer's process) does, so the training job runs on either. On the
default local pool it is also what tests, benchmarks and the dev tools run real executor processes
with: ``slow_ms_per_batch`` slows chosen executors, ``shm`` / ``fields`` set how they serve,
:meth:`PooledDataPlane.wait_executors` waits for their exits and :meth:`PooledDataPlane.cpu_seconds`
measures them (with or without their start-up); ``plane.pool`` (a
:class:`~primus_dagster.cluster.local.LocalPool`) signals one (``send_signal``).

Example::

    with PooledDataPlane("job.yaml", "/data", plan.tasks, token=secrets.token_hex(16)) as plane:
        with plane.reader(0) as reader:
            for batch in reader:
                ...
        plane.raise_if_failed()
        plane.wait_executors(30)                     # [0, 0]: they exited by themselves
        plane.summary()        # {"data_executors_launched": 2, "restarts": 0, ...}
        plane.cpu_seconds(include_startup=False)     # their CPU since they were ready
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from primus_dagster.cluster.local import LaunchRequest, LocalPool
from primus_dagster.cluster.pool import ExecutorPool, PoolError
from primus_dagster.cluster.supervisor import ExecutorFailedError, Supervisor
from primus_dagster.data import (
    DataDriver,
    DataPlane,
    DataPlaneBase,
    DataTask,
    ExecutorConfig,
    start_executor_process,
    sweep_dead_executors,
    wait_ready,
)
from primus_dagster.spec import load_job_spec

log = logging.getLogger(__name__)

PoolFactory = Callable[["PooledDataPlane"], ExecutorPool]
"""Makes the data pool of a plane (called once its driver serves: ``plane.location`` is known)."""


class PoolController(Protocol):
    """What the control thread asks of a scaling controller each tick: decisions to apply."""

    def control(self, plane: PooledDataPlane, now: float) -> None: ...

    def summary(self) -> dict[str, Any]: ...


def local_data_pool(plane: PooledDataPlane) -> ExecutorPool:
    """The local-process pool of a plane's data executors (``pools.data``)."""
    return LocalPool("data", plane.job.pools.data, plane.launch_local, ready=wait_ready)


class PooledDataPlane(DataPlaneBase):
    """Driver + a supervised pool of data executors (see the module docstring).

    ``executors``: how many to launch (default ``pools.data.replicas``); ``fields``, ``heartbeat_s``,
    ``driver_host``: :class:`~primus_dagster.data.DataPlaneBase`; ``shm``: local executors offer the
    readers on this machine shared memory (False: every batch in the Flight stream);
    ``slow_ms_per_batch``: a sleep per served batch (fault injection, pacing) of every local
    executor, or by executor index (``{0: 150.0}``: executor ``data-0`` and its restarts only).
    """

    def __init__(
        self,
        job_path: str | Path,
        data_root: str | Path,
        tasks: Iterable[DataTask] = (),
        *,
        executors: int | None = None,
        trainers: int = 1,
        token: str | None = None,
        kafka_bootstrap: str | None = None,
        driver: DataDriver | None = None,
        pool_factory: PoolFactory = local_data_pool,
        controller: PoolController | None = None,
        heartbeat_s: float | None = None,
        driver_host: str = "127.0.0.1",
        check_s: float = 0.25,
        shm: bool = True,
        cancel_grace_s: float = 2.0,
        slow_ms_per_batch: float | Mapping[int, float] = 0.0,
        fields: Sequence[str] | None = None,
    ):
        replicas = executors if executors is not None else load_job_spec(job_path).pools.data.replicas
        if replicas < 1:  # before the driver server binds its port
            raise ValueError(f"a data plane needs at least one data executor, got {replicas}")
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
            driver_host=driver_host,
        )
        self.executors = replicas
        self.shm = shm
        self.pool_factory = pool_factory
        self.pool: ExecutorPool | None = None
        self.supervisor: Supervisor | None = None
        self.controller = controller
        self.check_s = check_s
        self.cancel_grace_s = cancel_grace_s
        self.slow_ms_per_batch = slow_ms_per_batch
        self.error: str | None = None
        self._stop = threading.Event()
        self._control = threading.Thread(target=self._control_loop, name="data-plane-control", daemon=True)

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> PooledDataPlane:
        self.server.serve_in_thread()
        self.started_at = time.monotonic()
        try:
            self.pool = self.pool_factory(self)
            self.supervisor = Supervisor(self.pool, self.job.pools.data)
            self.pool.launch(self.executors)
        except BaseException:
            self.close()
            raise
        self._control.start()
        return self

    def close(self) -> None:
        """Stop the control thread, every executor and the driver server (idempotent). Before the
        run's tasks are done (cancellation, failure) executors get ``cancel_grace_s`` after SIGTERM, not
        the pool's full grace (see the module docstring)."""
        self._stop.set()
        if self._control.is_alive():
            self._control.join(timeout=10)
        if self.pool is not None:
            try:
                status = self.driver.status()
                live = {s.executor_id for s in self.pool.status() if not s.finished}
                graceful = bool(status["done"]) and not live & set(status["silent_executors"])
            except Exception:  # a broken driver or pool must not keep the executors alive
                graceful = False
            if graceful:
                self.pool.close()
            else:
                _close_quickly(self.pool, self.cancel_grace_s)
            sweep_dead_executors()
        self.server.shutdown()

    def cpu_seconds(self, include_startup: bool = True) -> float:
        """CPU seconds of every data executor so far, as its pool measures them (a local pool: every
        process, live and exited; Kubernetes: 0.0); without ``include_startup``, only what each used
        after it was ready."""
        return self.pool.cpu_seconds(include_startup=include_startup) if self.pool is not None else 0.0

    def wait_executors(self, timeout: float = 60.0, poll_s: float = 0.02) -> list[int | None]:
        """Once the executors stopped by themselves (the run's tasks are done or failed, or they
        failed): each one's exit code, in launch order, None for one still running after ``timeout``
        (its pool's status read every ``poll_s``)."""
        deadline = time.monotonic() + timeout
        while True:
            statuses = self.pool.status() if self.pool is not None else []
            if all(s.finished for s in statuses) or time.monotonic() >= deadline:
                return [s.exit_code if s.finished else None for s in statuses]
            time.sleep(poll_s)

    def summary(self) -> dict[str, Any]:
        """What the pool did: executors launched, restarts, OOM kills (``oom_kills_from_resize``: those
        its own resizes caused), blacklist, CPU seconds, the error that aborted the run's tasks, and the
        scaling ``timeline`` (one point per scaling tick, at most 500; empty without a
        controller; see :class:`~primus_dagster.cluster.autoscaler.ScalingTimeline`)."""
        statuses = self.pool.status() if self.pool is not None else []
        supervisor = self.supervisor
        scaling = self.controller.summary() if self.controller is not None else None
        return {
            "scaling": scaling,
            "timeline": list((scaling or {}).get("timeline") or []),
            "data_executors_launched": len(statuses),
            "data_executors_running": sum(not s.finished for s in statuses),
            "restarts": sum(supervisor.restarts.values()) if supervisor else 0,
            "oom_restarts": sum(d.state == "oom_killed" for d in supervisor.decisions) if supervisor else 0,
            # OOM kills the pool's own sizing caused (restarted, blaming no node): 0 is the goal
            "oom_kills_from_resize": len(supervisor.oom_kills_by_scaling) if supervisor else 0,
            "blacklisted_nodes": supervisor.blacklist if supervisor else [],
            "error": self.error,
            "cpu_seconds": round(self.cpu_seconds(), 3),
        }

    # ----------------------------------------------------------------- control
    def launch_local(self, request: LaunchRequest) -> Any:
        """Start one data executor process of this plane (the :class:`LocalPool` launcher)."""
        slow = self.slow_ms_per_batch
        config = ExecutorConfig(
            driver=self.location,
            executor_id=request.executor_id,
            job_spec=self.job_path,
            data_root=self.data_root,
            executor_index=request.index,
            trainers=self.trainers,
            kafka_bootstrap=self.kafka_bootstrap,
            heartbeat_s=self.heartbeat_s,
            linger_s=0.5,
            shm=self.shm,
            slow_ms_per_batch=float(slow.get(request.index, 0.0) if isinstance(slow, Mapping) else slow),
            fields=self.fields,
        )
        return start_executor_process(
            config, token=self.token, env={**os.environ, **request.env}, stderr=request.stderr
        )

    def _control_loop(self) -> None:
        while not self._stop.wait(self.check_s):
            status = self.driver.status()
            if status["failed"]:
                return
            assert self.supervisor is not None  # set in __enter__, before this thread starts
            try:
                self.supervisor.check(run_active=not status["done"])
                if self.controller is not None and not status["done"]:
                    self.controller.control(self, time.monotonic())
            except (ExecutorFailedError, PoolError) as exc:
                self.error = str(exc)
                log.error("data plane: %s", exc)
                self.driver.abort(str(exc))
                return


if TYPE_CHECKING:

    def _implements_data_plane(plane: PooledDataPlane) -> DataPlane:
        return plane  # mypy checks PooledDataPlane against the protocol here


def _close_quickly(pool: ExecutorPool, grace_s: float) -> None:
    """``pool.close`` with a short grace where the backend takes one (local, Kubernetes)."""
    close: Callable[..., None] = pool.close
    if "grace_s" in inspect.signature(close).parameters:
        close(grace_s=grace_s)
    else:
        close()

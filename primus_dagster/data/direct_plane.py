"""A data plane on this machine: the driver served over Flight plus N data executor processes.

``executors_in_process=True`` runs the N executors as threads of this process instead (a trainer
co-located with its data): readers then take their batches by calling the executors -- no Flight
stream, no shared-memory copy, no executor start-up --, at the price of the isolation a process
gives (a crashed executor is a crashed trainer, and its decoding shares the trainer's cores and
interpreter). Leases, claims, shuffles, checkpoints and quality counts are the same.

The local executor pool of the roadmap builds on this; tests, benchmarks and the training
job use it to run the real processes (``python -m primus_dagster.data.executor``).

Example::

    with DirectDataPlane(job_path, data_root, tasks, executors=2, trainers=1) as plane:
        with plane.reader(0) as reader:
            for batch in reader:
                ...
        plane.raise_if_failed()
        print(plane.cpu_seconds(), plane.summary())

It implements :class:`~primus_dagster.data.DataPlane`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from primus_dagster.data.canonical import check_fields
from primus_dagster.data.driver import DataDriver, DriverClient, DriverServer
from primus_dagster.data.executor import DataExecutor, ExecutorConfig, start_executor_process, wait_ready
from primus_dagster.data.plane import DataPlane
from primus_dagster.data.reader.remote_reader import RemoteReader
from primus_dagster.data.shm import sweep_dead_executors
from primus_dagster.data.tasks import DataTask
from primus_dagster.spec import JobSpec, load_job_spec


class DirectDataPlane:
    """Driver (Flight, loopback) + executor processes; see the module docstring."""

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
        slow_ms_per_batch: dict[int, float] | None = None,
        heartbeat_s: float | None = None,
        shm: bool = True,
        fields: Sequence[str] | None = None,
        executors_in_process: bool = False,
    ):
        if executors_in_process and slow_ms_per_batch:
            raise ValueError("slow_ms_per_batch slows executor streams; executors in this process have none")
        self.job_path = str(job_path)
        self.job: JobSpec = load_job_spec(job_path)
        self.data_root = str(data_root)
        self.token = token
        self.kafka_bootstrap = kafka_bootstrap
        self.trainers = trainers
        self.slow = dict(slow_ms_per_batch or {})
        self.heartbeat_s = heartbeat_s
        self.shm = shm  # executors offer shared memory to the readers (both on this machine)
        # The canonical fields the trainers read (None: all): executors decode only those.
        chosen = check_fields(fields)
        self.fields = tuple(sorted(chosen)) if chosen is not None else None
        self.driver = driver or DataDriver.for_job(self.job.data, trainers=trainers)
        self.driver.add_tasks(tasks)
        self.server = DriverServer(self.driver, token=token)
        self.processes: dict[int, subprocess.Popen[str]] = {}
        self._cpu: dict[int, float] = {}  # pid -> CPU seconds at exit
        self._startup_cpu: dict[int, float] = {}  # pid -> CPU seconds when it announced it was ready
        self._executors = executors
        self.executors_in_process = executors_in_process
        self.in_process: dict[str, DataExecutor] = {}  # location -> executor (executors_in_process)
        self.started_at = time.monotonic()  # when its executors were started (__enter__ sets it)
        self._launched = 0  # executor starts, restarts included
        self._closed = False

    @property
    def location(self) -> str:
        return self.server.location

    def _spawn(self, index: int) -> subprocess.Popen[str]:
        config = ExecutorConfig(
            driver=self.location,
            executor_id=f"data-{index}",
            job_spec=self.job_path,
            data_root=self.data_root,
            executor_index=index,
            trainers=self.trainers,
            kafka_bootstrap=self.kafka_bootstrap,
            slow_ms_per_batch=self.slow.get(index, 0.0),
            heartbeat_s=self.heartbeat_s,
            linger_s=0.5,
            shm=self.shm,
            fields=self.fields,
        )
        proc = start_executor_process(config, token=self.token)
        self.processes[index] = proc
        self._launched += 1
        return proc

    def _await_ready(self, proc: subprocess.Popen[str]) -> str:
        address = wait_ready(proc, timeout=60)
        self._startup_cpu[proc.pid] = _cpu_of(proc)
        return address

    def start_executor(self, index: int) -> str:
        """Start executor ``index`` (again, after a kill); returns its dataset-server address."""
        if self.executors_in_process:
            raise NotImplementedError("executors in this process cannot be restarted one by one")
        return self._await_ready(self._spawn(index))

    def _start_in_process(self) -> None:
        for index in range(self._executors):
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
            self.in_process[executor.location] = executor.start()
            self._launched += 1

    def __enter__(self) -> DirectDataPlane:
        self.server.serve_in_thread()
        self.started_at = time.monotonic()
        if self.executors_in_process:
            self._start_in_process()
            return self
        try:  # all at once: their start-ups (interpreter, imports) overlap
            for proc in [self._spawn(index) for index in range(self._executors)]:
                self._await_ready(proc)
        except BaseException:
            self.close()
            raise
        return self

    def reader(self, trainer_id: int, *, in_process: bool = True, **kwargs: Any) -> RemoteReader:
        """A trainer-side reader of this plane (see :func:`reader_for`)."""
        if self.in_process:
            kwargs.setdefault("feeds", self.in_process)
        return reader_for(self.driver, self.location, trainer_id, token=self.token, in_process=in_process, **kwargs)

    def raise_if_failed(self) -> None:
        """The failure of the run's tasks (failed tasks past the threshold, or an abort), raised."""
        self.driver.raise_if_failed()

    def summary(self) -> dict[str, Any]:
        """What its executors did, with :class:`~primus_dagster.cluster.pooled_plane.PooledDataPlane`'s
        keys: ``data_executors_launched`` (starts, :meth:`start_executor` restarts included),
        ``data_executors_running``, ``restarts`` (those restarts: nothing restarts an executor here
        by itself), ``cpu_seconds``, ``executors_in_process``; no scaling (``scaling`` None,
        ``timeline`` empty), no supervisor (``oom_restarts`` 0, no blacklist, ``error`` None)."""
        running = sum(not e.finished() for e in self.in_process.values())
        running += sum(proc.returncode is None and _running(proc) for proc in self.processes.values())
        return {
            "scaling": None,
            "timeline": [],
            "data_executors_launched": self._launched,
            "data_executors_running": running,
            "restarts": self._launched - len(self.processes) - len(self.in_process),
            "oom_restarts": 0,
            "blacklisted_nodes": [],
            "error": None,
            "cpu_seconds": round(self.cpu_seconds(), 3),
            "executors_in_process": self.executors_in_process,
        }

    def kill(self, index: int) -> None:
        """SIGKILL executor ``index`` (fault injection) and reap it."""
        if self.executors_in_process:
            raise NotImplementedError("executors in this process cannot be killed one by one")
        proc = self.processes[index]
        os.kill(proc.pid, signal.SIGKILL)
        self._reap(proc, 10)

    def _reap(self, proc: subprocess.Popen[str], timeout: float) -> int | None:
        """Wait for ``proc`` with ``wait4`` so its CPU time is known after it is gone."""
        if proc.returncode is not None:
            return proc.returncode
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                self._cpu[proc.pid] = usage.ru_utime + usage.ru_stime
                proc.returncode = os.waitstatus_to_exitcode(status)
                return proc.returncode
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def wait_executors(self, timeout: float = 60.0) -> list[int | None]:
        """Exit codes of the executors once they stopped by themselves (the driver is done); in
        process: 0 for an executor that finished within ``timeout``, else None."""
        if self.in_process:
            deadline = time.monotonic() + timeout
            return [0 if e.wait(max(0.0, deadline - time.monotonic())) else None for e in self.in_process.values()]
        return [self._reap(proc, timeout) for proc in self.processes.values()]

    def cpu_seconds(self, include_startup: bool = True) -> float:
        """CPU seconds used by the executor processes so far (live and exited ones); without
        ``include_startup``, only what they used after announcing they were ready. Executors in
        this process: 0 (their CPU is this process's)."""
        total = 0.0
        for proc in self.processes.values():
            total += self._cpu[proc.pid] if proc.pid in self._cpu else _cpu_of(proc)
            if not include_startup:
                total -= self._startup_cpu.get(proc.pid, 0.0)
        return total

    def close(self) -> None:
        """Stop the executors (SIGTERM; SIGKILL for one the driver finds silent) and the driver server
        (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for executor in self.in_process.values():
            executor.close()
        # A live executor the driver no longer hears from is frozen (SIGSTOP) or wedged: it would not act
        # on SIGTERM, so it is killed at once instead of after the grace.
        silent = set(self.driver.status()["silent_executors"]) if self.processes else set()
        for index, proc in self.processes.items():
            if proc.returncode is None:
                proc.kill() if f"data-{index}" in silent else proc.terminate()
        for proc in self.processes.values():
            if self._reap(proc, 15) is None:
                proc.kill()
                self._reap(proc, 5)
            if proc.stdout:
                proc.stdout.close()
        sweep_dead_executors()
        self.server.shutdown()

    def __exit__(self, *exc: object) -> None:
        self.close()


if TYPE_CHECKING:

    def _implements_data_plane(plane: DirectDataPlane) -> DataPlane:
        return plane  # mypy checks DirectDataPlane against the protocol here


def _running(proc: subprocess.Popen[str]) -> bool:
    """``proc`` runs (not a zombie), asked without reaping it (:meth:`DirectDataPlane._reap` takes
    its CPU time when it does)."""
    try:
        return psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cpu_of(proc: subprocess.Popen[str]) -> float:
    """user + system CPU seconds of a live process."""
    try:
        times = psutil.Process(proc.pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return 0.0
    return times.user + times.system


def reader_for(
    driver: DataDriver, location: str, trainer_id: int, *, token: str | None, in_process: bool = True, **kwargs: Any
) -> RemoteReader:
    """A trainer-side reader of the driver ``driver`` served at ``location``. ``in_process``: it calls
    the driver object directly (claims and barriers without an RPC, as a trainer co-located with its
    driver does); otherwise through its own Flight client (closed with the reader), as a trainer
    elsewhere would."""
    if in_process:
        return RemoteReader(driver, trainer_id, token=token, **kwargs)
    client = DriverClient(location, token=token)
    reader = RemoteReader(client, trainer_id, token=token, **kwargs)
    original_close = reader.close

    def close() -> None:
        original_close()
        client.close()

    reader.close = close  # type: ignore[method-assign]
    return reader

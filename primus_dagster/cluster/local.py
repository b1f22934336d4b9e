"""The local executor pool: executors as OS processes on this machine (the embedded default).

A :class:`LocalPool` starts each executor through a launcher (the role decides the command: a
data executor, a trainer), then owns the process: a watcher thread notices exits, reaps them
(CPU seconds kept), and enforces the allocation.

* **CPU**: ``ceil(cpu)`` cores by CPU affinity (``sched_setaffinity``), chosen round robin over
  the cores this process may use; the child also gets ``OMP_NUM_THREADS`` etc. set to that count.
  Fractional CPU is not enforced (affinity is whole cores).
* **Memory**: the watcher samples every executor's RSS and SIGKILLs one above its allocation; its
  state becomes ``oom_killed``, as a container runtime's OOM killer would report it. Checked every
  ``watch_interval_s``: an allocation spike shorter than that can pass.
* **Resize** is in place: new affinity and a new memory limit for the running process -- except a
  memory limit below the peak RSS the running attempt already reached (the kernel's high-water mark,
  ``VmHWM``): that would kill it the next time it needs what it needed before, so it is not applied
  (:class:`~primus_dagster.cluster.pool.ResizeNotApplied`; the executor keeps its allocation). A
  lowered limit is remembered (``ExecutorStatus.resized_from``) so that an OOM kill below it is
  blamed on the resize, not on the node (:mod:`~primus_dagster.cluster.supervisor`).
* **Peak RSS**: each attempt's kernel high-water mark, read by the watcher
  (``ExecutorStatus.rss_peak_bytes``; vertical scaling sizes memory from it).
* **Nodes**: every core is a placement "node" (``cpu0``, ``cpu1``, ...) so that the supervisor's
  blacklist has something to avoid on one machine; an executor's node is its first core.
* **CPU seconds**: every attempt's, measured (``wait4`` at its exit, ``/proc`` while it runs), with
  what each spent before it was ready kept apart (:meth:`LocalPool.cpu_seconds`).
* **Signals**: :meth:`LocalPool.send_signal` delivers one to an executor's current process (SIGKILL:
  a crash the supervisor handles like any failure; SIGSTOP / SIGCONT: a frozen node and its thaw).
* **Logs**: each attempt's standard error goes to a file of the pool's log directory (by default its
  own temporary one, ``primus-<role>-<pid>-*``, removed by :meth:`LocalPool.close`; one left by a
  process killed before its close is removed by the next pool that starts on this machine).

Example::

    def launch(request: LaunchRequest) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "my.worker", request.executor_id],
                                env={**os.environ, **request.env}, stderr=request.stderr, text=True)

    with LocalPool("data", job.pools.data, launch) as pool:
        ids = pool.launch(2)
        pool.status()                       # [ExecutorStatus(executor_id="data-0", state="running", ...), ...]
        pool.send_signal(ids[0], signal.SIGKILL)          # a crash: its state becomes "failed"
        pool.cpu_seconds(include_startup=False)           # CPU both used since they were ready
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from primus_dagster.cluster.pool import (
    ExecutorState,
    ExecutorStatus,
    PoolError,
    ResizeNotApplied,
    Resources,
    Role,
    lowered_from,
    memory_bytes,
)
from primus_dagster.spec import PoolSpec

log = logging.getLogger(__name__)

_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
_OWN_LOG_DIR = re.compile(r"^primus-(?:data|training)-(\d+)-")  # a pool's own log directory: its process id


@dataclass(frozen=True)
class LaunchRequest:
    """What a launcher starts: executor ``executor_id`` (``index`` in launch order, ``attempt``-th
    start), with ``resources``; ``env`` must be added to the child's environment, ``stderr`` is where
    its standard error goes (the pool reads its tail as the executor's last error)."""

    executor_id: str
    index: int
    attempt: int
    resources: Resources
    env: dict[str, str]
    stderr: IO[Any]


Launcher = Callable[[LaunchRequest], "subprocess.Popen[str]"]


@dataclass
class _Executor:
    executor_id: str
    index: int
    resources: Resources
    cores: list[int]
    proc: subprocess.Popen[str]
    log_path: Path
    attempt: int = 0
    state: ExecutorState = "starting"
    address: str = ""
    exit_code: int | None = None
    last_error: str | None = None
    stop_requested: bool = False
    oom: bool = False
    cpu_s_done: float = 0.0  # CPU seconds of finished attempts
    cpu_s_now: float = 0.0  # of the running attempt, sampled by the watcher
    cpu_s_startup: float = 0.0  # of every attempt (this one included) until it was ready
    rss_peak: int = 0  # this attempt's peak RSS (the kernel's high-water mark), bytes
    resized_from: Resources | None = None  # the allocation before a resize lowered its memory
    started: float = field(default_factory=time.monotonic)


class LocalPool:
    """Executors of one role as local processes (see the module docstring); thread-safe.

    ``ready(proc) -> address`` (optional) blocks until a started process announces its address;
    without it an executor is ``running`` as soon as it started.
    """

    def __init__(
        self,
        role: Role,
        spec: PoolSpec,
        launcher: Launcher,
        *,
        ready: Callable[[subprocess.Popen[str]], str] | None = None,
        id_prefix: str | None = None,
        cpus: Sequence[int] | None = None,
        watch_interval_s: float = 0.1,
        log_dir: str | Path | None = None,
    ):
        self.role = role
        self.spec = spec
        self.launcher = launcher
        self.ready = ready
        self.id_prefix = id_prefix or role
        self.cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
        if not self.cpus:
            raise PoolError("no CPU to place executors on")
        self.default_resources = Resources(spec.cpu, memory_bytes(spec.memory))
        self.watch_interval_s = watch_interval_s
        self._own_log_dir = log_dir is None
        if log_dir is None:
            _sweep_log_dirs_of_dead_pools()
            log_dir = tempfile.mkdtemp(prefix=f"primus-{role}-{os.getpid()}-")
        self.log_dir = Path(log_dir)
        self._lock = threading.RLock()
        self._executors: dict[str, _Executor] = {}
        self._next_index = 0
        self._next_core = 0
        self._closed = False
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name=f"{role}-pool-watcher", daemon=True)
        self._watcher.start()

    # ----------------------------------------------------------------- the pool contract
    def launch(self, count: int, resources: Resources | None = None, *, avoid_nodes: Sequence[str] = ()) -> list[str]:
        """Start ``count`` executors (not on ``avoid_nodes``); waits for each to be ready."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        resources = resources or self.default_resources
        started: list[_Executor] = []
        with self._lock:
            if self._closed:
                raise PoolError(f"{self.role} pool is closed")
            for _ in range(count):
                index = self._next_index
                self._next_index += 1
                executor_id = f"{self.id_prefix}-{index}"
                cores = self._place(resources, avoid_nodes)
                started.append(self._start(executor_id, index, 0, resources, cores))
        for executor in started:
            self._await_ready(executor)
        return [e.executor_id for e in started]

    def stop(self, executor_id: str, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; waits for the exit."""
        executor = self._get(executor_id)
        with self._lock:
            executor.stop_requested = True
        self._terminate(executor, grace_s)

    def restart(self, executor_id: str, resources: Resources | None = None, *, avoid_nodes: Sequence[str] = ()) -> None:
        """Start a finished executor again under its id (attempt + 1)."""
        executor = self._get(executor_id)
        with self._lock:
            if executor.state not in ("succeeded", "failed", "oom_killed", "stopped"):
                raise PoolError(f"{executor_id} is {executor.state}: only a finished executor restarts")
            resources = resources or executor.resources
            cores = self._place(resources, avoid_nodes)
            fresh = self._start(executor_id, executor.index, executor.attempt + 1, resources, cores)
            fresh.cpu_s_done = executor.cpu_s_done + executor.cpu_s_now
            fresh.cpu_s_startup = executor.cpu_s_startup
        self._await_ready(fresh)

    def resize(self, executor_id: str, resources: Resources) -> None:
        """In place: the new core count by affinity, the new memory limit for the watcher; a memory
        limit below the attempt's peak RSS is not applied (:class:`ResizeNotApplied`, module docstring)."""
        executor = self._get(executor_id)
        with self._lock:
            old = executor.resources
            if resources.memory_bytes < old.memory_bytes:
                used = max(executor.rss_peak, _rss_peak(executor.proc.pid))
                if resources.memory_bytes < used:
                    raise ResizeNotApplied(
                        f"{executor_id}: memory {resources.memory_bytes >> 20} MiB is below the {used >> 20} MiB "
                        f"its running attempt already used: not applied in place (it would be killed); it keeps "
                        f"{old.memory_bytes >> 20} MiB"
                    )
            cores = self._place(resources, ())
            try:
                os.sched_setaffinity(executor.proc.pid, cores)
            except ProcessLookupError:
                raise PoolError(f"{executor_id} is not running: cannot resize it") from None
            executor.resized_from = lowered_from(executor.resized_from, old, resources)
            executor.resources, executor.cores = resources, cores
        log.info("%s: resized to %s cores, %d MiB", executor_id, resources.cpu, resources.memory_bytes >> 20)

    def status(self) -> list[ExecutorStatus]:
        with self._lock:
            return [self._status(e) for e in sorted(self._executors.values(), key=lambda e: e.index)]

    def executor(self, executor_id: str) -> ExecutorStatus:
        with self._lock:
            return self._status(self._get(executor_id))

    def pid(self, executor_id: str) -> int:
        """The OS process id of the executor's current attempt (fault injection, accounting)."""
        return self._get(executor_id).proc.pid

    def send_signal(self, executor_id: str, sig: int) -> None:
        """Send ``sig`` to the process of the executor's current attempt; nothing once it has exited.
        Its exit, if the signal ends it, is seen by the watcher like any other (SIGKILL: ``failed``)."""
        executor = self._get(executor_id)
        if executor.exit_code is None:
            _signal(executor.proc, sig)

    def cpu_seconds(self, include_startup: bool = True) -> float:
        """CPU seconds (user + system) used by every attempt of every executor so far, live ones read
        now; without ``include_startup``, only what each attempt used after it was ready (an executor
        without a ``ready`` callable is ready at once: its start-up counts as work)."""
        with self._lock:
            counts = [
                (e.proc if e.exit_code is None else None, e.cpu_s_done, e.cpu_s_now, e.cpu_s_startup)
                for e in self._executors.values()
            ]
        total = 0.0
        for live, done, now, startup in counts:
            if live is not None:  # read now: fresher than the watcher's last sample
                now = max(now, _cpu_of(live))
            total += done + now - (0.0 if include_startup else startup)
        return total

    def close(self, grace_s: float = 10.0) -> None:
        """Stop every executor (SIGTERM, SIGKILL after ``grace_s``), stop the watcher; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live = [e for e in self._executors.values() if e.exit_code is None]
            for executor in live:
                executor.stop_requested = True
        for executor in live:
            _signal(executor.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for executor in live:
            if not self._wait_exit(executor, max(0.0, deadline - time.monotonic())):
                _signal(executor.proc, signal.SIGKILL)
                self._wait_exit(executor, 5.0)
        self._stop.set()
        self._watcher.join(timeout=5)
        for executor in self._executors.values():
            if executor.proc.stdout:
                executor.proc.stdout.close()
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- starting
    def _place(self, resources: Resources, avoid_nodes: Sequence[str]) -> list[int]:
        usable = [c for c in self.cpus if f"cpu{c}" not in avoid_nodes]
        if not usable:
            raise PoolError(f"{self.role} pool: every node is blacklisted ({sorted(avoid_nodes)})")
        want = min(len(usable), max(1, math.ceil(resources.cpu)))
        first = self._next_core % len(usable)
        self._next_core += 1
        return sorted(usable[(first + i) % len(usable)] for i in range(want))

    def _start(self, executor_id: str, index: int, attempt: int, resources: Resources, cores: list[int]) -> _Executor:
        log_path = self.log_dir / f"{executor_id}.{attempt}.log"
        threads = str(len(cores))
        env = {name: threads for name in _THREAD_ENV}
        with open(log_path, "w") as stderr:  # the child keeps its own descriptor
            request = LaunchRequest(executor_id, index, attempt, resources, env, stderr)
            proc = self.launcher(request)
        with contextlib.suppress(ProcessLookupError):  # exited at once: the watcher reports it
            os.sched_setaffinity(proc.pid, cores)
        executor = _Executor(executor_id, index, resources, cores, proc, log_path, attempt=attempt)
        self._executors[executor_id] = executor
        log.info("%s: started pid %d on cores %s (attempt %d)", executor_id, proc.pid, cores, attempt)
        return executor

    def _await_ready(self, executor: _Executor) -> None:
        if self.ready is None:
            with self._lock:
                if executor.state == "starting":
                    executor.state = "running"
            return
        try:
            address = self.ready(executor.proc)
        except Exception as exc:
            error = f"{executor.executor_id} did not start: {exc}; {self._tail(executor)}"
            with self._lock:
                executor.last_error = error
            raise PoolError(error) from None
        startup = _cpu_of(executor.proc)  # what it used until it announced its address
        with self._lock:
            executor.address = address
            executor.cpu_s_startup += startup
            if executor.state == "starting":
                executor.state = "running"

    # ----------------------------------------------------------------- watching
    def _watch(self) -> None:
        while not self._stop.wait(self.watch_interval_s):
            with self._lock:
                live = [e for e in self._executors.values() if e.exit_code is None]
            for executor in live:
                self._check(executor)

    def _check(self, executor: _Executor) -> None:
        if self._reap(executor):
            return
        try:
            proc = psutil.Process(executor.proc.pid)
            rss = proc.memory_info().rss
            times = proc.cpu_times()
        except (psutil.Error, OSError):
            return
        peak = max(rss, _rss_peak(executor.proc.pid))
        with self._lock:
            executor.cpu_s_now = times.user + times.system
            executor.rss_peak = max(executor.rss_peak, peak)
            over = rss > executor.resources.memory_bytes and not executor.stop_requested
            lowered = executor.resized_from
            if over:
                executor.oom = True
                executor.last_error = (
                    f"{executor.executor_id}: RSS {rss >> 20} MiB above its memory allocation "
                    f"{executor.resources.memory_bytes >> 20} MiB: killed"
                ) + (f" (a resize had lowered it from {lowered.memory_bytes >> 20} MiB)" if lowered else "")
        if over:
            # A kill below what a resize lowered: the supervisor's warning names the resize.
            log.log(logging.INFO if lowered else logging.WARNING, "%s", executor.last_error)
            _signal(executor.proc, signal.SIGKILL)

    def _reap(self, executor: _Executor) -> bool:
        """Collect an exited process (its CPU time too); True when it has exited."""
        try:
            pid, status, usage = os.wait4(executor.proc.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere (Popen.poll in a readiness wait)
            code = executor.proc.returncode
            if code is None:
                return False
            self._finish(executor, code, None)
            return True
        if not pid:
            return False
        code = os.waitstatus_to_exitcode(status)
        executor.proc.returncode = code
        self._finish(executor, code, usage.ru_utime + usage.ru_stime)
        return True

    def _finish(self, executor: _Executor, code: int, cpu_s: float | None) -> None:
        with self._lock:
            executor.exit_code = code
            if cpu_s is not None:
                executor.cpu_s_now = cpu_s
            if executor.oom:
                executor.state = "oom_killed"
            elif executor.stop_requested:
                executor.state = "stopped"
            elif code == 0:
                executor.state = "succeeded"
            else:
                executor.state = "failed"
                executor.last_error = f"{executor.executor_id} exited with code {code}: {self._tail(executor)}"
        if executor.state == "failed":  # an OOM kill was logged when the watcher killed it
            log.warning("%s", executor.last_error)

    def _wait_exit(self, executor: _Executor, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._reap(executor):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def _terminate(self, executor: _Executor, grace_s: float) -> None:
        if executor.exit_code is not None:
            return
        _signal(executor.proc, signal.SIGTERM)
        if not self._wait_exit(executor, grace_s):
            _signal(executor.proc, signal.SIGKILL)
            self._wait_exit(executor, 5.0)

    # ----------------------------------------------------------------- helpers
    def _get(self, executor_id: str) -> _Executor:
        with self._lock:
            try:
                return self._executors[executor_id]
            except KeyError:
                raise PoolError(f"no executor {executor_id!r} in the {self.role} pool") from None

    def _status(self, executor: _Executor) -> ExecutorStatus:
        return ExecutorStatus(
            executor_id=executor.executor_id,
            role=self.role,
            state=executor.state,
            resources=executor.resources,
            attempt=executor.attempt,
            node=f"cpu{executor.cores[0]}",
            address=executor.address,
            exit_code=executor.exit_code,
            last_error=executor.last_error,
            labels={"pid": str(executor.proc.pid)},
            rss_peak_bytes=executor.rss_peak,
            resized_from=executor.resized_from,
        )

    @staticmethod
    def _tail(executor: _Executor, lines: int = 5) -> str:
        try:
            text = executor.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) if text else "(empty log)"


def _signal(proc: subprocess.Popen[str], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, sig)


def _sweep_log_dirs_of_dead_pools() -> None:
    """Remove the pools' own log directories in the temp directory whose process is gone (killed
    before its pool's close could)."""
    root = Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            match = _OWN_LOG_DIR.match(entry.name)
            if match and entry.is_dir() and not psutil.pid_exists(int(match.group(1))):
                shutil.rmtree(entry, ignore_errors=True)


def _rss_peak(pid: int) -> int:
    """The kernel's RSS high-water mark of a live process (``VmHWM``), bytes; 0 where unknown."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) << 10  # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _cpu_of(proc: subprocess.Popen[str]) -> float:
    """User + system CPU seconds of a live process (0.0 once it is gone)."""
    try:
        times = psutil.Process(proc.pid).cpu_times()
    except (psutil.Error, OSError):
        return 0.0
    return times.user + times.system

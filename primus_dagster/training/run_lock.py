"""One run per run key: an exclusive lock held for the whole of a window run.

Two processes that train the same run key into the same MLflow store would share one MLflow run:
both resume it, both log loss points, checkpoints and a model into it. :class:`RunLock` keeps the
second one out. It is an exclusive ``fcntl.flock`` on a lock file under the project home,
``<PRIMUS_HOME>/locks/<sha256 of tracking URI, experiment and run key>.lock``, which holds the
holder's identity (pid, host, when it started, the MLflow run id once opened) as JSON. A second
:meth:`RunLock.acquire` fails at once with :class:`RunInProgressError` naming that holder.

The kernel releases a ``flock`` when its holder's last descriptor closes, so a holder killed by
SIGKILL never blocks the run that resumes it. The descriptor is closed on ``exec`` and in children
forked from the holder (``os.register_at_fork``), so an orphaned child does not keep the lock
either; the rank processes of a rank group are spawned, never holders. A holder that releases
removes the lock file; an acquirer that locked a file removed meanwhile opens the new one.

Scope: the processes of one machine that share a ``PRIMUS_HOME``. An MLflow tag cannot guard
runs on other machines: MLflow has no compare-and-set on tags, so two hosts would both "win".
Across machines the orchestrator serialises runs (the training asset's concurrency pool).

Example::

    with RunLock(request.key(), tracker.tracking_uri, tracker.experiment) as lock:
        tracker.start(request.key(), params)
        lock.record_run(tracker.require_run_id())
        ...  # train
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

from primus_dagster.paths import primus_home
from primus_dagster.spec import redact_text

log = logging.getLogger(__name__)

#: How often :meth:`RunLock.acquire` reopens a lock file that its releasing holder removed meanwhile.
_OPEN_ATTEMPTS = 20

_HELD_FDS: set[int] = set()  # lock descriptors held by this process (closed in forked children)


def _close_in_child() -> None:
    """A forked child does not hold its parent's run locks (the parent's death must release them)."""
    for fd in list(_HELD_FDS):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD_FDS.clear()


os.register_at_fork(after_in_child=_close_in_child)


class RunInProgressError(RuntimeError):
    """Another process holds the lock of the run key: it is training that run now."""


@dataclass(frozen=True)
class LockHolder:
    """Who holds a run lock, as its lock file says."""

    pid: int
    host: str
    started: str  # ISO 8601, UTC
    run_key: str
    mlflow_run_id: str | None = None

    @classmethod
    def parse(cls, text: str) -> LockHolder | None:
        """The holder in a lock file's text; None when it is empty or torn (being written)."""
        try:
            data = json.loads(text)
            run_id = data.get("mlflow_run_id")
            return cls(int(data["pid"]), str(data["host"]), str(data["started"]), str(data["run_key"]), run_id)
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        """``pid 1234 on host h, started 2026-11-02T00:00:00+00:00, MLflow run abc``."""
        run = f"MLflow run {self.mlflow_run_id}" if self.mlflow_run_id else "its MLflow run not opened yet"
        return f"pid {self.pid} on host {self.host}, started {self.started}, {run}"


def lock_path(run_key: str, tracking_uri: str, experiment: str) -> Path:
    """The lock file of ``run_key`` in the MLflow store ``tracking_uri`` / ``experiment``."""
    digest = hashlib.sha256(f"{tracking_uri}\n{experiment}\n{run_key}".encode()).hexdigest()[:32]
    return primus_home() / "locks" / f"{digest}.lock"


class RunLock:
    """The exclusive lock of one run key (module docstring); a context manager that acquires on
    entry and releases on exit, whatever ends the block (an exception, ``KeyboardInterrupt``).

    Example::

        with RunLock("ctr/2026-11-01T00/2026-11-02T00", "sqlite:///mlflow.db", "primus") as lock:
            lock.record_run("abc123")
    """

    def __init__(self, run_key: str, tracking_uri: str, experiment: str) -> None:
        self.run_key, self.tracking_uri, self.experiment = run_key, tracking_uri, experiment
        self.path = lock_path(run_key, tracking_uri, experiment)
        self._fd: int | None = None
        self._owner = 0  # the pid that took it: a forked copy of this object holds nothing
        self._identity: dict[str, Any] = {}

    @property
    def held(self) -> bool:
        """Whether this process holds the lock through this object."""
        return self._fd is not None and self._owner == os.getpid()

    def acquire(self) -> RunLock:
        """Take the lock, without waiting; :class:`RunInProgressError` naming the holder when another
        process has it (or another :class:`RunLock` of this process)."""
        if self.held:
            raise RuntimeError(f"run lock of {self.run_key!r} ({self.path}): already held by this RunLock")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(_OPEN_ATTEMPTS):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = LockHolder.parse(_read(fd))
                os.close(fd)
                raise RunInProgressError(self._refusal(holder)) from None
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, self.path):
                self._fd, self._owner = fd, os.getpid()
                _HELD_FDS.add(fd)
                break
            os.close(fd)  # its holder released and removed it between our open and flock: open the new one
        else:
            raise RunInProgressError(
                f"run {self.run_key!r}: the lock file {self.path} was replaced {_OPEN_ATTEMPTS} times while "
                "taking it: other runs of this key are starting and stopping; try again"
            )
        self._identity = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "run_key": self.run_key,
            "tracking_uri": redact_text(self.tracking_uri),
            "experiment": self.experiment,
        }
        self._write()
        log.info("run %s: lock taken (%s)", self.run_key, self.path)
        return self

    def record_run(self, mlflow_run_id: str) -> None:
        """Name the MLflow run this holder opened in the lock file (a refused run's message shows it)."""
        self._identity["mlflow_run_id"] = mlflow_run_id
        self._write()

    def release(self) -> None:
        """Remove the lock file and drop the lock; a no-op when not held (or in a child forked from the
        holder, whose copy of the descriptor was closed at the fork)."""
        fd, self._fd = self._fd, None
        if fd is None or self._owner != os.getpid():
            return
        _HELD_FDS.discard(fd)
        try:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()  # while still locked: an acquirer that opened it sees it replaced
        finally:
            os.close(fd)

    def _write(self) -> None:
        if not self.held or self._fd is None:
            raise RuntimeError(f"run lock of {self.run_key!r} ({self.path}): not held by this process")
        data = json.dumps(self._identity).encode()
        os.pwrite(self._fd, data, 0)  # overwrite then cut: a reader never sees an empty file after the first write
        os.ftruncate(self._fd, len(data))

    def _refusal(self, holder: LockHolder | None) -> str:
        who = holder.describe() if holder is not None else "a process that has not written its identity yet"
        return (
            f"run {self.run_key!r} (MLflow {redact_text(self.tracking_uri)}, experiment {self.experiment!r}) is already being "
            f"trained by {who}; a second run of one key would train into the same MLflow run. Wait for it to end, "
            f"or stop it (a stopped or killed run resumes when started again). Lock file: {self.path}"
        )

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _read(fd: int) -> str:
    """A lock file's text (its holder's identity), read through ``fd``."""
    with contextlib.suppress(OSError):
        return os.pread(fd, 4096, 0).decode(errors="replace")
    return ""


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path`` (not one its holder removed)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)

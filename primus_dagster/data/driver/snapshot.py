"""Driver snapshots: building, restoring, and atomic JSON files (restore rules: :mod:`.state`).

Example::

    save_snapshot("ckpt/data_driver.json", driver.snapshot())
    driver = DataDriver.restore(read_snapshot("ckpt/data_driver.json"))
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from primus_dagster.data.driver.records import SNAPSHOT_FORMAT, TaskRecord


def save_snapshot(path: str | os.PathLike[str], snapshot: dict[str, Any]) -> Path:
    """Atomically write a snapshot as JSON: a temp file in the same folder, fsync, ``os.replace``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(snapshot, fh, separators=(",", ":"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The snapshot dict stored at ``path``."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a data driver snapshot (a JSON {type(data).__name__})")
    return data


class SnapshotMixin:
    """Snapshot methods of :class:`~.state.DataDriver` (kept here to keep the state machine short)."""

    def _snapshot_locked(self, barrier_id: int | None) -> dict[str, Any]:
        return {
            "format": SNAPSHOT_FORMAT,
            "barrier_id": barrier_id,
            "source_versions": json.loads(json.dumps(self.source_versions)),
            "config": {
                "max_attempts": self.max_attempts,
                "failed_task_threshold": self.failed_task_threshold,
                "lease_s": self.lease_s,
                "trainers": self.trainers,
            },
            "tasks": [rec.to_snapshot() for rec in self._tasks.values()],
        }

    def snapshot(self) -> dict[str, Any]:
        """JSON-serialisable state: tasks (payload, state, attempts, failures, error, rows, batches,
        consumed first_rows), source versions, config and the last barrier id."""
        with self._lock:
            return self._snapshot_locked(self._barriers.last)

    def save(self, path: str | os.PathLike[str], snapshot: dict[str, Any] | None = None) -> Path:
        """Write ``snapshot`` (default: a fresh one) atomically (temp file + ``os.replace``)."""
        return save_snapshot(path, self.snapshot() if snapshot is None else snapshot)

    @classmethod
    def restore(cls, snapshot: dict[str, Any], **kwargs: Any) -> Any:
        """A driver in the state of ``snapshot`` (see the module docstring); ``kwargs`` override its config."""
        if snapshot.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(
                f"not a data driver snapshot (format {snapshot.get('format')!r}, expected {SNAPSHOT_FORMAT!r})"
            )
        driver = cls(**{**snapshot.get("config", {}), **kwargs})
        for entry in snapshot["tasks"]:
            driver._insert(TaskRecord.from_snapshot(entry))
        driver.source_versions = dict(snapshot.get("source_versions") or {})
        barrier_id = snapshot.get("barrier_id")
        driver._barriers.keep(barrier_id, snapshot if barrier_id is not None else None)
        return driver

    @classmethod
    def load(cls, path: str | os.PathLike[str], **kwargs: Any) -> Any:
        """:meth:`restore` from a file written by :meth:`save`."""
        return cls.restore(read_snapshot(path), **kwargs)

"""Barrier bookkeeping of the driver: which trainers reported the open barrier, and the snapshot
kept for the last completed one (compressed: a 4 M task snapshot is GBs as Python dicts).

Example::

    barriers = BarrierTracker()
    assert not barriers.arrive("t0", 1, trainers=2)
    assert barriers.arrive("t1", 1, trainers=2)   # complete: take the snapshot now
    barriers.keep(1, snapshot)
    assert barriers.get() == snapshot and barriers.last == 1
"""

from __future__ import annotations

import json
import zlib
from typing import Any


class BarrierTracker:
    """One open barrier at a time; barrier ids only move forward."""

    def __init__(self) -> None:
        self.open: int | None = None
        self.arrived: set[str] = set()
        self.last: int | None = None
        self._blob: bytes | None = None

    def arrive(self, trainer_id: str, barrier_id: int, trainers: int) -> bool:
        """Record ``trainer_id`` at ``barrier_id``; True when all ``trainers`` have now arrived
        (the caller then takes the snapshot and :meth:`keep` s it). Not for the last barrier."""
        if self.last is not None and barrier_id <= self.last:
            raise ValueError(f"barrier {barrier_id} from {trainer_id} is not newer than the last barrier {self.last}")
        if self.open is None:
            self.open, self.arrived = barrier_id, set()
        elif barrier_id != self.open:
            raise ValueError(
                f"barrier {barrier_id} from {trainer_id} while barrier {self.open} is still "
                f"waiting for {trainers - len(self.arrived)} trainer(s)"
            )
        self.arrived.add(trainer_id)
        return len(self.arrived) >= trainers

    def keep(self, barrier_id: int | None, snapshot: dict[str, Any] | None) -> None:
        """Mark ``barrier_id`` completed with ``snapshot`` (also used by restore)."""
        self.open, self.arrived, self.last = None, set(), barrier_id
        self._blob = None if snapshot is None else zlib.compress(json.dumps(snapshot).encode(), 1)

    def get(self) -> dict[str, Any] | None:
        """A fresh copy of the last completed barrier's snapshot (None before the first)."""
        return None if self._blob is None else json.loads(zlib.decompress(self._blob))

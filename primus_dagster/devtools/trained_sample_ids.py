"""An append-only log of the sample ids each training step consumed (tests and audits).

Each record is ``[step, n, id_0 … id_{n-1}]`` as little-endian int64, flushed per reader batch:
a SIGKILLed trainer leaves every record it finished (a torn last record is ignored on read).

Example::

    with TrainedSampleIdsLog("samples.bin") as samples:
        samples.append(trainer.step, feats.sample_id)
    for step, ids in read_trained_sample_ids("samples.bin"): ...
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


class TrainedSampleIdsLog:
    """Appends ``(step, sample ids)`` records to a file (see module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, step: int, sample_ids: Any) -> None:
        ids = np.asarray(sample_ids if sample_ids is not None else [], dtype="<i8").ravel()
        with self.path.open("ab") as file:  # one append a record: a kill tears at most the last one
            file.write(np.concatenate([np.array([step, ids.size], dtype="<i8"), ids]).tobytes())

    def close(self) -> None:
        """Nothing stays open between appends; kept for the context-manager protocol."""

    def __enter__(self) -> TrainedSampleIdsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_trained_sample_ids(path: str | Path) -> Iterator[tuple[int, np.ndarray]]:
    """The complete records of a trained-sample-ids log, in order."""
    data = np.fromfile(path, dtype="<i8")
    at = 0
    while at + 2 <= data.size:
        step, n = int(data[at]), int(data[at + 1])
        if at + 2 + n > data.size:
            break  # torn by a kill mid-write
        yield step, data[at + 2 : at + 2 + n]
        at += 2 + n

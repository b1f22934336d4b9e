"""The log of trained sample ids survives a torn last record (a SIGKILL mid-write)."""

from __future__ import annotations

import numpy as np

from primus_dagster.devtools.trained_sample_ids import TrainedSampleIdsLog, read_trained_sample_ids


def test_round_trip_and_torn_tail(tmp_path) -> None:
    path = tmp_path / "samples.bin"
    with TrainedSampleIdsLog(path) as log:
        log.append(3, np.array([10, 11, 12]))
        log.append(7, [13])
    with open(path, "ab") as f:  # half a record, as a kill mid-write leaves it
        f.write(np.array([9, 5, 1], dtype="<i8").tobytes())
    records = list(read_trained_sample_ids(path))
    assert [(s, ids.tolist()) for s, ids in records] == [(3, [10, 11, 12]), (7, [13])]

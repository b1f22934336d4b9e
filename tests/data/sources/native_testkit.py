"""Shared test data for the adapter tests: rows in the synthetic world's native schema.

Imported by the test modules of this folder (pytest puts it on sys.path).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from primus_dagster.data.sources import SourceReadError

T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)
DENSE = [f"d{i}" for i in range(13)]
SPARSE = ["user_id", "item_id", "topic_id", "device", "hour_of_day"]


def native_rows(start: datetime, n: int, first_id: int, span_s: int = 3600) -> pa.Table:
    """Rows in the synthetic world's native schema with event times in ``[start, start+span_s)``."""
    rng = np.random.default_rng(first_id)
    ts = [start + timedelta(seconds=int(s)) for s in np.sort(rng.integers(0, span_s, n))]
    cols: dict[str, pa.Array] = {
        "sample_id": pa.array(np.arange(first_id, first_id + n), pa.int64()),
        "event_time": pa.array(ts, pa.timestamp("us", tz="UTC")),
        "click": pa.array(rng.integers(0, 2, n), pa.int32()),
    }
    for name in SPARSE[:-1]:
        cols[name] = pa.array(rng.integers(0, 1000, n), pa.int64())
    cols["hour_of_day"] = pa.array([t.hour for t in ts], pa.int64())
    for name in DENSE:
        cols[name] = pa.array(rng.random(n, dtype=np.float32), pa.float32())
    return pa.table(cols)


def read_all(source, tasks: list) -> pa.Table:
    """Every canonical batch of ``tasks`` as one table."""
    return pa.Table.from_batches([b for t in tasks for b in source.read(t)])


def assert_same_rows(canonical: pa.Table, native: pa.Table) -> None:
    """The canonical rows are exactly the native rows (ids, times, labels, dense, sparse)."""
    got = canonical.sort_by("sample_id")
    want = native.sort_by("sample_id")
    assert got.column("sample_id").to_pylist() == want.column("sample_id").to_pylist()
    assert got.column("ts").to_pylist() == want.column("event_time").to_pylist()
    np.testing.assert_array_equal(got.column("label").to_numpy(), want.column("click").to_numpy().astype(np.float32))
    dense = got.column("dense").combine_chunks().flatten().to_numpy().reshape(-1, len(DENSE))
    np.testing.assert_array_equal(dense, np.stack([want.column(d).to_numpy() for d in DENSE], axis=1))
    for name in SPARSE:
        assert got.column(name).to_pylist() == want.column(name).to_pylist()


def assert_corrupt_file_fails_alone(source, partition, written: pa.Table) -> None:
    """Corrupt the second file of a two-file partition: its read names the file, the first still reads."""
    good, bad = source.split(partition)
    Path(bad.uri).write_bytes(b"PAR1" + b"\x00garbage" * 50)
    with pytest.raises(SourceReadError, match=bad.uri) as info:
        list(source.read(bad))
    assert info.value.uri == bad.uri
    rows = read_all(source, [good])
    assert rows.num_rows == good.rows
    assert set(rows.column("sample_id").to_pylist()) < set(written.column("sample_id").to_pylist())

"""join_labels (vectorised) against a reference join computed with pyarrow.Table.join."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from primus_dagster.data.graph import join_labels
from primus_dagster.data.tasks import JoinInfo

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
LATENESS = timedelta(minutes=15)
US = 1_000_000


def make_data(seed: int, n_left: int = 4000, n_right: int = 3000) -> tuple[pa.Table, pa.Table]:
    rng = np.random.default_rng(seed)
    t0 = int(T0.timestamp() * US)
    left_ts = t0 + rng.integers(0, 3600, n_left) * US
    left_key = rng.integers(0, 2500, n_left)  # repeated keys, and keys with no right row
    pick = rng.integers(0, n_left, n_right)
    # Right events near their left row: before it, inside [ts, ts + 15m], exactly on both ends, after.
    offsets = rng.choice([-60, 0, 1, 300, 899, 900, 901, 1800], n_right) * US
    right_key = np.where(rng.random(n_right) < 0.9, left_key[pick], rng.integers(5000, 6000, n_right))
    right_ts = left_ts[pick] + offsets
    left = pa.table(
        {
            "sample_id": pa.array(left_key, pa.int64()),
            "ts": pa.array(left_ts, pa.timestamp("us", tz="UTC")),
            "label": pa.array(np.full(n_left, 7.0), pa.float32()),
            "d": pa.array(rng.random(n_left), pa.float32()),
        }
    )
    right = pa.table(
        {"sample_id": pa.array(right_key, pa.int64()), "ts": pa.array(right_ts, pa.timestamp("us", tz="UTC"))}
    )
    return left, right


def reference(left: pa.Table, right: pa.Table, watermark: datetime | None) -> list[float | None]:
    """Independent: Table.join on the key, then filter right ts within [ts, ts + lateness]."""
    rows = left.select(["sample_id", "ts"]).append_column("row", pa.array(np.arange(len(left))))
    joined = rows.join(right.rename_columns(["sample_id", "r_ts"]), keys="sample_id", join_type="inner")
    upper = pc.add(joined["ts"], pa.scalar(LATENESS, pa.duration("us")))
    hit = joined.filter(pc.and_(pc.greater_equal(joined["r_ts"], joined["ts"]), pc.less_equal(joined["r_ts"], upper)))
    matched = set(hit["row"].to_pylist())
    out = []
    for i, ts in enumerate(left["ts"].to_pylist()):
        if i in matched:
            out.append(1.0)
        elif watermark is None or ts + LATENESS <= watermark:
            out.append(0.0)
        else:
            out.append(None)
    return out


@pytest.mark.parametrize("watermark", [None, T0 + timedelta(minutes=40)])
def test_join_labels_match_pyarrow_table_join(watermark: datetime | None) -> None:
    left, right = make_data(3)
    info = JoinInfo("imp", "clk", "sample_id", LATENESS.total_seconds())
    out = join_labels(left, right, info, watermark=watermark)
    expected = reference(left, right, watermark)
    assert out["label"].type == pa.float32()
    assert out["label"].to_pylist() == expected
    assert out.column_names == left.column_names and out["d"].equals(left["d"])
    labels = out["label"].to_pylist()
    assert labels.count(1.0) > 500 and labels.count(0.0) > 500
    if watermark is not None:
        assert labels.count(None) > 500


def test_join_labels_edge_cases() -> None:
    ts = pa.array([T0, T0, None, T0], pa.timestamp("ms", tz="UTC"))
    left = pa.table({"k": pa.array(["a", "b", "a", None]), "ts": ts})
    right = pa.table(
        {
            "k": pa.array(["a", "a", None, "b"]),
            "ts": pa.array([T0 + LATENESS, None, T0, T0 - timedelta(seconds=1)], pa.timestamp("us", tz="UTC")),
        }
    )
    out = join_labels(left, right, JoinInfo("l", "r", "k", LATENESS.total_seconds()))
    assert out["label"].to_pylist() == [1.0, 0.0, None, 0.0]  # end inclusive; before ts never counts
    empty = join_labels(left, right.slice(0, 0), JoinInfo("l", "r", "k", 900.0), watermark=T0)
    assert empty["label"].to_pylist() == [None, None, None, None]
    with pytest.raises(KeyError, match="right table has no column 'k'"):
        join_labels(left, right.drop_columns(["k"]), JoinInfo("l", "r", "k", 1.0))

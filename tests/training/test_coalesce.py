"""BatchCoalescer: reader batches of a kind merged into micro-batches of batch_size rows, each row once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from primus_dagster.data import Batch, BatchMeta
from primus_dagster.training.coalesce import BatchCoalescer

_next_id = iter(range(1_000_000))


def reader_batch(rows: int, kind: str = "batch", *, lists: bool = True, task: str = "") -> Batch:
    """A canonical batch of ``rows`` rows with fresh sample ids (0, 1, ... across calls), one dense
    column, one id column and (``lists``) a list feature ``hist`` whose row ``i`` holds ``i % 3`` ids
    equal to the row's sample id."""
    ids = np.array([next(_next_id) for _ in range(rows)], dtype=np.int64)
    columns = {
        "ts": pa.array(np.zeros(rows, dtype=np.int64), pa.timestamp("us", "UTC")),
        "label": pa.array((ids % 2).astype(np.float32)),
        "sample_id": pa.array(ids),
        "dense": pa.FixedSizeListArray.from_arrays(pa.array(ids.astype(np.float32)), 1),
        "user_id": pa.array(ids * 10),
    }
    if lists:
        columns["hist"] = pa.array([[int(i)] * (n % 3) for n, i in enumerate(ids)], pa.list_(pa.int64()))
    task = task or f"t{int(ids[0]) if rows else 0}"
    return Batch(pa.record_batch(columns), BatchMeta(task, 0, rows, "s", kind, "src"))


def ids_of(batch: Batch) -> list[int]:
    assert batch.sample_id is not None
    return batch.sample_id.tolist()


def test_small_batches_of_a_kind_make_full_micro_batches_in_order() -> None:
    coalescer = BatchCoalescer(4)
    batches = [reader_batch(n) for n in (3, 3, 1, 6, 2)]  # 15 rows
    out = [m for b in batches for m in coalescer.add(b)]
    assert [m.batch.rows for m in out] == [4, 4, 4]
    assert coalescer.pending_rows == 3
    out += coalescer.flush()
    assert [m.batch.rows for m in out] == [4, 4, 4, 3]
    assert [i for m in out for i in ids_of(m.batch)] == [i for b in batches for i in ids_of(b)]
    # each reader batch is finished by the micro-batch holding its last row, once
    assert [[f.batch_id for f in m.finished] for m in out] == [
        [batches[0].batch_id],
        [batches[1].batch_id, batches[2].batch_id],
        [],
        [batches[3].batch_id, batches[4].batch_id],
    ]
    assert coalescer.pending_rows == 0 and coalescer.flush() == []


def test_a_big_batch_is_cut_without_copies_and_finished_by_its_last_micro_batch() -> None:
    coalescer = BatchCoalescer(4)
    big = reader_batch(10)
    out = coalescer.add(big) + coalescer.flush()
    assert [m.batch.rows for m in out] == [4, 4, 2]
    assert [len(m.finished) for m in out] == [0, 0, 1] and out[-1].finished[0] is big
    dense = big.dense
    assert out[1].batch.dense.data_ptr() == dense[4:8].data_ptr()  # a slice of the reader batch
    assert [i for m in out for i in ids_of(m.batch)] == ids_of(big)


def test_alternating_kinds_each_fill_their_own_micro_batch() -> None:
    """mixed mode: reader batches of both kinds alternate; each kind still trains full steps of one kind."""
    coalescer = BatchCoalescer(4)
    batches = [reader_batch(3, kind) for kind in ("batch", "stream") * 4]  # 12 rows of each kind
    out = [m for b in batches for m in coalescer.add(b)]
    assert [(m.batch.kind, m.batch.rows) for m in out] == [("batch", 4), ("stream", 4)] * 3
    assert coalescer.pending_rows == 0 and coalescer.flush() == []
    for kind in ("batch", "stream"):  # each kind's rows in their order, each once
        trained = [i for m in out if m.batch.kind == kind for i in ids_of(m.batch)]
        assert trained == [i for b in batches if b.kind == kind for i in ids_of(b)]
    assert all(len({p.kind for p in m.finished}) <= 1 for m in out)


def test_flush_gives_every_open_micro_batch_in_the_order_they_opened() -> None:
    coalescer = BatchCoalescer(4)
    first, second, third = reader_batch(3, "batch"), reader_batch(2, "stream"), reader_batch(3, "stream")
    assert coalescer.add(first) == [] and coalescer.add(second) == []
    out = coalescer.add(third)
    assert [(m.batch.kind, m.batch.rows) for m in out] == [("stream", 4)]
    assert ids_of(out[0].batch) == ids_of(second) + ids_of(third)[:2]
    assert coalescer.pending_rows == 3 + 1
    out += coalescer.flush()
    assert [(m.batch.kind, m.batch.rows) for m in out] == [("stream", 4), ("batch", 3), ("stream", 1)]
    assert [[f.batch_id for f in m.finished] for m in out] == [[second.batch_id], [first.batch_id], [third.batch_id]]


def test_other_columns_get_their_own_micro_batch() -> None:
    coalescer = BatchCoalescer(8)
    with_lists, without = reader_batch(3), reader_batch(3, lists=False)
    out = coalescer.add(with_lists) + coalescer.add(without) + coalescer.flush()
    assert [m.batch.rows for m in out] == [3, 3]
    assert out[0].batch.list_names == ["hist"] and out[1].batch.list_names == []


def test_merged_list_features_keep_each_rows_values() -> None:
    coalescer = BatchCoalescer(5)
    parts = [reader_batch(n) for n in (2, 4, 1)]
    sliced = parts[1].slice(1, 4)  # a list column with a non-zero offset
    out = coalescer.add(parts[0]) + coalescer.add(sliced) + coalescer.add(parts[2]) + coalescer.flush()
    assert [m.batch.rows for m in out] == [5, 1]
    merged = Batch.concat([m.batch for m in out])
    expected = [row for b in (parts[0], sliced, parts[2]) for row in b.columns.column("hist").to_pylist()]
    jagged = merged.lists["hist"]
    rows = [jagged.values[jagged.offsets[i] : jagged.offsets[i + 1]].tolist() for i in range(merged.rows)]
    assert rows == expected and any(rows)
    assert torch.equal(merged.sparse[:, 0], merged.sample_id * 10)  # ids stay with their rows


def test_a_batch_without_rows_is_passed_over_and_the_size_must_be_positive() -> None:
    coalescer = BatchCoalescer(4)
    assert coalescer.add(reader_batch(0)) == [] and coalescer.flush() == []
    with pytest.raises(ValueError, match="at least 1"):
        BatchCoalescer(0)

"""The canonical normaliser: types, dense stacking, ms timestamps, clear mismatch errors, the data-quality policy."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primus_dagster.data.canonical import (
    DataQualityError,
    Normalizer,
    SchemaMismatchError,
    canonical_schema,
    is_permanent,
    quality_summary,
    schema_hash,
)
from primus_dagster.data.hashing import stable_hash64
from primus_dagster.data.sources import SourceReadError
from primus_dagster.spec import parse_job_spec


def source(columns: str, entry: str = "type: kafka, kind: stream, topic: t"):
    return parse_job_spec(f"""
name: t
dataset:
  start: 2026-11-01
  streams:
    - name: s
      sources:
        - {{name: src, {entry}, columns: {columns}}}
""").dataset.source("src")


def test_dense_columns_are_stacked_and_ids_cast() -> None:
    norm = Normalizer(source("{ts: t, label: y, id: i, dense: [a, b], sparse: {user: u}}"))
    batch = pa.record_batch(
        {
            "t": pa.array([1_700_000_000_000, 1_700_000_000_500], pa.int64()),  # epoch ms
            "y": pa.array([1, None], pa.int8()),
            "i": pa.array([5, 6], pa.int32()),
            "a": pa.array([1.0, 2.0], pa.float64()),
            "b": pa.array([3, 4], pa.int16()),
            "u": pa.array([7, 8], pa.int32()),
        }
    )
    out = norm(batch)
    assert out.schema == canonical_schema(norm.mapping, 2)
    assert out.schema.names == ["sample_id", "ts", "label", "dense", "user", "source", "kind"]
    rows = out.to_pylist()
    assert rows[0]["dense"] == [1.0, 3.0] and rows[1]["dense"] == [2.0, 4.0]
    assert rows[1]["label"] == 0.0 and rows[0]["label"] == 1.0  # stream: a null label is repaired to 0
    assert norm.take() == {"null_label": 1}
    assert rows[1]["ts"].microsecond == 500_000
    assert rows[0]["source"] == "src" and rows[0]["kind"] == "stream"


def test_dense_list_column_passes_through() -> None:
    norm = Normalizer(source("{ts: t, dense: f}"))
    values = pa.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], pa.list_(pa.float64()))
    out = norm(pa.record_batch({"t": pa.array([0, 1], pa.timestamp("ms")), "f": values}))
    assert out.schema.field("dense").type == pa.list_(pa.float32(), 3)
    np.testing.assert_array_equal(out.column("dense").flatten().to_numpy(), np.arange(1, 7, dtype=np.float32))
    assert out.column("label").null_count == 2


def test_ragged_dense_lists_are_rejected() -> None:
    norm = Normalizer(source("{ts: t, dense: f}"))
    batch = pa.record_batch({"t": pa.array([0, 1], pa.int64()), "f": pa.array([[1.0, 2.0], [3.0]])})
    with pytest.raises(SchemaMismatchError, match="not all of length"):
        norm(batch, where="file.parquet")


def test_missing_column_names_where_and_what() -> None:
    norm = Normalizer(source("{ts: t, dense: [a]}"))
    with pytest.raises(SchemaMismatchError, match=r"f\.parquet: column 'a' is missing"):
        norm(pa.record_batch({"t": pa.array([0], pa.int64())}), where="f.parquet")


def test_non_numeric_feature_is_rejected() -> None:
    norm = Normalizer(source("{ts: t, dense: [a]}"))
    with pytest.raises(SchemaMismatchError, match="dense column 'a' has type string"):
        norm(pa.record_batch({"t": pa.array([0], pa.int64()), "a": pa.array(["x"])}))


def test_a_string_label_maps_through_label_positive_and_is_refused_without_it() -> None:
    batch = pa.record_batch(
        {"t": pa.array([0, 1, 2], pa.int64()), "y": pa.array([" >50K", "<=50K", None]), "a": pa.array([1.0] * 3)}
    )
    plain = Normalizer(source("{ts: t, label: y, dense: [a]}"))
    with pytest.raises(
        SchemaMismatchError,
        match=r"label column 'y' has type string \(values such as \['>50K', '<=50K'\]\).*label_positive: '<that value>'",
    ):
        plain(batch, where="adult.parquet")
    norm = Normalizer(source("{ts: t, label: y, label_positive: '>50K', dense: [a]}"))
    assert norm(batch).column("label").to_pylist() == [1.0, 0.0, 0.0]  # the stream's null: repaired to 0
    assert norm.take() == {"null_label": 1}
    with pytest.raises(SchemaMismatchError, match="label_positive maps string labels: drop it"):
        norm(pa.record_batch({"t": pa.array([0], pa.int64()), "y": pa.array([1]), "a": pa.array([1.0])}))
    with pytest.raises(Exception, match="label_positive names the positive value of the label column"):
        source("{ts: t, label_positive: 'yes', dense: [a]}")
    with pytest.raises(Exception, match="label_positive must be the label's text, got True: quote it"):
        source("{ts: t, label: y, label_positive: yes, dense: [a]}")


def test_schema_hash_is_stable_and_type_sensitive() -> None:
    a = pa.schema([("x", pa.int64())])
    assert schema_hash(a) == schema_hash(pa.schema([("x", pa.int64())]))
    assert schema_hash(a) != schema_hash(pa.schema([("x", pa.int32())]))


# -- data quality: every rule counted per reason, whatever the action ------------------------------------------

T0 = datetime(2026, 11, 1, 5, tzinfo=timezone.utc)
T0_MS = int(T0.timestamp() * 1000)
ROWS = 6  # row i of `bad_batch` breaks one rule: 0 clean, 1 dense NaN, 2 dense +inf, 3 null label, 4 ts next hour, 5 bad id


def parquet_source(quality: str = "{}", kind: str = "batch"):
    columns = "{ts: t, label: y, id: i, dense: [a, b], sparse: [u]}"
    return source(columns, f"type: parquet, kind: {kind}, path: p, quality: {quality}")


def bad_batch() -> pa.RecordBatch:
    return pa.record_batch(
        {
            "t": pa.array([T0_MS, T0_MS, T0_MS, T0_MS, T0_MS + 3_600_000, T0_MS], pa.int64()),
            "y": pa.array([1, 0, 1, None, 0, 1], pa.float64()),
            "i": pa.array([0, 1, 2, 3, 4, 5], pa.int64()),
            "a": pa.array([1.0, np.nan, 1.0, 1.0, 1.0, 1.0], pa.float64()),
            "b": pa.array([2.0, 2.0, np.inf, 2.0, 2.0, 2.0], pa.float64()),
            "u": pa.array([7.0, 7.0, 7.0, 7.0, 7.0, 7.5], pa.float64()),  # 7.5 is no id
        }
    )


EVERY_RULE = {"dense_invalid": 2, "null_label": 1, "ts_outside_partition": 1, "bad_id": 1}


def test_default_policy_repairs_or_drops_and_counts_every_rule() -> None:
    norm = Normalizer(parquet_source())
    out = norm(bad_batch(), where="f.parquet", partition=T0)
    assert norm.take() == EVERY_RULE and norm.take() == {}  # take() resets
    # batch source: the null label is dropped; the rest is repaired (the out-of-partition row is kept as read)
    rows = {r["sample_id"]: r for r in out.to_pylist()}
    assert sorted(rows) == [0, 1, 2, 4, 5]
    # repaired dense values are missing (NaN): the model's transform fills them
    assert math.isnan(rows[1]["dense"][0]) and rows[1]["dense"][1] == 2.0
    assert rows[2]["dense"][0] == 1.0 and math.isnan(rows[2]["dense"][1])
    assert rows[5]["u"] == 0 and rows[4]["ts"] == T0 + timedelta(hours=1)


@pytest.mark.parametrize("rule, rows", list(EVERY_RULE.items()))
def test_drop_removes_the_rows_of_a_rule_and_counts_them(rule: str, rows: int) -> None:
    policy = "{null_label: drop}" if rule == "null_label" else f"{{{rule}: drop, null_label: repair}}"
    norm = Normalizer(parquet_source(policy))
    out = norm(bad_batch(), where="f.parquet", partition=T0)
    assert norm.take() == EVERY_RULE
    assert out.num_rows == ROWS - rows


@pytest.mark.parametrize(
    "rule, column",
    [("dense_invalid", "a"), ("null_label", "y"), ("ts_outside_partition", "t"), ("bad_id", "u")],
)
def test_fail_names_file_column_and_rule(rule: str, column: str) -> None:
    norm = Normalizer(parquet_source(f"{{{rule}: fail}}"))
    with pytest.raises(
        DataQualityError, match=rf"f\.parquet: column '{column}': .*rule {rule}.*quality\.{rule} is 'fail'"
    ):
        norm(bad_batch(), where="f.parquet", partition=T0)
    try:
        norm(bad_batch(), where="f.parquet", partition=T0)
    except DataQualityError as exc:
        assert (exc.rule, exc.column) == (rule, column) and is_permanent(exc)


def test_repair_everything_keeps_every_row() -> None:
    norm = Normalizer(parquet_source("{null_label: repair}"))
    out = norm(bad_batch(), where="f.parquet", partition=T0)
    assert out.num_rows == ROWS and out.column("label").to_pylist()[3] == 0.0
    dense = out.column("dense").flatten().to_numpy()
    assert not np.isinf(dense).any() and np.isnan(dense).sum() == 2  # the two repaired values: missing


def test_null_ts_is_dropped_by_default_or_repaired_to_the_partition_start() -> None:
    batch = pa.record_batch(
        {
            "t": pa.array([T0_MS, None], pa.int64()),
            "y": pa.array([1.0, 0.0]),
            "i": pa.array([1, 2]),
            "a": pa.array([1.0, 1.0]),
            "b": pa.array([1.0, 1.0]),
            "u": pa.array([1, 2]),
        }
    )
    norm = Normalizer(parquet_source())
    assert norm(batch, partition=T0).num_rows == 1 and norm.take() == {"null_ts": 1}
    repair = Normalizer(parquet_source("{null_ts: repair}"))
    assert repair(batch, partition=T0).column("ts").to_pylist() == [T0, T0] and repair.take() == {"null_ts": 1}


def test_stream_null_label_is_repaired_and_no_partition_means_no_event_time_check() -> None:
    norm = Normalizer(parquet_source(kind="stream"))
    out = norm(bad_batch())  # a live tail: no partition
    assert out.num_rows == ROWS and norm.take() == {"dense_invalid": 2, "null_label": 1, "bad_id": 1}


def test_ids_that_do_not_convert() -> None:
    norm = Normalizer(source("{ts: t, id: i, dense: [a], sparse: [u, v]}"))
    batch = pa.record_batch(
        {
            "t": pa.array([0, 0, 0, 0], pa.int64()),
            "i": pa.array([1, 2**63, 3, 4], pa.uint64()),  # 2**63 does not fit int64
            "a": pa.array([1.0] * 4),
            "u": pa.array([1.0, np.nan, 1e30, -2.0]),
            "v": pa.array([1, 2, 3, 4], pa.int8()),
        }
    )
    out = norm(batch)
    assert norm.take() == {"bad_id": 2}  # rows 1 (id and u) and 2 (u): one count per row and rule
    assert out.column("sample_id").to_pylist() == [1, None, 3, 4]  # a sample id is repaired to null
    assert out.column("u").to_pylist() == [1, 0, 0, -2]  # a sparse id to 0


def test_kafka_nulls_are_missing_fields() -> None:
    norm = Normalizer(source("{ts: t, label: y, id: i, dense: [a, b], sparse: [u]}"))
    batch = pa.record_batch(
        {
            "t": pa.array([0, 0, 0], pa.int64()),
            "y": pa.array([1.0, None, 0.0]),
            "i": pa.array([1, None, 3]),
            "a": pa.array([1.0, None, np.inf]),
            "b": pa.array([1.0, 2.0, 3.0]),
            "u": pa.array([None, 1, 2]),
        }
    )
    out = norm(batch)
    assert norm.take() == {"missing_field": 2, "null_label": 1, "dense_invalid": 1}
    assert out.column("u").to_pylist() == [0, 1, 2] and out.column("sample_id").to_pylist() == [1, None, 3]
    drop = Normalizer(source("{ts: t, label: y, id: i, dense: [a, b], sparse: [u]}, quality: {missing_field: drop}"))
    assert drop(batch).column("sample_id").to_pylist() == [3]


def test_type_errors_are_permanent() -> None:
    norm = Normalizer(source("{ts: t, dense: [a], sparse: [u]}"))
    with pytest.raises(SchemaMismatchError, match="sparse column 'u' has type list<item: int64>") as info:
        norm(pa.record_batch({"t": pa.array([0]), "a": pa.array([1.0]), "u": pa.array([[1]])}), where="f.parquet")
    assert is_permanent(info.value) and not is_permanent(OSError("connection reset"))
    try:
        raise SourceReadError("t:0", "wrapped") from info.value  # as the Kafka adapter reports it
    except SourceReadError as wrapped:
        assert is_permanent(wrapped)


def test_quality_summary_names_the_action_and_the_repair() -> None:
    line = quality_summary(parquet_source(), {"dense_invalid": 1200, "null_label": 3})
    assert (
        line
        == "src: 1,200 rows dense_invalid (repaired: NaN, +-inf or null dense values -> missing, the feature's fill "
        "(training.features)), 3 rows null_label (dropped)"
    )


@settings(max_examples=40, deadline=None)
@given(
    dense=st.lists(
        st.tuples(st.floats(width=32) | st.none(), st.floats(width=32) | st.none()), min_size=1, max_size=40
    ),
    action=st.sampled_from(["repair", "drop"]),
)
def test_dense_counts_match_a_row_by_row_reference(dense: list[tuple[float | None, float | None]], action: str) -> None:
    def bad(x: float | None) -> bool:
        return x is None or not np.isfinite(x)

    expected = sum(bad(a) or bad(b) for a, b in dense)
    n = len(dense)
    batch = pa.record_batch(
        {
            "t": pa.array([T0_MS] * n, pa.int64()),
            "y": pa.array([1.0] * n),
            "i": pa.array(range(n)),
            "a": pa.array([a for a, _ in dense], pa.float32()),
            "b": pa.array([b for _, b in dense], pa.float32()),
            "u": pa.array([1] * n),
        }
    )
    norm = Normalizer(parquet_source(f"{{dense_invalid: {action}}}"))
    out = norm(batch, partition=T0)
    assert norm.take() == ({"dense_invalid": expected} if expected else {})
    assert out.num_rows == (n - expected if action == "drop" else n)
    values = out.column("dense").flatten().to_numpy()
    assert not np.isinf(values).any()  # +-inf repaired to missing (NaN), which the model's transform fills
    if action == "drop":
        assert not np.isnan(values).any()


def test_fail_on_null_ts_and_on_a_missing_kafka_field() -> None:
    rows = {"t": pa.array([0, None], pa.int64()), "y": pa.array([1.0, 0.0]), "a": pa.array([1.0, None])}
    with pytest.raises(DataQualityError, match=r"k\.json: column 't': 1 of 2 rows break the data-quality rule null_ts"):
        Normalizer(parquet_source("{null_ts: fail}"))(
            pa.record_batch({**rows, "i": pa.array([1, 2]), "b": pa.array([1.0, 1.0]), "u": pa.array([1, 2])}),
            where="k.json",
        )
    kafka = source("{ts: t, label: y, dense: [a]}, quality: {missing_field: fail}")
    with pytest.raises(DataQualityError, match=r"t:0@5-6: column 'a': .*missing_field"):
        Normalizer(kafka)(pa.record_batch({**rows, "t": pa.array([0, 0], pa.int64())}), where="t:0@5-6")


def epoch_source(unit: str | None) -> object:
    declared = f", ts_unit: {unit}" if unit else ""
    return source(f"{{ts: t, label: y, dense: [a]{declared}}}", "type: parquet, kind: batch, path: p")


def epoch_batch(scale: int) -> pa.RecordBatch:
    """Ten rows inside the partition starting at T0, their times as integer epochs of ``1 / scale`` s."""
    seconds = [int((T0 + timedelta(minutes=5 * i)).timestamp()) for i in range(10)]
    return pa.record_batch(
        {
            "t": pa.array([s * scale for s in seconds], pa.int64()),
            "y": pa.array([1.0] * 10),
            "a": pa.array([0.5] * 10),
        }
    )


@pytest.mark.parametrize("unit, scale", [("s", 1), ("ms", 1000), ("us", 10**6), ("ns", 10**9)])
def test_integer_epochs_are_read_in_their_declared_unit(unit: str, scale: int) -> None:
    norm = Normalizer(epoch_source(unit))
    out = norm(epoch_batch(scale), where="f.parquet", partition=T0)
    assert out.column("ts").to_pylist() == [T0 + timedelta(minutes=5 * i) for i in range(10)]
    assert norm.take() == {}  # nothing outside the partition, nothing repaired


@pytest.mark.parametrize("unit, scale, fits", [(None, 1, "s"), ("s", 1000, "ms"), ("ms", 10**6, "us")])
def test_epochs_misread_in_another_unit_fail_the_read_naming_column_file_and_unit(
    unit: str | None, scale: int, fits: str
) -> None:
    """Most rows outside their partition is a misdeclared column, never a silent repair: the read fails
    (permanent: no retry), naming the file, the column, the unit used and the one that would fit."""
    norm = Normalizer(epoch_source(unit))
    with pytest.raises(SchemaMismatchError) as raised:
        norm(epoch_batch(scale), where="part-0.parquet", partition=T0)
    message = str(raised.value)
    assert message.startswith("part-0.parquet: column 't': 10 of 10 event times fall outside the partition")
    assert f"read as epoch {unit or 'ms'}" in message and f"declare `ts_unit: {fits}`" in message
    assert is_permanent(raised.value)


def test_a_few_stray_event_times_are_still_the_quality_rule() -> None:
    """Below half the rows, rows outside the partition are counted and repaired as before."""
    batch = epoch_batch(1000)
    times = batch.column("t").to_pylist()
    times[0] += 7_200_000  # two hours late
    stray = batch.set_column(0, "t", pa.array(times, pa.int64()))
    norm = Normalizer(epoch_source(None))
    norm(stray, where="f.parquet", partition=T0)
    assert norm.take() == {"ts_outside_partition": 1}


def test_timestamps_of_another_time_say_so() -> None:
    norm = Normalizer(epoch_source(None))
    batch = epoch_batch(1000)
    late = batch.set_column(0, "t", pa.array([T0 + timedelta(days=3)] * 10, pa.timestamp("us", tz="UTC")))
    with pytest.raises(SchemaMismatchError, match="timestamps are of another time"):
        norm(late, where="f.parquet", partition=T0)


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.dictionary(pa.int32(), pa.string())])
def test_string_sparse_ids_are_hashed_and_their_nulls_repaired(kind: pa.DataType) -> None:
    from primus_dagster.data.hashing import stable_hash64

    norm = Normalizer(
        source("{ts: t, label: y, dense: [a], sparse: [gender, u]}", "type: parquet, kind: batch, path: p")
    )
    genders = pa.array(["f", "m", None, "f"], pa.string())
    batch = pa.record_batch(
        {
            "t": pa.array([T0_MS] * 4, pa.int64()),
            "y": pa.array([1.0, 0.0, 1.0, 0.0]),
            "a": pa.array([0.5] * 4),
            "gender": genders.cast(kind) if not pa.types.is_dictionary(kind) else genders.dictionary_encode(),
            "u": pa.array([1, 2, 3, 4], pa.int64()),
        }
    )
    out = norm(batch, where="f.parquet", partition=T0)
    hashed = stable_hash64(pa.array(["f", "m"])).to_pylist()
    assert out.column("gender").to_pylist() == [hashed[0], hashed[1], 0, hashed[0]]  # null -> 0 (bad_id: repair)
    assert norm.take() == {"bad_id": 1}


def test_a_list_sparse_column_is_named_and_a_string_sample_id_hashed() -> None:
    norm = Normalizer(source("{ts: t, id: i, dense: [a], sparse: [genres]}", "type: parquet, kind: batch, path: p"))
    batch = pa.record_batch(
        {
            "t": pa.array([T0_MS], pa.int64()),
            "i": pa.array([7], pa.int64()),
            "a": pa.array([0.5]),
            "genres": pa.array([["drama", "war"]]),
        }
    )
    with pytest.raises(
        SchemaMismatchError,
        match=r"f.parquet: sparse column 'genres' has type list<item: string>; "
        r"expected an integer or a string \(hashed to an id\); it is a list column: map it in columns.lists",
    ):
        norm(batch, where="f.parquet", partition=T0)
    string_ids = batch.set_column(1, "i", pa.array(["s-7"])).set_column(3, "genres", pa.array([1], pa.int64()))
    out = norm(string_ids, where="f.parquet", partition=T0)  # a string sample id is hashed, as a sparse one
    assert out.column("sample_id").to_pylist() == stable_hash64(pa.array(["s-7"])).to_pylist()
    with pytest.raises(SchemaMismatchError, match=r"id column 'i' has type list<item: string>; expected an integer"):
        norm(batch.set_column(1, "i", pa.array([["s-7"]])), where="f.parquet", partition=T0)

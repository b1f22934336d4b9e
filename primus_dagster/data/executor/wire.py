"""The dataset server's wire format (pure): tickets, per-batch metadata, wire batches.

A trainer asks an executor for its batches with a Flight ``DoGet`` whose ticket is JSON::

    {"trainer": 0}                  # or {"trainer": 0, "shm": true}: shared-memory batches (``shm``)

The executor answers with one Arrow IPC stream. Every record batch travels with Flight
``app_metadata`` (JSON, UTF-8) naming it::

    {"task_id": "history:src/20261101T00/…", "first_row": 0, "rows": 4096,
     "stream": "history", "kind": "batch", "source": "src"}

The batch itself is the canonical batch *without* its ``source`` and ``kind`` columns: they
are constant per batch, ride in the metadata, and Flight streams cannot carry dictionary
columns batch by batch. Any other dictionary column is decoded to its value type.
:func:`from_wire` restores the canonical columns on the reader side (cheap: one-value
dictionaries). On a shared-memory stream a batch travels as a 0-row batch whose metadata adds
``"shm": {"slot", "file", "seq", "length"}`` (where the real batch lies, see ``shm``);
:func:`split_meta` separates the two.

Example::

    >>> wire, meta = to_wire(batch, BatchId("t", 0, batch.num_rows), "history")  # doctest: +SKIP
    >>> canonical, meta2 = from_wire(wire, encode_meta(meta))                     # doctest: +SKIP
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_dagster.data.canonical import SchemaMismatchError
from primus_dagster.data.tasks import BatchId

CONSTANT_COLUMNS = ("source", "kind")


@dataclass(frozen=True)
class BatchMeta:
    """What travels beside each batch: its identity and where it belongs."""

    task_id: str
    first_row: int
    rows: int
    stream: str
    kind: str
    source: str

    @property
    def batch_id(self) -> BatchId:
        return BatchId(self.task_id, self.first_row, self.rows)


def encode_ticket(trainer: int, shm: bool = False) -> bytes:
    """The DoGet ticket for ``trainer`` (asking for shared-memory batches with ``shm``).

    >>> encode_ticket(3)
    b'{"trainer": 3}'
    >>> encode_ticket(3, shm=True)
    b'{"trainer": 3, "shm": true}'
    """
    data: dict[str, Any] = {"trainer": int(trainer)}
    if shm:
        data["shm"] = True
    return json.dumps(data).encode()


def parse_ticket(raw: bytes, trainers: int) -> tuple[int, bool]:
    """The trainer a ticket names and whether it asks for shared memory; ValueError for malformed
    tickets or unknown trainers."""
    try:
        data = json.loads(raw.decode())
        trainer = data["trainer"]
        shm = data.get("shm", False)
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise ValueError(f'bad ticket {raw[:80]!r}: expected JSON {{"trainer": <int>}} ({exc})') from None
    if not isinstance(trainer, int) or isinstance(trainer, bool) or not 0 <= trainer < trainers:
        raise ValueError(f"bad ticket: trainer {trainer!r} is not in 0..{trainers - 1}")
    if not isinstance(shm, bool):
        raise ValueError(f"bad ticket: shm must be true or false, got {shm!r}")
    return trainer, shm


def decode_ticket(raw: bytes, trainers: int) -> int:
    """The trainer a ticket names; ValueError for malformed tickets or unknown trainers."""
    return parse_ticket(raw, trainers)[0]


def encode_meta(meta: BatchMeta) -> bytes:
    return json.dumps(asdict(meta), separators=(",", ":")).encode()


def with_shm(raw_meta: bytes, shm: dict[str, Any]) -> bytes:
    """``raw_meta`` (an :func:`encode_meta` object) with the ``shm`` descriptor added."""
    return raw_meta[:-1] + b',"shm":' + json.dumps(shm, separators=(",", ":")).encode() + b"}"


def split_meta(raw: bytes | pa.Buffer | None) -> tuple[BatchMeta, dict[str, Any] | None]:
    """The batch metadata and its shared-memory descriptor (None for a batch sent inline)."""
    if raw is None:
        raise ValueError("a batch arrived without its app_metadata (is the server a primus data executor?)")
    data: dict[str, Any] = json.loads(bytes(raw).decode())
    shm = data.pop("shm", None)
    return BatchMeta(**data), shm


def decode_meta(raw: bytes | pa.Buffer | None) -> BatchMeta:
    return split_meta(raw)[0]


def _constant(batch: pa.RecordBatch, name: str) -> str | None:
    index = batch.schema.get_field_index(name)
    if index < 0 or batch.num_rows == 0:
        return None
    value = batch.column(index)[0].as_py()
    return None if value is None else str(value)


def to_wire(
    batch: pa.RecordBatch, batch_id: BatchId, stream: str, kind: str | None = None, source: str | None = None
) -> tuple[pa.RecordBatch, BatchMeta]:
    """Split a canonical batch into its wire batch (no dictionary columns) and its metadata.

    ``kind``/``source`` default to the batch's own constant columns.
    """
    kind = kind or _constant(batch, "kind") or "batch"
    source = source or _constant(batch, "source") or ""
    arrays, fields = [], []
    for field, column in zip(batch.schema, batch.columns):
        if field.name in CONSTANT_COLUMNS:
            continue
        if pa.types.is_dictionary(field.type):
            column = pc.cast(column, field.type.value_type)
            field = field.with_type(field.type.value_type)
        arrays.append(column)
        fields.append(field)
    wire = pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
    return wire, BatchMeta(batch_id.task_id, batch_id.first_row, batch_id.rows, stream, kind, source)


def _one_value(value: str, zeros: pa.Array) -> pa.DictionaryArray:
    # All-zero indices into a one-entry dictionary: valid by construction, so skip validation.
    return pa.DictionaryArray.from_arrays(zeros, pa.array([value]), safe=False)


def from_wire(wire: pa.RecordBatch, raw_meta: bytes | pa.Buffer | BatchMeta | None) -> tuple[pa.RecordBatch, BatchMeta]:
    """The canonical batch (``source``/``kind`` restored) and its metadata (raw, or decoded)."""
    meta = raw_meta if isinstance(raw_meta, BatchMeta) else decode_meta(raw_meta)
    if meta.rows != wire.num_rows:
        raise ValueError(f"batch {meta.task_id}@{meta.first_row}: metadata says {meta.rows} rows, got {wire.num_rows}")
    n = wire.num_rows
    dict_type = pa.dictionary(pa.int32(), pa.string())
    zeros = pa.array(np.zeros(n, dtype=np.int32))  # shared by both (arrays are immutable)
    arrays = list(wire.columns) + [_one_value(meta.source, zeros), _one_value(meta.kind, zeros)]
    fields = list(wire.schema) + [
        pa.field("source", dict_type, nullable=False),
        pa.field("kind", dict_type, nullable=False),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields)), meta


def conform(wire: pa.RecordBatch, schema: pa.Schema, where: str) -> pa.RecordBatch:
    """``wire`` with exactly ``schema`` (one Flight stream has one schema): as it is, or cast;
    :class:`SchemaMismatchError` naming ``where`` when it cannot be cast."""
    if wire.schema == schema:
        return wire
    try:
        return wire.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, TypeError) as exc:
        raise SchemaMismatchError(
            f"{where}: batch schema ({wire.schema.to_string(show_schema_metadata=False)}) "
            f"does not match this executor's stream schema "
            f"({schema.to_string(show_schema_metadata=False)}): {exc}"
        ) from None

"""What travels over a data executor's Flight streams (pure): tickets and per-batch metadata.

A trainer asks an executor for its batches with a Flight ``DoGet`` whose ticket is JSON::

    {"trainer": 0}                  # or {"trainer": 0, "shm": true}: shared-memory batches

The executor answers with one Arrow IPC stream of :class:`~primus_dagster.data.batch.Batch`
columns (the canonical columns without the constant ``source``/``kind``), each with its
:class:`~primus_dagster.data.batch.BatchMeta` as Flight ``app_metadata`` (JSON, UTF-8)::

    {"task_id": "history:src/20261101T00/…", "first_row": 0, "rows": 4096,
     "stream": "history", "kind": "batch", "source": "src"}

On a shared-memory stream a batch travels as a 0-row batch whose metadata adds
``"shm": {"slot", "file", "seq", "length"}`` (where the real batch lies, see
``docs/shared_memory.md``); :func:`split_meta` separates the two. One stream has one schema:
:func:`conform` casts a batch to it or names the task whose batch does not fit.

Example::

    stream = client.do_get(fl.Ticket(encode_ticket(0, shm=False)), options)
    chunk = stream.read_chunk()
    meta, shm = split_meta(chunk.app_metadata)          # shm is None: the batch is chunk.data
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from primus_dagster.data.batch import BatchMeta
from primus_dagster.data.canonical import SchemaMismatchError


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


def with_shm(raw_meta: bytes, shm: dict[str, Any]) -> bytes:
    """``raw_meta`` (a :meth:`BatchMeta.encode` object) with the ``shm`` descriptor added."""
    return raw_meta[:-1] + b',"shm":' + json.dumps(shm, separators=(",", ":")).encode() + b"}"


def split_meta(raw: bytes | pa.Buffer | None) -> tuple[BatchMeta, dict[str, Any] | None]:
    """The batch metadata and its shared-memory descriptor (None for a batch sent inline)."""
    if raw is None:
        raise ValueError("a batch arrived without its app_metadata (is the server a primus data executor?)")
    data: dict[str, Any] = json.loads(bytes(raw).decode())
    shm = data.pop("shm", None)
    return BatchMeta.decode(data), shm


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

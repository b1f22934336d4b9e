"""Kafka record values in Avro (``format: avro``) decoded into Arrow tables of a spec's native columns.

The same interface and output as :class:`~.decoding.JsonRecordDecoder`: ``decode(values, timestamps)``
gives one table of the native columns, typed as :func:`~.decoding.json_schema` types them (``ts``,
``id`` int64, ``label`` float64, dense float32 or ``list<float32>``, ids int64 -- Avro strings and enum
symbols hashed by :func:`~primus_dagster.data.hashing.stable_hash64`, as the JSON path hashes JSON
strings, so the same value gets the same id --, lists, weights) and the ``(index, error)`` of the
records that do not decode. A missing or null field is null (the normaliser's ``missing_field``), a
null ``ts`` is filled from the record timestamp, a missing ``weights`` list is one weight per id.

Where the writer schema comes from (the spec): ``avro_schema`` (each value is the bare Avro body) or
``schema_registry_url``: each value is in the Confluent wire format (magic byte 0, the schema id as
4 bytes big-endian, the body) and the writer schema is ``GET {url}/schemas/ids/{id}``, fetched once per
id and cached for the decoder's life (an unknown id too). ``avro_reader_schema`` resolves every record
to one schema (Avro schema resolution: a field the writer lacks takes the reader's default).

Records are read one by one with fastavro's ``schemaless_reader`` (C), the columns are built in bulk:
one ``pa.array`` per column. Undecodable -- counted and placed by the adapter like undecodable JSON,
never the read's failure: an empty value, a value without the wire header or with another magic byte,
an unknown schema id (the registry answers 404), a schema that is not Avro, a truncated body or bytes
left after it, a record the reader schema cannot resolve, a field whose Avro type does not fit its
column (a string label; checked once per writer schema), a list holding both integers and strings.
A registry that does not answer (within ``timeout_s``), refuses the credentials or fails otherwise
raises :class:`SchemaRegistryError`, naming the URL: that is no bad record, and fails the read task.
The registry password is read from the variable ``schema_registry_password_env`` names (HTTP basic
auth) and never enters a message. An ``avro_schema`` or ``avro_reader_schema`` whose types do not fit
the column mapping is refused when the decoder is built (:class:`SchemaMismatchError`).

Example::

    decoder = AvroRecordDecoder(spec)                # spec.format == "avro"
    table, bad = decoder.decode(values, timestamps)  # native-column table (None if none decoded)
    bad                                              # [(3, "unknown schema id 17 (the registry ...)"), ...]
"""

from __future__ import annotations

import base64
import io
import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_dagster.data.canonical import SchemaMismatchError
from primus_dagster.data.sources.kafka.decoding import check_weights, fill_ts, hashed_ids, id_fields, json_schema
from primus_dagster.spec.sources import KafkaSourceSpec

__all__ = ["AvroRecordDecoder", "SchemaRegistryError"]

#: The magic byte of the Confluent wire format, and the length of its header (magic + 4-byte schema id).
MAGIC = 0
HEADER = 5
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError)


class SchemaRegistryError(RuntimeError):
    """The schema registry did not answer, refused the credentials or failed: the read cannot go on (not a bad record)."""


# -- which Avro types fit which column ---------------------------------------------------------------------

_PRIMITIVE = {"int": "int", "long": "int", "float": "float", "double": "float", "boolean": "bool", "string": "string"}
_TIMESTAMPS = {"timestamp-millis", "timestamp-micros", "timestamp-nanos"}


def _kinds(avro_type: Any) -> set[str]:
    """What values of ``avro_type`` become in Python: ``int``, ``float``, ``bool``, ``string``, ``timestamp``,
    ``null``, ``list:<kind>`` for an array, ``other`` for anything else (bytes, maps, records, dates, ...)."""
    if isinstance(avro_type, list):  # a union
        return set().union(*(_kinds(t) for t in avro_type))
    if isinstance(avro_type, str):
        return {"null"} if avro_type == "null" else {_PRIMITIVE.get(avro_type, "other")}
    if not isinstance(avro_type, Mapping):
        return {"other"}
    kind, logical = avro_type.get("type"), avro_type.get("logicalType")
    if kind == "array":
        return {f"list:{k}" for k in _kinds(avro_type.get("items"))}
    if kind == "enum":
        return {"string"}
    if logical in _TIMESTAMPS:
        return {"timestamp"} if kind == "long" else {"other"}
    if logical is not None:  # uuid, decimal, date, time-*, local-timestamp-*: other Python types than their base
        return {"other"}
    return _kinds(kind) if isinstance(kind, str) else {"other"}


def _fits(spec: KafkaSourceSpec) -> dict[str, tuple[set[str], str]]:
    """Per native column, the kinds (:func:`_kinds`) its Avro field may have and what the column is."""
    ids = id_fields(spec.columns)
    out: dict[str, tuple[set[str], str]] = {}
    for field in json_schema(spec):
        name, kind = field.name, field.type
        if name == spec.columns.ts:
            out[name] = ({"int", "timestamp"}, "the event time (a long, or a timestamp logical type)")
        elif name in ids:
            if ids[name]:
                out[name] = ({"list:int", "list:string"}, "a list of ids (an array of ints, longs or strings)")
            else:
                out[name] = ({"int", "string"}, "an id (an int, a long or a string)")
        elif kind == pa.float64():
            out[name] = ({"int", "float", "bool"}, "the label (a number or a boolean)")
        elif kind == pa.float32():
            out[name] = ({"int", "float"}, "a dense feature (a number)")
        elif pa.types.is_list(kind):
            out[name] = ({"list:int", "list:float"}, "a list of numbers (an array of numbers)")
        else:
            out[name] = ({"int"}, "an int or a long")
    return out


def _misfit(schema: Mapping[str, Any], fits: Mapping[str, tuple[set[str], str]]) -> str | None:
    """Why a record schema's fields do not fit the columns (None: they do; fields it lacks are null)."""
    for field in schema.get("fields", []):
        want = fits.get(field.get("name"))
        if want is None:
            continue  # not mapped: ignored
        kinds = _kinds(field.get("type")) - {"null"}
        if not kinds <= want[0]:
            return f"field {field['name']!r} is Avro {json.dumps(field.get('type'))}; its column is {want[1]}"
    return None


# -- columns ---------------------------------------------------------------------------------------------


def _ids(values: Sequence[Any], is_list: bool) -> pa.Array:
    """Id values (ints, strings, or both across values) as int64 ids; strings hashed. Raises on a value that is
    neither, or on a list holding both."""
    kind = pa.list_(pa.int64()) if is_list else pa.int64()
    strings = pa.list_(pa.string()) if is_list else pa.string()
    try:
        return pa.array(values, kind)
    except _ERRORS:
        pass
    try:
        return hashed_ids(pa.array(values, strings))
    except _ERRORS:
        pass
    if is_list:
        if any(v and len({type(x) for x in v}) > 1 for v in values):
            raise ValueError("a list holding both integers and strings")
        is_str = [bool(v) and isinstance(v[0], str) for v in values]
    else:
        is_str = [isinstance(v, str) for v in values]
    ints = pa.array([None if s else v for v, s in zip(values, is_str, strict=True)], kind)
    hashed = hashed_ids(pa.array([v if s else None for v, s in zip(values, is_str, strict=True)], strings))
    return pc.coalesce(ints, hashed)


def _epoch(values: Sequence[Any], unit: str) -> list[Any]:
    """Timestamp values (fastavro's datetimes of a timestamp logical type) as integer epochs in ``unit``."""
    per_us = _PER_SECOND[unit] / 1_000_000
    return [
        (int(((v - _EPOCH) // timedelta(microseconds=1)) * per_us) if isinstance(v, datetime) else v) for v in values
    ]


@dataclass(frozen=True)
class _Writer:
    """A writer schema (parsed), and why its records do not fit the columns (None: they do)."""

    schema: Any
    misfit: str | None


class AvroRecordDecoder:
    """Decodes chunks of Avro record values of one Kafka source (``format: avro``; module docstring).

    ``timeout_s`` bounds every schema registry request; ``environ`` (default ``os.environ``) holds the
    registry password variable. Safe for concurrent use (the schema cache is locked).

    Example::

        decoder = AvroRecordDecoder(spec, timeout_s=10)
        table, bad = decoder.decode([r.value for r in records], [r.timestamp for r in records])
        decoder.schema_ids                    # registry schema ids fetched so far: [1, 2]
    """

    def __init__(
        self, spec: KafkaSourceSpec, timeout_s: float = 10.0, environ: Mapping[str, str] | None = None
    ) -> None:
        if spec.format != "avro":
            raise ValueError(f"source {spec.name!r}: format {spec.format!r}, not avro")
        self.spec, self.timeout_s = spec, timeout_s
        self.schema = json_schema(spec)
        self.ts_column = spec.columns.ts
        self._environ = os.environ if environ is None else environ
        self._ids = id_fields(spec.columns)
        self._fits = _fits(spec)
        lists = dict(spec.columns.list_pairs())
        self._weights = [(lists[name], native) for name, native in spec.columns.weights.items()]
        self._lock = threading.Lock()
        self._registry: dict[int, _Writer | str] = {}  # schema id -> writer schema, or why it cannot be used
        self._reader: Any = None
        if spec.avro_reader_schema is not None:
            self._reader = self._checked(spec.avro_reader_schema, "avro_reader_schema")
        self._inline: _Writer | None = None
        if spec.avro_schema is not None:
            parsed = fastavro.parse_schema(dict(spec.avro_schema))
            if self._reader is None:
                self._checked(spec.avro_schema, "avro_schema")
            self._inline = _Writer(parsed, None)

    def _checked(self, schema: Mapping[str, Any], key: str) -> Any:
        """``schema`` (a key of the spec) parsed; a :class:`SchemaMismatchError` when it does not fit the columns."""
        misfit = _misfit(schema, self._fits)
        if misfit:
            raise SchemaMismatchError(f"source {self.spec.name!r}: {key}: {misfit}")
        return fastavro.parse_schema(dict(schema))

    @property
    def schema_ids(self) -> list[int]:
        """The registry schema ids looked up so far (known or not)."""
        with self._lock:
            return sorted(self._registry)

    # -- the registry --------------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        user, var = self.spec.schema_registry_user, self.spec.schema_registry_password_env
        if user is not None and var is not None:
            password = self._environ.get(var)
            if password is None:
                raise SchemaRegistryError(
                    f"source {self.spec.name!r}: the schema registry password variable {var!r} "
                    "(schema_registry_password_env) is not set in this process"
                )
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        return headers

    def _fetch(self, schema_id: int) -> _Writer | str:
        """The writer schema of ``schema_id`` from the registry, or why its records cannot be read."""
        url = f"{self.spec.schema_registry_url}/schemas/ids/{schema_id}"
        where = f"source {self.spec.name!r}: schema registry {url}"
        request = urllib.request.Request(url, headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return f"unknown schema id {schema_id} (the registry answers 404)"
            hint = (
                f" (check schema_registry_user {self.spec.schema_registry_user!r} and the password in "
                f"${self.spec.schema_registry_password_env})"
                if exc.code in (401, 403) and self.spec.schema_registry_user
                else ""
            )
            raise SchemaRegistryError(f"{where}: HTTP {exc.code} {exc.reason}{hint}") from None
        except (urllib.error.URLError, OSError) as exc:  # refused, unresolvable, timed out
            reason = getattr(exc, "reason", exc)
            raise SchemaRegistryError(f"{where}: no answer within {self.timeout_s:g} s ({reason})") from None
        except ValueError as exc:
            raise SchemaRegistryError(f"{where}: not a JSON answer ({exc})") from None
        kind = body.get("schemaType", "AVRO") if isinstance(body, dict) else None
        if kind != "AVRO":
            return f"schema id {schema_id} is a {kind} schema, not Avro (format avro)"
        try:
            schema = json.loads(body["schema"])
            parsed = fastavro.parse_schema(schema)
        except Exception as exc:  # fastavro raises SchemaParseException, KeyError, TypeError, ...
            return f"schema id {schema_id}: not a usable Avro schema ({type(exc).__name__}: {exc})"
        misfit = None
        if self._reader is None:
            misfit = f"schema id {schema_id}: " + m if (m := _misfit(schema, self._fits)) else None
        return _Writer(parsed, misfit)

    def _writer(self, schema_id: int) -> _Writer | str:
        with self._lock:
            found = self._registry.get(schema_id)
            if found is None:
                found = self._registry[schema_id] = self._fetch(schema_id)
            return found

    # -- records -------------------------------------------------------------------------------------------

    def _record(self, value: bytes | None) -> dict[str, Any] | str:
        """One value decoded (a dict of its fields), or why it is undecodable."""
        if not value:
            return "empty record"
        start, what = 0, "the Avro body"
        if self._inline is not None:
            writer: _Writer | str = self._inline
        else:
            if len(value) < HEADER:
                return f"{len(value)} bytes: shorter than the Confluent wire header (magic byte + 4-byte schema id)"
            if value[0] != MAGIC:
                return f"magic byte {value[0]:#04x}: not the Confluent wire format (magic byte 0x00)"
            schema_id = int.from_bytes(value[1:HEADER], "big")
            writer, start, what = self._writer(schema_id), HEADER, f"the Avro body of schema id {schema_id}"
        if isinstance(writer, str):
            return writer
        if writer.misfit:
            return writer.misfit
        fo = io.BytesIO(value)
        fo.seek(start)
        try:
            record = fastavro.schemaless_reader(fo, writer.schema, self._reader)
        except Exception as exc:  # EOFError (truncated), SchemaResolutionError, UnicodeDecodeError, ...
            return f"{what} does not decode ({type(exc).__name__}: {str(exc)[:200]})"
        left = len(value) - fo.tell()
        if left:
            return f"{left} bytes left after {what} (written with another schema?)"
        if not isinstance(record, dict):
            return f"{what} is not a record"
        return record

    def _column(self, name: str, values: list[Any], bad: dict[int, str]) -> pa.Array:
        """One column from the records' values; a value that does not convert goes to ``bad`` (by row)."""
        kind = self.schema.field(name).type
        if name == self.ts_column:
            values = _epoch(values, self.spec.columns.ts_unit)

        def convert(vs: Sequence[Any]) -> pa.Array:
            return _ids(vs, self._ids[name]) if name in self._ids else pa.array(vs, kind)

        try:
            return convert(values)
        except _ERRORS:
            pass
        kept = []
        for row, v in enumerate(values):
            try:
                convert([v])
            except _ERRORS as exc:
                bad.setdefault(row, f"field {name!r}: {str(exc)[:200]}")
                v = None
            kept.append(v)
        return convert(kept)

    def decode(
        self, values: Sequence[bytes | None], timestamps: Sequence[int] | Callable[[], Sequence[int]]
    ) -> tuple[pa.Table | None, list[tuple[int, str]]]:
        """The decoded values as one table (``None`` when none decodes) and the sorted ``(index, error)`` of the rest.

        ``timestamps`` (the record timestamps, epoch ms; or a function giving them, called only when some
        record has no ``ts``) fill ``ts`` where the record has none. Raises :class:`SchemaRegistryError`
        when the registry cannot be asked.
        """
        bad: list[tuple[int, str]] = []
        keep: list[int] = []
        records: list[dict[str, Any]] = []
        for i, value in enumerate(values):
            record = self._record(value)
            if isinstance(record, str):
                bad.append((i, record))
            else:
                keep.append(i)
                records.append(record)
        if not records:
            return None, bad
        failed: dict[int, str] = {}  # row in records -> why
        columns = [self._column(name, [r.get(name) for r in records], failed) for name in self.schema.names]
        table = pa.Table.from_arrays(columns, schema=self.schema)
        rows = np.asarray(keep, dtype=np.int64)
        if self._weights:
            table, broken = check_weights(table, self._weights)
            if broken is not None:
                failed.update((int(r), "weights and ids lists differ in length") for r in np.flatnonzero(broken))
        if failed:
            ok = np.ones(len(rows), dtype=bool)
            ok[list(failed)] = False
            bad += [(int(rows[r]), why) for r, why in failed.items()]
            table, rows = table.filter(pa.array(ok)), rows[ok]
            if not table.num_rows:
                return None, sorted(bad)
        if table.column(self.ts_column).null_count:
            table = fill_ts(table, self.ts_column, rows, timestamps)
        return table, sorted(bad)

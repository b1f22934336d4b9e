"""Data-source tier of the dataset spec: one storage system's data over time.

A source says where its data lives, how it is partitioned in time (``hour`` or ``day``),
whether it feeds the ``batch`` or the ``stream`` side of training, and how its native
columns map onto the canonical sample schema (see :mod:`primus_dagster.data.canonical`).

Example (YAML)::

    name: impressions_parquet
    type: parquet
    kind: batch
    granularity: hour
    label_delay: 24h
    path: data/parquet/impressions
    layout: hive
    columns: {ts: event_time, label: click, id: sample_id, dense: [d0, d1], sparse: [user_id]}
    quality: {dense_invalid: repair, null_label: drop, ts_outside_partition: fail}
    checks: {label_rate: [0.01, 0.5], max_staleness: 15m}

``quality`` (see :class:`QualityPolicy`) says, per rule, what happens to a row that breaks it:
``repair`` (the repair is named in :data:`REPAIRS`), ``drop`` or ``fail`` (the read task fails at
once, naming file and column; not retried). Whatever the action, every row touched is counted
per rule and per read task. ``checks`` (see :class:`SourceChecks`) bounds the blocking asset checks
``label_rate_in_range`` and ``freshness`` of the source's Dagster asset.

Locations (``path``, ``template``, ``uri``, ``catalog.warehouse``) stay inside the data root: one rule,
:func:`outside_root`, refuses ``..`` out of it and relative ``file://`` URIs at load time, and (in the
adapters) listed files that resolve outside it through a symlink. An absolute path or ``file:///`` URI is
the explicit opt-out: used as it is, its listed files must stay inside it. Object-store URLs are not checked.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlparse

from pydantic import Field, ValidationInfo, field_validator, model_validator

from primus_dagster.spec.base import StrictModel
from primus_dagster.spec.durations import NonNegativeDuration, PositiveDuration, duration_default, format_duration
from primus_dagster.spec.names import dagster_name_problem

SOURCE_TYPES = ("parquet", "delta", "iceberg", "kafka")
_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
_TEMPLATE_FIELDS = {"YYYY", "MM", "DD", "HH"}


class ColumnMapping(StrictModel):
    """How native columns become the canonical sample schema.

    ``dense`` is either a list of numeric columns (stacked into one fixed-size list) or the
    name of one column that already is a list of floats. ``sparse`` is a list of id columns
    kept under their own names, or a mapping ``canonical_name: native_name``.
    """

    ts: str = Field(description="Event-time column: a timestamp, or integer epochs in ``ts_unit``.")
    ts_unit: Literal["s", "ms", "us", "ns"] = Field(
        default="ms",
        description=(
            "The unit of an integer event-time column (epoch seconds, milliseconds, microseconds, nanoseconds); "
            "ignored for timestamp columns. A read whose rows mostly fall outside their partition fails and "
            "names the unit that would fit."
        ),
    )
    label: str | None = Field(default=None, description="Label column (0/1); may be null in stream rows.")
    label_positive: str | None = Field(
        default=None,
        description=(
            "For a string label column: the value that is a positive (e.g. '>50K'; compared with surrounding "
            "whitespace trimmed); every other value is a negative, a null stays unlabelled."
        ),
    )
    id: str | None = Field(
        default=None,
        description="Unique sample id column (integers, or strings: hashed to int64), used for exactly-once checks.",
    )
    dense: list[str] | str = Field(
        default_factory=list, description="Dense feature columns (numeric; none is fine), or one list column."
    )
    sparse: list[str] | dict[str, str] = Field(
        default_factory=list, description="Categorical id columns (integers, strings or binaries: one id per row)."
    )
    lists: list[str] | dict[str, str] = Field(
        default_factory=list, description="Categorical list columns (list<int | string>: several ids per row)."
    )
    weights: dict[str, str] = Field(
        default_factory=dict,
        description="Per list column (canonical name): the native list<float> column of its ids' pooling weights.",
    )

    @field_validator("label_positive", mode="before")
    @classmethod
    def _label_positive_is_text(cls, value: object) -> object:
        if isinstance(value, bool | int | float):
            raise ValueError(
                f"label_positive must be the label's text, got {value!r}: quote it (YAML reads yes / no / on / "
                "off / true / false as booleans and digits as numbers), e.g. label_positive: 'yes'"
            )
        return value

    @field_validator("dense")
    @classmethod
    def _dense_unique(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, list) and len(set(value)) != len(value):
            raise ValueError(f"dense columns must be unique, got {value}")
        return value

    @model_validator(mode="after")
    def _features(self) -> ColumnMapping:
        names = [name for name, _ in [*self.sparse_pairs(), *self.list_pairs()]]
        dense = self.dense if isinstance(self.dense, list) else [self.dense]
        twice = sorted({n for n in names if names.count(n) > 1} | (set(names) & set(dense)))
        if twice:
            raise ValueError(f"columns {twice} are mapped twice (dense, sparse and lists name each column once)")
        lists = dict(self.list_pairs())
        for name in self.weights:
            if name not in lists:
                raise ValueError(f"weights: {name!r} is not a list column (columns.lists: {sorted(lists)})")
        if not dense and not names:
            raise ValueError("no features: map at least one dense, sparse or lists column")
        if self.label_positive is not None and self.label is None:
            raise ValueError("label_positive names the positive value of the label column: set columns.label too")
        return self

    def sparse_pairs(self) -> list[tuple[str, str]]:
        """``(canonical_name, native_name)`` for each sparse column, in spec order."""
        return _pairs(self.sparse)

    def list_pairs(self) -> list[tuple[str, str]]:
        """``(canonical_name, native_name)`` for each list column, in spec order."""
        return _pairs(self.lists)


def _pairs(columns: list[str] | dict[str, str]) -> list[tuple[str, str]]:
    if isinstance(columns, dict):
        return list(columns.items())
    return [(name, name) for name in columns]


QualityAction = Literal["repair", "drop", "fail"]

#: What ``repair`` does, per data-quality rule (also the text the run log and metadata show).
REPAIRS: dict[str, str] = {
    "dense_invalid": "NaN, +-inf or null dense values -> missing, the feature's fill (training.features)",
    "null_label": "null label -> 0.0 (a negative, until a correction arrives)",
    "null_ts": "null event time -> the start of the partition read",
    "ts_outside_partition": "row kept in the partition it was read for (event time unchanged)",
    "bad_id": "sparse id -> 0, sample id -> null",
    "missing_field": "the field's repair: dense -> missing (its fill), sparse id -> 0, sample id -> null",
}


class QualityPolicy(StrictModel):
    """What happens to rows that break a data-quality rule: ``repair``, ``drop`` or ``fail``, per rule.

    ``repair`` does what :data:`REPAIRS` names; ``fail`` fails the read task at once, naming file and
    column (never retried).

    Rules: ``dense_invalid`` (a dense value is NaN, +-inf or null), ``null_label`` (only with a
    mapped label column; default: ``drop`` for a batch source, ``repair`` for a stream source, whose
    rows may not be clicked yet), ``null_ts``, ``ts_outside_partition`` (the event time lies outside
    the partition the row was read for; not checked for live Kafka tails), ``bad_id`` (a sparse or
    sample id that does not convert to int64: null, NaN, not whole, out of range). Rows are counted
    per rule whatever the action (a row breaking two rules counts under both).

    Example (YAML)::

        quality: {dense_invalid: fail, null_label: repair, ts_outside_partition: drop}
    """

    dense_invalid: QualityAction = Field(
        default="repair",
        description=f"A dense value is NaN, +-inf or null. repair: {REPAIRS['dense_invalid']}.",
    )
    null_label: QualityAction | None = Field(
        default=None,
        description=f"The mapped label is null. repair: {REPAIRS['null_label']}; default: drop for a batch "
        "source, repair for a stream source.",
    )
    null_ts: QualityAction = Field(default="drop", description=f"The event time is null. repair: {REPAIRS['null_ts']}.")
    ts_outside_partition: QualityAction = Field(
        default="repair",
        description=f"The event time lies outside the partition the row was read for (not checked for live Kafka "
        f"tails). repair: {REPAIRS['ts_outside_partition']}.",
    )
    bad_id: QualityAction = Field(
        default="repair",
        description=f"A sparse or sample id does not convert to int64 (null, NaN, not whole, out of range). "
        f"repair: {REPAIRS['bad_id']}.",
    )

    def actions(self, kind: str) -> dict[str, QualityAction]:
        """Every rule's action for a source of ``kind`` (``batch``/``stream``), defaults filled in.

        >>> QualityPolicy().actions("batch")["null_label"]
        'drop'
        """
        out: dict[str, QualityAction] = {k: v for k, v in self.model_dump().items() if v is not None}
        out.setdefault("null_label", "drop" if kind == "batch" else "repair")
        return out


class KafkaQualityPolicy(QualityPolicy):
    """The data-quality policy of a Kafka source: the rules of every source plus ``missing_field``.

    ``missing_field``: a JSON record without (or with null) a mapped dense, sparse or id field (a missing
    label is ``null_label``; a missing ``ts`` takes the record timestamp).
    """

    missing_field: QualityAction = Field(
        default="repair",
        description=f"A JSON record lacks a mapped dense, sparse or id field, or has it null. repair: "
        f"{REPAIRS['missing_field']}.",
    )


_GRANULARITY = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
Share = Annotated[float, Field(ge=0.0, le=1.0)]


class SourceChecks(StrictModel):
    """Bounds of the blocking asset checks ``label_rate_in_range`` and ``freshness`` of a source asset.

    ``label_rate: [lo, hi]``: the share of positive labels among a partition's labelled rows must lie in
    ``[lo, hi]``. ``max_staleness``: the partition's newest event time may lie at most this long before
    the partition's end (a source that stopped writing mid-partition fails). A bound left out is not
    configured: its check still runs, passes, and records the measured value and ``bound: not configured``.

    Example (YAML)::

        checks: {label_rate: [0.01, 0.5], max_staleness: 15m}
    """

    label_rate: tuple[Share, Share] | None = Field(
        default=None, description="[lo, hi]: allowed share of positive labels among a partition's labelled rows."
    )
    max_staleness: PositiveDuration | None = Field(
        default=None,
        description="How long before the partition's end its newest event time may lie (at most the granularity).",
    )

    @field_validator("label_rate")
    @classmethod
    def _ordered(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and value[0] > value[1]:
            raise ValueError(f"label_rate [lo, hi] needs lo <= hi, got [{value[0]}, {value[1]}]")
        return value


class PathOutsideRootError(ValueError):
    """A source location, or a file found by listing it, lies outside the root it must stay in
    (see :func:`outside_root`); the message names the source, the location and, for a symlink, its target."""


def is_local_location(location: str) -> bool:
    """A filesystem path or a ``file://`` URI; object-store URLs (``s3://``, ``gs://``, ...) are not local."""
    return "://" not in location or location.startswith("file://")


def local_path(location: str) -> str:
    """The filesystem path of a local ``location``: ``file:///x%20y`` -> ``/x y``; a plain path as it is."""
    return unquote(urlparse(location).path) if location.startswith("file://") else location


def _within(path: Path, base: Path) -> bool:
    return path == base or base in path.parents


def outside_root(location: str, root: str | None = None, what: str = "the data root") -> str | None:
    """Why ``location`` lies outside ``root`` (named ``what`` in the message); None when it stays inside.

    The one containment rule of source locations, for every form: ``path``, ``template``, ``uri``,
    warehouses, ``file://`` URIs and the files a listing finds. Object-store URLs (``s3://``, ...) are
    never refused. A ``file://`` URI must be absolute (``file:///...``): ``file://../x`` would resolve from
    the working directory. A relative path may not climb out with ``..`` (checked as written: all the
    spec's validators can do, with no root at hand). Given a local ``root``, the path (a relative one
    joined to ``root``) must also lie inside it once ``..`` and symlinks are resolved (``Path.resolve``);
    the problem then names the symlink that leads out and its target. An absolute path is compared with
    a given root only: written in a spec, it is the explicit opt-out of the data root.

    >>> outside_root("../x")
    "relative path '../x' leaves the data root"
    >>> outside_root("s3://bucket/../x") is None and outside_root("/abs") is None
    True
    """
    if not is_local_location(location):
        return None
    if location.startswith("file://") and urlparse(location).netloc not in ("", "localhost"):
        return f"file URI {location!r} is not absolute (file:///...): it would resolve from the working directory, not {what}"
    path = local_path(location)
    if not path.startswith("/") and posixpath.normpath(path).split("/")[0] == "..":
        return f"relative path {location!r} leaves {what}"
    if root is None or not is_local_location(root):
        return None
    base = Path(local_path(root)).resolve()
    given = Path(local_path(root), path)
    real = given.resolve()
    if _within(real, base):
        return None
    current = Path(given.anchor)
    for part in given.parts[1:]:
        parent, current = current, current / part
        if current.is_symlink() and _within(parent.resolve(), base) and not _within(current.resolve(), base):
            target, resolved = os.readlink(current), current.resolve()
            also = "" if Path(target) == resolved else f" (resolves to {resolved})"
            return f"{location} leaves {what} {root}: symlink {current} -> {target}{also}"
    return f"{location} resolves to {real}, outside {what} {root}"


_OUTSIDE_HINT = "use a path inside it, or an absolute path / URL (an explicit location outside the data root)"


def _refuse_outside(
    info: ValidationInfo, key: str, value: str, what: str = "the data root", hint: str = _OUTSIDE_HINT
) -> str:
    """``value`` of ``key`` unless it leaves ``what`` (:func:`outside_root` at load time: no root, no filesystem);
    the error names the source (its ``name``, validated before every path key) and the key."""
    problem = outside_root(value, what=what)
    if problem is not None:
        raise PathOutsideRootError(f"source {info.data.get('name', '?')!r}: {key}: {problem}; {hint}")
    return value


class _SourceBase(StrictModel):
    """The keys every source has, whatever its ``type``."""

    name: str = Field(
        pattern=_NAME_RE,
        max_length=128,
        description="Unique source name (letters, digits, `_`); also the name of its Dagster asset.",
    )
    kind: Literal["batch", "stream"] = Field(
        default="batch",
        description="Which training queue it feeds: `batch` (delayed, complete labels; MTRM's memory tower) or "
        "`stream` (fresh data; MTRM's adapt tower).",
    )
    granularity: Literal["hour", "day"] = Field(
        default="hour",
        description="Time partitioning of the source and of its Dagster asset: hourly or daily partitions.",
    )
    label_delay: NonNegativeDuration = Field(
        default=duration_default("0s"),
        description="How long after a partition's end its labels are complete (a duration: `15m`, `24h`); a batch "
        "partition feeds only the training windows that end after that.",
    )
    columns: ColumnMapping = Field(
        description="How the source's native columns map onto the canonical sample schema (ts, label, id, "
        "dense, sparse, lists)."
    )
    allow_empty: bool = Field(
        default=False, description="An empty ready partition is valid; false: it is reported as an error."
    )
    batch_rows: int = Field(
        default=65536,
        gt=0,
        le=4_194_304,
        description="Rows per record batch read and normalised (batches run across the files of a pack).",
    )
    quality: QualityPolicy = Field(
        default_factory=QualityPolicy, description="Data-quality policy: repair, drop or fail, per rule."
    )
    checks: SourceChecks = Field(
        default_factory=SourceChecks, description="Bounds of the label-rate and freshness asset checks."
    )

    @field_validator("name")
    @classmethod
    def _dagster_accepts(cls, value: str) -> str:
        problem = dagster_name_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _staleness_within_partition(self) -> _SourceBase:
        bound, length = self.checks.max_staleness, _GRANULARITY[self.granularity]
        if bound is not None and bound > length:
            raise ValueError(
                f"checks.max_staleness {format_duration(bound)} is longer than a partition of this "
                f"{'hourly' if self.granularity == 'hour' else 'daily'} source ({format_duration(length)}): it could never fail; use at most "
                f"{format_duration(length)}"
            )
        return self


class ParquetSourceSpec(_SourceBase):
    """Parquet files on any fsspec filesystem, one directory per hour or day."""

    type: Literal["parquet"] = Field(description="Selects this source type: Parquet files.")
    path: str = Field(
        description="Root directory or fsspec URL of the partition directories. A relative path resolves inside "
        "the data root and may not leave it (`..`, symlinks); an absolute path, file:/// URI or object-store URL "
        "is used as it is."
    )
    layout: Literal["hive", "template"] = Field(
        default="hive", description="hive: dt=YYYY-MM-DD/hour=HH; template: see `template`."
    )
    template: str | None = Field(
        default=None,
        description="Directory template with {YYYY} {MM} {DD} {HH}, e.g. '{YYYY}{MM}{DD}/{HH}': directories "
        "under `path` (no `..` out of it).",
    )
    success_marker: str | None = Field(
        default="_SUCCESS", description="File whose presence marks a partition ready; null: always ready."
    )
    split_row_groups: bool = Field(
        default=False, description="Split files into row-group ranges of about target_task_bytes (reads footers)."
    )
    target_task_bytes: int = Field(
        default=128 * 2**20,
        gt=0,
        le=2**40,
        description="With split_row_groups: a file larger than this many bytes is read as row-group ranges of "
        "about this size.",
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="fsspec filesystem options (e.g. object-store credentials); the values are never shown in "
        "messages or metadata.",
    )

    @field_validator("path")
    @classmethod
    def _path_inside_root(cls, value: str, info: ValidationInfo) -> str:
        return _refuse_outside(info, "path", value)

    @field_validator("template")
    @classmethod
    def _template_inside_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        # The fields expand to digits only, so the template leaves `path` exactly when its literal text does.
        hint = "a template names directories under `path`"
        return None if value is None else _refuse_outside(info, "template", value, "the source path", hint)

    @model_validator(mode="after")
    def _check_template(self) -> ParquetSourceSpec:
        if self.layout == "template":
            if not self.template:
                raise ValueError("layout 'template' needs a `template`, e.g. '{YYYY}{MM}{DD}/{HH}'")
            fields = set(re.findall(r"{([^}]*)}", self.template))
            unknown = fields - _TEMPLATE_FIELDS
            if unknown:
                raise ValueError(
                    f"template {self.template!r} has unknown fields {sorted(unknown)}; use {{YYYY}} {{MM}} {{DD}} {{HH}}"
                )
            if self.granularity == "hour" and "HH" not in fields:
                raise ValueError(f"template {self.template!r} of an hourly source needs {{HH}}")
        elif self.template is not None:
            raise ValueError("`template` is only used with layout 'template'")
        return self


class DeltaSourceSpec(_SourceBase):
    """A Delta Lake table partitioned by a date column (and an hour column for hourly data)."""

    type: Literal["delta"] = Field(description="Selects this source type: a Delta Lake table.")
    uri: str = Field(
        description="Table location. A relative path resolves inside the data root and may not leave it (`..`, "
        "symlinks); an absolute path, file:/// URI or object-store URI is used as it is."
    )
    date_column: str = Field(default="dt", description="Partition column holding the date, YYYY-MM-DD.")
    hour_column: str | None = Field(
        default="hour", description="Partition column holding the hour (0-23); required for an hourly source."
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="delta-rs storage options (e.g. object-store credentials); the values are never shown in "
        "messages or metadata.",
    )

    @field_validator("uri")
    @classmethod
    def _uri_inside_root(cls, value: str, info: ValidationInfo) -> str:
        return _refuse_outside(info, "uri", value)

    @model_validator(mode="after")
    def _check_hour(self) -> DeltaSourceSpec:
        if self.granularity == "hour" and not self.hour_column:
            raise ValueError("an hourly Delta source needs `hour_column`")
        return self


class IcebergCatalogSpec(StrictModel):
    """pyiceberg catalog properties; the default is a SqlCatalog on SQLite with a file warehouse."""

    name: str = Field(
        default="primus",
        description="Name of the pyiceberg catalog: the SqlCatalog's, or the one loaded for another `type` property.",
    )
    uri: str | None = Field(default=None, description="Catalog URI; default: sqlite:///<data root>/iceberg/catalog.db.")
    warehouse: str | None = Field(
        default=None,
        description="Warehouse location: a relative path inside the data root (no `..` or symlinks out of it), or "
        "an absolute path, file:/// URI or object-store URL used as it is; default: <data root>/iceberg/warehouse.",
    )
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="Extra pyiceberg catalog properties (`type`: rest, glue, hive, ...; credentials), never "
        "shown; a `warehouse` here replaces `warehouse`.",
    )

    def warehouse_location(self) -> str | None:
        """The warehouse as written: ``properties.warehouse``, else ``warehouse`` (None: the catalog's default)."""
        return self.properties.get("warehouse") or self.warehouse


class IcebergSourceSpec(_SourceBase):
    """An Iceberg table partitioned by hour(ts) or day(ts); partitions come from the scan plan."""

    type: Literal["iceberg"] = Field(description="Selects this source type: an Iceberg table.")
    table: str = Field(pattern=r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)+$", description="Table identifier: `namespace.table`.")
    catalog: IcebergCatalogSpec = Field(
        default_factory=IcebergCatalogSpec,
        description="The catalog holding the table; default: a SqlCatalog on SQLite under the data root.",
    )

    @field_validator("catalog")
    @classmethod
    def _warehouse_inside_root(cls, value: IcebergCatalogSpec, info: ValidationInfo) -> IcebergCatalogSpec:
        for key, location in (
            ("catalog.warehouse", value.warehouse),
            ("catalog.properties.warehouse", value.properties.get("warehouse")),
        ):
            if location is not None:
                _refuse_outside(info, key, location)
        return value


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
_SASL_KEYS = ("sasl_mechanism", "sasl_username", "sasl_password_env")
_SSL_KEYS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")
#: Keys that would hold a password itself: refused, the password is named by ``sasl_password_env``.
INLINE_PASSWORD_KEYS = ("sasl_password", "sasl_plain_password", "password", "ssl_password")


class KafkaSecuritySpec(StrictModel):
    """How a Kafka client authenticates and encrypts: the security keys of a Kafka source.

    ``security_protocol`` is ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``. The
    ``sasl_*`` keys go with the ``SASL_*`` protocols (all three are then required), the ``ssl_*`` keys with
    ``SSL`` and ``SASL_SSL``. The password is never written in the spec: ``sasl_password_env`` names the
    environment variable that holds it, read when a client connects. Certificate paths are PEM files.

    Example (YAML, on a Kafka source)::

        security_protocol: SASL_SSL
        sasl_mechanism: SCRAM-SHA-512
        sasl_username: trainer
        sasl_password_env: KAFKA_PASSWORD      # the variable's name, not the password
        ssl_cafile: /etc/kafka/ca.pem
    """

    security_protocol: SecurityProtocol = Field(
        default="PLAINTEXT",
        description="How clients talk to the brokers: in plain text, over TLS (`SSL`), with SASL authentication, "
        "or both (`SASL_SSL`).",
    )
    sasl_mechanism: SaslMechanism | None = Field(
        default=None, description="SASL mechanism; required with the SASL_* protocols, an error without them."
    )
    sasl_username: str | None = Field(default=None, min_length=1, max_length=1024, description="SASL user name.")
    sasl_password_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        max_length=256,
        description="Name of the environment variable holding the SASL password (never the password itself).",
    )
    ssl_cafile: str | None = Field(
        default=None, min_length=1, description="PEM file of the CA(s) to trust (default: the system's)."
    )
    ssl_certfile: str | None = Field(
        default=None, min_length=1, description="PEM client certificate (mutual TLS); may hold the key too."
    )
    ssl_keyfile: str | None = Field(
        default=None, min_length=1, description="PEM private key of ssl_certfile (unencrypted)."
    )
    ssl_check_hostname: bool = Field(
        default=True, description="Check that the broker's certificate names the host connected to."
    )

    @model_validator(mode="before")
    @classmethod
    def _no_inline_password(cls, data: object) -> object:
        if isinstance(data, dict):
            inline = [key for key in INLINE_PASSWORD_KEYS if key in data]
            if inline:
                raise ValueError(
                    f"{inline[0]}: a password is never written in the spec; put it in an environment variable "
                    "and name that variable in `sasl_password_env`"
                )
        return data

    @model_validator(mode="after")
    def _security_combinations(self) -> KafkaSecuritySpec:
        protocol, given = self.security_protocol, self.model_fields_set
        if protocol.startswith("SASL_"):
            missing = [key for key in _SASL_KEYS if getattr(self, key) is None]
            if missing:
                raise ValueError(
                    f"security_protocol {protocol} needs {', '.join(missing)} (sasl_mechanism: PLAIN, SCRAM-SHA-256 "
                    "or SCRAM-SHA-512; sasl_password_env: the environment variable holding the password)"
                )
        else:
            stray = [key for key in _SASL_KEYS if getattr(self, key) is not None]
            if stray:
                raise ValueError(
                    f"{', '.join(stray)}: only used with security_protocol SASL_PLAINTEXT or SASL_SSL "
                    f"(this source: {protocol})"
                )
        if not protocol.endswith("SSL"):
            # a default value passes (a dumped spec carries them); any other one without TLS is a mistake
            defaults = type(self).model_fields
            stray = [key for key in _SSL_KEYS if key in given and getattr(self, key) != defaults[key].default]
            if stray:
                raise ValueError(
                    f"{', '.join(stray)}: only used with security_protocol SSL or SASL_SSL (this source: {protocol})"
                )
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("ssl_keyfile needs ssl_certfile (the client certificate the key belongs to)")
        return self


#: The Avro keys of a Kafka source (used only with ``format: avro``).
_AVRO_KEYS = (
    "avro_schema",
    "avro_reader_schema",
    "schema_registry_url",
    "schema_registry_user",
    "schema_registry_password_env",
)


def _avro_schema(value: object, key: str, source: object) -> object:
    """An Avro schema key's value: a mapping, or its JSON text parsed; checked by fastavro (a record)."""
    if value is None:
        return None
    key = f"source {source!r}: {key}"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{key}: not a JSON Avro schema ({exc})") from exc
    if not isinstance(value, dict) or value.get("type") != "record":
        raise ValueError(
            f'{key}: an Avro record schema is expected ({{"type": "record", "name": ..., "fields": [...]}})'
        )
    import fastavro

    try:
        fastavro.parse_schema(value)
    except Exception as exc:  # fastavro raises SchemaParseException, ValueError, KeyError, TypeError
        raise ValueError(f"{key}: not a valid Avro schema ({type(exc).__name__}: {exc})") from exc
    return value


class KafkaSourceSpec(_SourceBase, KafkaSecuritySpec):
    """A Kafka topic of JSON (default) or Avro records; partitions are per topic-partition offset ranges.

    The security keys (``security_protocol``, ``sasl_*``, ``ssl_*``) are those of :class:`KafkaSecuritySpec`.

    ``format: avro`` takes the writer schema either inline (``avro_schema``: each value is the bare Avro
    body) or from a Confluent Schema Registry (``schema_registry_url``: each value is the wire format,
    magic byte 0, a 4-byte schema id, the body); ``avro_reader_schema`` resolves every record to one
    schema (evolution). Registry credentials: ``schema_registry_user`` and ``schema_registry_password_env``,
    the *name* of the variable holding the password (HTTP basic auth).

    Example (YAML)::

        format: avro
        schema_registry_url: https://registry.example.com:8081
        avro_reader_schema: {type: record, name: Event, fields: [{name: event_time, type: long}, ...]}
    """

    type: Literal["kafka"] = Field(description="Selects this source type: a Kafka topic.")
    topic: str = Field(pattern=r"^[A-Za-z0-9._-]+$", description="The Kafka topic the source reads.")
    quality: KafkaQualityPolicy = Field(
        default_factory=KafkaQualityPolicy,
        description="Data-quality policy: repair, drop or fail, per rule (with missing_field for JSON records).",
    )
    bootstrap_servers: str | None = Field(
        default=None,
        description="Comma-separated host:port list of brokers; default: the Kafka resource's (or the embedded "
        "broker).",
    )
    max_records_per_task: int = Field(
        default=200_000,
        gt=0,
        le=2**40,
        description="Records per read task: a partition's offset range is split into tasks of at most this many.",
    )
    poll_max_bytes: int = Field(
        default=16 * 2**20,
        gt=0,
        le=2**31 - 1,
        description="The consumer's fetch_max_bytes: the most bytes one fetch returns.",
    )
    fetcher: Literal["confluent-kafka", "kafka-python"] = Field(
        default="confluent-kafka",
        description="confluent-kafka: librdkafka (batched consume, offsets_for_times from the broker; the fast "
        "path); kafka-python: the reference client, the fallback a source can choose.",
    )
    format: Literal["json", "avro"] = Field(
        default="json",
        description="Record values: json (one JSON object each) or avro (avro_schema or schema_registry_url).",
    )
    avro_schema: dict[str, Any] | None = Field(
        default=None,
        description="format avro: the writer schema (a record; a mapping or its JSON text) of values without a header.",
    )
    avro_reader_schema: dict[str, Any] | None = Field(
        default=None,
        description="format avro: the schema every record is resolved to (evolution); default: the writer's.",
    )
    schema_registry_url: str | None = Field(
        default=None,
        description="format avro: Confluent Schema Registry; values in its wire format, schemas fetched by id.",
    )
    schema_registry_user: str | None = Field(
        default=None, min_length=1, max_length=1024, description="Schema registry user (HTTP basic auth)."
    )
    schema_registry_password_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        max_length=256,
        description="Name of the environment variable holding the registry password (never the password).",
    )

    @field_validator("fetcher", mode="before")
    @classmethod
    def _no_native_fetcher(cls, value: object) -> object:
        if value == "native":
            raise ValueError(
                "fetcher 'native' (the hand-written fetch client) was removed: use 'confluent-kafka' "
                "(the default) or 'kafka-python'"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _no_inline_registry_password(cls, data: object) -> object:
        if isinstance(data, dict) and "schema_registry_password" in data:
            raise ValueError(
                "schema_registry_password: a password is never written in the spec; put it in an environment "
                "variable and name that variable in `schema_registry_password_env`"
            )
        return data

    @field_validator("avro_schema", "avro_reader_schema", mode="before")
    @classmethod
    def _parsed_avro_schema(cls, value: object, info: ValidationInfo) -> object:
        return _avro_schema(value, str(info.field_name), info.data.get("name", "?"))

    @field_validator("schema_registry_url")
    @classmethod
    def _registry_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        url = urlparse(value)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError("schema_registry_url: an http:// or https:// URL is expected")
        if url.username is not None or url.password is not None:
            raise ValueError(
                "schema_registry_url: no credentials in the URL; use `schema_registry_user` and "
                "`schema_registry_password_env` (the environment variable holding the password)"
            )
        return value.rstrip("/")

    @model_validator(mode="after")
    def _avro_keys(self) -> KafkaSourceSpec:
        if self.format == "json":
            stray = [key for key in _AVRO_KEYS if getattr(self, key) is not None]
            if stray:
                raise ValueError(f"{', '.join(stray)}: only used with format: avro (source {self.name!r}: json)")
            return self
        if (self.avro_schema is None) == (self.schema_registry_url is None):
            raise ValueError(
                f"source {self.name!r}: format avro needs exactly one of `avro_schema` (the writer schema, values "
                "without a header) or `schema_registry_url` (Confluent wire format, schemas fetched by id)"
            )
        if self.schema_registry_url is None:
            stray = [k for k in ("schema_registry_user", "schema_registry_password_env") if getattr(self, k)]
            if stray:
                raise ValueError(f"{', '.join(stray)}: only used with schema_registry_url (source {self.name!r})")
        elif (self.schema_registry_user is None) != (self.schema_registry_password_env is None):
            raise ValueError(
                f"source {self.name!r}: schema_registry_user and schema_registry_password_env go together "
                "(HTTP basic auth)"
            )
        return self


SourceSpec = Annotated[
    ParquetSourceSpec | DeltaSourceSpec | IcebergSourceSpec | KafkaSourceSpec,
    Field(discriminator="type"),
]
"""Any source; ``type`` selects the model (parquet | delta | iceberg | kafka)."""

"""Declared features (``training.features``): how the model reads each column the sources map.

The sources' ``columns`` say *where* a feature is (``dense``, ``sparse`` and ``lists`` name the
canonical columns, see :class:`~primus_dagster.spec.sources.ColumnMapping`); ``training.features``
says *how* the model takes it, by canonical name -- DeepCTR's dense / sparse / var-len sparse
feature columns, TorchRec's per-table configs:

* ``dense``: a numeric column, its ``transform`` (``standardize``, the default; ``log1p``;
  ``clip``; ``none``) and its ``fill`` for a missing value (NaN, null, +-inf after the source's
  ``dense_invalid`` repair). The transform's statistics are estimated once per job on the first
  ``stats_rows`` rows of its first training window's data and kept with the model (checkpoint,
  registry, serving);
* ``categorical``: one id per row (an integer, or a string / binary hashed by
  :func:`~primus_dagster.data.hashing.stable_hash64`), embedded in the ``shared`` table
  (``model.hash_buckets`` x ``model.embedding_dim``, the default), a named table of ``tables``, or a
  table of its own (``buckets`` and ``dim`` on the feature);
* ``categorical_list``: a list of ids per row (``list<int | string>``), embedded like a categorical
  and pooled (``sum`` or ``mean``; weighted where the source maps ``columns.weights``).

A canonical column the sources map and ``training.features`` does not declare takes the defaults
(a dense column is standardized, an id column goes to the shared table, a list is mean-pooled).

Example (YAML)::

    training:
      features:
        dense:
          - {name: price, transform: log1p}
          - {name: age, fill: 30}
        categorical:
          - {name: user_id, buckets: 1000000, dim: 32}   # its own table
          - {name: gender, table: profile}              # a named shared table
        categorical_list:
          - {name: genres, pooling: mean}
        tables:
          profile: {buckets: 1000, dim: 8}
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from primus_dagster.spec.base import StrictModel

SHARED_TABLE = "shared"
DenseTransform = Literal["standardize", "log1p", "clip", "none"]
_NAME = r"^[A-Za-z_][A-Za-z0-9_.\-]*$"


class DenseFeature(StrictModel):
    """A dense numeric column: its transform and the fill of a missing value.

    ``standardize``: ``(x - mean) / std``; ``log1p``: ``sign(x) log(1 + |x|)``, then standardized (for
    skewed, heavy-tailed counts and amounts); ``clip``: clipped to the 1st..99th percentile, then
    standardized (outliers); ``none``: as it is. ``fill``: a missing value's stand-in in the column's
    own units, or ``mean`` (the default: the column's mean, 0 after standardizing).
    """

    name: str = Field(pattern=_NAME, max_length=128, description="Canonical dense column (a name in columns.dense).")
    transform: DenseTransform = Field(
        default="standardize",
        description="`standardize`: (x - mean) / std; `log1p`: sign(x) log(1 + |x|), then standardized (skewed "
        "counts and amounts); `clip`: to the 1st..99th percentile, then standardized (outliers); `none`: as it is.",
    )
    fill: float | Literal["mean"] = Field(
        default="mean",
        description="A missing value's stand-in: a number in the column's own units, or `mean` (the column's "
        "mean, 0 after standardizing).",
    )


class TableSpec(StrictModel):
    """An embedding table: ``buckets`` rows (ids hash into them) of width ``dim``."""

    buckets: int = Field(ge=16, le=2**31 - 1, description="Rows of the table that ids hash into (modulo 2^31-1 first).")
    dim: int = Field(ge=1, le=65_536, description="Embedding width: the length of each row.")


class CategoricalFeature(StrictModel):
    """One id per row, embedded in a table: ``shared`` (default), a name of ``features.tables``, or a
    table of its own (give ``buckets`` and ``dim`` instead of ``table``)."""

    name: str = Field(pattern=_NAME, max_length=128, description="Canonical id column (a name in columns.sparse).")
    table: str | None = Field(
        default=None,
        description="Table to embed in: `shared` (the default: model.hash_buckets x model.embedding_dim) or a "
        "name of training.features.tables.",
    )
    buckets: int | None = Field(
        default=None,
        ge=16,
        le=2**31 - 1,
        description="Rows of the feature's own table (with `dim`, instead of `table`).",
    )
    dim: int | None = Field(
        default=None,
        ge=1,
        le=65_536,
        description="Embedding width of the feature's own table (with `buckets`, instead of `table`).",
    )

    @model_validator(mode="after")
    def _one_table(self) -> CategoricalFeature:
        own = (self.buckets is not None, self.dim is not None)
        if any(own) and not all(own):
            raise ValueError(f"feature {self.name!r}: a table of its own needs both buckets and dim")
        if all(own) and self.table is not None:
            raise ValueError(
                f"feature {self.name!r}: give table (a shared table) or buckets and dim (its own table), not both"
            )
        return self

    def table_name(self) -> str:
        """The table this feature is embedded in (its own is named after the feature)."""
        if self.buckets is not None:
            return self.name
        return self.table or SHARED_TABLE


class CategoricalListFeature(CategoricalFeature):
    """A list of ids per row (``list<int | string>``), embedded like a categorical and pooled."""

    name: str = Field(pattern=_NAME, max_length=128, description="Canonical list column (a name in columns.lists).")
    pooling: Literal["sum", "mean"] = Field(
        default="mean",
        description="How a row's embeddings pool into one: `sum` or `mean` (weighted where the source maps "
        "columns.weights).",
    )


class FeaturesSpec(StrictModel):
    """How the model reads each column the sources map, by canonical name (undeclared columns take the defaults).

    A dense column is standardized, an id column goes to the ``shared`` table, a list is mean-pooled
    unless declared otherwise here.
    """

    dense: list[DenseFeature] = Field(
        default_factory=list,
        max_length=100_000,
        description="Dense columns with their own transform or fill; others are standardized, missing values "
        "filled with the mean.",
    )
    categorical: list[CategoricalFeature] = Field(
        default_factory=list,
        max_length=100_000,
        description="Id columns (one id per row) with their own embedding table; others go to the `shared` table.",
    )
    categorical_list: list[CategoricalListFeature] = Field(
        default_factory=list,
        max_length=100_000,
        description="List columns (several ids per row) with their own table or pooling; others are mean-pooled "
        "in the `shared` table.",
    )
    tables: dict[str, TableSpec] = Field(
        default_factory=dict,
        description="Named embedding tables that categorical and list features share by `table` (`shared` is "
        "the default table's name and cannot be declared).",
    )
    stats_rows: int = Field(
        default=100_000,
        ge=1,
        le=2**31,
        description="Rows of the job's first training window (its first planned tasks, in plan order) the "
        "dense transforms' statistics are estimated on.",
    )

    @model_validator(mode="after")
    def _check(self) -> FeaturesSpec:
        if SHARED_TABLE in self.tables:
            raise ValueError(
                f"tables: {SHARED_TABLE!r} is the default table (model.hash_buckets x model.embedding_dim); "
                "name yours otherwise"
            )
        seen: set[str] = set()
        declared: list[DenseFeature | CategoricalFeature] = [*self.dense, *self.categorical, *self.categorical_list]
        for feature in declared:
            if feature.name in seen:
                raise ValueError(f"feature {feature.name!r} is declared twice")
            seen.add(feature.name)
        for feature in [*self.categorical, *self.categorical_list]:
            table = feature.table
            if table is not None and table != SHARED_TABLE and table not in self.tables:
                raise ValueError(
                    f"feature {feature.name!r}: table {table!r} is not declared in training.features.tables "
                    f"(have {sorted(self.tables) or 'none'}; {SHARED_TABLE!r} is the default table)"
                )
            if feature.buckets is not None and (feature.name in self.tables or feature.name == SHARED_TABLE):
                raise ValueError(f"feature {feature.name!r}: its own table would take the name of a declared table")
        return self

    def dense_of(self, name: str) -> DenseFeature:
        """The declaration of dense column ``name`` (the defaults when it is not declared: any column name
        the source maps, unchecked -- the name pattern is for declarations)."""
        return next((f for f in self.dense if f.name == name), None) or DenseFeature.model_construct(name=name)

    def categorical_of(self, name: str) -> CategoricalFeature:
        return next((f for f in self.categorical if f.name == name), None) or CategoricalFeature.model_construct(
            name=name
        )

    def list_of(self, name: str) -> CategoricalListFeature:
        return next(
            (f for f in self.categorical_list if f.name == name), None
        ) or CategoricalListFeature.model_construct(name=name)

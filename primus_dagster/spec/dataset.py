"""Dataset and stream tiers of the job spec (Primus: dataset -> data stream -> data source).

Example (YAML)::

    dataset:
      start: 2026-11-01
      streams:
        - name: history
          window: 24h
          sources: [...]        # see primus_dagster.spec.sources
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from typing import Literal

from pydantic import Field, field_validator, model_validator

from primus_dagster.spec.base import StrictModel
from primus_dagster.spec.durations import NonNegativeDuration, PositiveDuration, duration_default
from primus_dagster.spec.sources import SourceSpec

_GRANULARITY = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
#: Dataset times a spec may hold: Kafka and epoch-millisecond timestamps start in 1970, and a date plus any
#: duration (at most 100 years) must stay a valid datetime.
EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(3000, 1, 1, tzinfo=timezone.utc)


def granularity_step(granularity: str) -> timedelta:
    """Length of one partition of the given granularity (``hour`` or ``day``)."""
    return _GRANULARITY[granularity]


class JoinSpec(StrictModel):
    """Join two sources of a stream by key inside a window (e.g. impressions with late clicks)."""

    left: str = Field(description="Name of the stream's source holding the samples (e.g. impressions).")
    right: str = Field(description="Name of the stream's source holding the late events (e.g. clicks).")
    key: str = Field(description="Join key column present in both sources.")
    lateness: NonNegativeDuration = Field(
        default=duration_default("15m"),
        description="How long a right event may come after its left row and still label it 1 (a duration: `15m`, "
        "`1h`); a join task waits until the right source is complete that far.",
    )


class StreamSpec(StrictModel):
    """A mixture of sources scheduled chronologically over a sliding time window."""

    name: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        max_length=128,
        description="Unique stream name (letters, digits, `_`); also the Dagster group name of its sources.",
    )
    sources: list[SourceSpec] = Field(
        min_length=1,
        max_length=1000,
        description="The stream's data sources, each a parquet, delta, iceberg or kafka source chosen by `type`.",
    )
    window: PositiveDuration = Field(
        default=duration_default("24h"),
        description="Sliding-window length of this stream: whole partitions of its coarsest source (`24h`, `7d`).",
    )
    slide: PositiveDuration | None = Field(
        default=None,
        description="Step the window slides by, whole partitions (`1h`, `1d`); default: one partition of the "
        "coarsest source.",
    )
    weight: float = Field(
        default=1.0,
        gt=0,
        le=1e6,
        description="Prioritization weight w_i of this stream's data in mixed training (a data kind takes the "
        "mean weight of its streams).",
    )
    shuffle: Literal["forward", "rebalance"] = Field(
        default="rebalance",
        description="Which trainer a data executor hands its next batch: `forward` (executor i feeds trainer "
        "i mod T) or `rebalance` (the trainer whose buffer in that executor is emptiest).",
    )
    join: JoinSpec | None = Field(
        default=None,
        description="Label one of the stream's sources with another's late events by key (e.g. impressions with "
        "clicks); default: no join.",
    )

    @model_validator(mode="after")
    def _check(self) -> StreamSpec:
        grans = {s.granularity for s in self.sources}
        step = max(granularity_step(g) for g in grans)
        if self.window % step:
            raise ValueError(f"window {self.window} is not a whole number of {max(grans, key=granularity_step)}s")
        if self.slide is not None and self.slide % step:
            raise ValueError(f"slide {self.slide} is not a whole number of partitions")
        if self.join is not None:
            names = {s.name for s in self.sources}
            for side in (self.join.left, self.join.right):
                if side not in names:
                    raise ValueError(f"join source {side!r} is not one of this stream's sources {sorted(names)}")
        return self


class DatasetSpec(StrictModel):
    """The unbounded, stateful input of a job: streams of sources from ``start`` on."""

    start: datetime = Field(
        description="Start of the first partition (UTC; a date or a time, e.g. 2026-11-01 or 2026-11-01T00:00Z); "
        "Dagster partitions start here."
    )
    end: datetime | None = Field(
        default=None,
        description="End of the dataset (exclusive, UTC; after `start`); default: none, the data goes on.",
    )
    streams: list[StreamSpec] = Field(
        min_length=1,
        max_length=1000,
        description="The dataset's streams; stream names and the source names across all streams are unique.",
    )

    @field_validator("start", "end", mode="before")
    @classmethod
    def _date_to_datetime(cls, value: object) -> object:
        if isinstance(value, date) and not isinstance(value, datetime):
            return datetime(value.year, value.month, value.day, tzinfo=timezone.utc)
        return value

    @field_validator("start", "end")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        try:
            value = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
        except OverflowError:  # an offset that moves the year 1 or 9999 out of range
            raise ValueError(f"{value.isoformat()} is out of range in UTC") from None
        if not EARLIEST <= value < LATEST:
            raise ValueError(
                f"{value.isoformat()} is out of range: use a time from {EARLIEST:%Y-%m-%d} to before {LATEST:%Y-%m-%d}"
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> DatasetSpec:
        if self.end is not None and self.end <= self.start:
            raise ValueError(f"end {self.end.isoformat()} must be after start {self.start.isoformat()}")
        seen: set[str] = set()
        for stream in self.streams:
            for source in stream.sources:
                if source.name in seen:
                    raise ValueError(f"source name {source.name!r} is used twice; names must be unique")
                seen.add(source.name)
        stream_names = [s.name for s in self.streams]
        if len(set(stream_names)) != len(stream_names):
            raise ValueError(f"stream names must be unique, got {stream_names}")
        return self

    def all_sources(self) -> list[tuple[StreamSpec, SourceSpec]]:
        """Every ``(stream, source)`` pair in spec order."""
        return [(stream, source) for stream in self.streams for source in stream.sources]

    def source(self, name: str) -> SourceSpec:
        """The source called ``name``; KeyError naming the known sources otherwise."""
        for _, source in self.all_sources():
            if source.name == name:
                return source
        raise KeyError(f"no source {name!r}; known: {[s.name for _, s in self.all_sources()]}")

"""The ``automation`` section of the job spec: how sensors turn new data into runs, and how training continues.

The batch sensor and the stream sensors (``primus_dagster.dagster_defs.sensors``) tick every
``sensor_interval``. A stream sensor asks for a live increment (the newest model trained on the stream
since it) once ``min_new_records`` records arrived since its last request, or ``max_wait`` passed with
at least one (a job without live increments: for the closed stream hours).
A partition that was already trained on and then changes (a new Delta version, Iceberg snapshot or
rewritten Parquet directory) is reported once; ``rerun`` says whether it is also trained again.
``cold_start`` says what a training partition does when the model of the partition before it is
missing (docs/automation.md).

Example (YAML)::

    automation:
      sensor_interval: 30s
      min_new_records: 5000
      max_wait: 10m
      rerun: never              # never | retrain
      cold_start: first_partition   # first_partition | allow
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from primus_dagster.spec.base import StrictModel
from primus_dagster.spec.durations import PositiveDuration, duration_default


class AutomationSpec(StrictModel):
    """Sensor thresholds, the re-run policy for changed partitions, and the cold-start policy."""

    sensor_interval: PositiveDuration = Field(
        default=duration_default("30s"),
        description="Minimum time between two ticks of the job's batch and stream sensors (a duration: `30s`, "
        "`5m`; rounded down to whole seconds, at least 1).",
    )
    min_new_records: int = Field(
        default=10_000,
        ge=1,
        le=2**40,
        description="A stream sensor asks for a live increment once this many records arrived since its last request.",
    )
    max_wait: PositiveDuration = Field(
        default=duration_default("15m"),
        description="A stream sensor also asks for a live increment once this long passed since it first saw a "
        "record it has not asked for yet (a duration: `15m`, `1h`).",
    )
    rerun: Literal["never", "retrain"] = Field(
        default="never",
        description="A new version of a partition that was already trained on is reported (an observation); "
        "retrain: its source partition and the training partitions it fed run again; never: nothing more.",
    )
    cold_start: Literal["first_partition", "allow"] = Field(
        default="first_partition",
        description="A training partition continues the model of the one before it. first_partition: only the "
        "first partition starts from a fresh model, any other whose predecessor has no model fails; allow: "
        "it starts fresh with a warning (recorded in the run's metadata).",
    )

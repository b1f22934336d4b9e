"""Data-quality counts of a run: rows repaired or dropped per source and rule, and where.

Each phase's driver counts them (per task, with the files or Kafka offset ranges); :func:`record_quality`
adds a phase's counts to the run's, says them in the run log and sends them to MLflow; the result and
the asset's metadata carry them (``data_quality``, ``data_quality_where``).

Example::

    record_quality(run, phase, driver, step=trainer.step)
    quality_places_text(run.quality_places["impressions"], QUALITY_PLACES_KEPT)
"""

from __future__ import annotations

import logging
from typing import Any

from primus_dagster.data import QUALITY_RULES, DataDriver, quality_summary
from primus_dagster.training.modes import Phase
from primus_dagster.training.run_state import TrainingRun

log = logging.getLogger(__name__)

#: Places (files, Kafka offset ranges) kept per source and rule where rows were repaired or dropped (the
#: result, its metadata and checkpoints), and how many of them a run-log line names.
QUALITY_PLACES_KEPT = 20
QUALITY_PLACES_LOGGED = 3


def merge_quality_places(
    into: dict[str, dict[str, dict[str, Any]]], by_location: dict[str, dict[str, dict[str, int]]], keep: int
) -> None:
    """Add a phase's ``by_location`` counts (source -> rule -> {place: rows}) to ``into`` (see
    ``TrainingRun.quality_places``): the first ``keep`` places per source and rule are kept, the rest counted.

    >>> places = {}
    >>> merge_quality_places(places, {"imp": {"dense_invalid": {"a.parquet": 3, "b.parquet": 1}}}, keep=1)
    >>> places
    {'imp': {'dense_invalid': {'where': {'a.parquet': 3}, 'more': 1}}}
    """
    for name, rules in by_location.items():
        for rule, places in rules.items():
            entry = into.setdefault(name, {}).setdefault(rule, {"where": {}, "more": 0})
            for where, rows in places.items():
                if where in entry["where"] or len(entry["where"]) < keep:
                    entry["where"][where] = entry["where"].get(where, 0) + rows
                else:
                    entry["more"] += 1


def quality_places_text(places: dict[str, dict[str, Any]], limit: int) -> dict[str, list[str]]:
    """Per rule, ``"<place>: N rows"`` for the first ``limit`` places of one source's ``quality_places``,
    then ``"... and N more"`` when there are others.

    >>> quality_places_text({"dense_invalid": {"where": {"a.parquet": 3, "b.parquet": 1}, "more": 2}}, 1)
    {'dense_invalid': ['a.parquet: 3 rows', '... and 3 more']}
    """
    out: dict[str, list[str]] = {}
    for rule, entry in sorted(places.items()):
        shown = list(entry["where"].items())
        lines = [f"{where}: {rows:,} rows" for where, rows in shown[:limit]]
        more = max(len(shown) - limit, 0) + int(entry["more"])
        out[rule] = lines + ([f"... and {more} more"] if more else [])
    return out


def add_phase_quality(run: TrainingRun, driver: DataDriver) -> dict[str, Any]:
    """Add a phase's quality counts (its ``driver``'s) to the run's, and where they were; the phase's counts
    (``DataDriver.quality_counts``). A resumed run adds a finished phase's from its closing checkpoint's
    driver snapshot."""
    kafka = {source.name for _, source in run.job.dataset.all_sources() if source.type == "kafka"}
    quality = driver.quality_counts(offset_sources=kafka)
    merge_quality_places(run.quality_places, quality["by_location"], QUALITY_PLACES_KEPT)
    for name, counts in quality["by_source"].items():
        mine = run.data_quality.setdefault(name, {})
        for rule, rows in counts.items():
            mine[rule] = mine.get(rule, 0) + rows
    return quality


def record_quality(run: TrainingRun, phase: Phase, driver: DataDriver, step: int) -> None:
    """The phase's data-quality counts (rows repaired or dropped per source and rule): added to the run's,
    logged (one warning line per source, naming the files / Kafka offset ranges) and sent to MLflow as
    ``data_quality.<source>.<rule>`` metrics at ``step`` -- every rule of every source the phase read,
    zeros included."""
    dataset = run.job.dataset
    quality = add_phase_quality(run, driver)
    phase_places: dict[str, dict[str, dict[str, Any]]] = {}
    merge_quality_places(phase_places, quality["by_location"], QUALITY_PLACES_LOGGED)
    for name, counts in quality["by_source"].items():
        where = "; ".join(
            f"{rule} in {', '.join(lines)}"
            for rule, lines in quality_places_text(phase_places.get(name, {}), QUALITY_PLACES_LOGGED).items()
        )
        log.warning(
            "data quality, phase %s: %s%s",
            phase.name,
            quality_summary(dataset.source(name), counts, quality["columns"].get(name)),
            f" -- {where}" if where else "",
        )
    # every rule of every source the phase read, zeros included: "0 repaired" is a measurement, not a gap
    read: dict[str, dict[str, int]] = {s.name: {} for _, s in dataset.all_sources() if s.kind in phase.kinds}
    metrics = {
        f"data_quality.{name}.{rule}": float(counts.get(rule, 0))
        for name, counts in {**read, **run.data_quality}.items()
        for rule in dict.fromkeys([*QUALITY_RULES, *counts])
    }
    if metrics:
        run.tracker.log_metrics(metrics, step)

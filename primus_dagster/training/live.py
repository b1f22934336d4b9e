"""Live stream training: each *increment* trains the newest model on the stream records since it.

A training partition reads closed hours; the stream cannot wait for them. An increment:

1. finds the newest trained **window** of the job (its MLflow run, tag ``primus.run_kind = window``,
   latest ``window_end``) -- the *base* -- and the newest finished **increment** (``live``);
2. continues the increment when it was built on the same base (its model, its Adam state, its
   planned stops as the committed offsets); otherwise *rebases*: continues the base's model from
   the first offset at or after the base window's end (records older than that are in the base);
   with neither, starts a fresh model from each partition's first retained offset;
3. plans the tail of every Kafka stream source from those offsets to the current high watermarks
   (:meth:`KafkaSource.tail`: stops fixed at planning), and trains on it through the data plane with
   :func:`~primus_dagster.training.window.train_window` (same checkpoints, same exactly-once
   progress); the model is published to MLflow with the stops as the next increment's offsets.

Increments form one chain per base: each record after the base's end is trained once in it. A
killed increment is resumed by the next call from its last checkpoint -- its run key is the digest of
where it started, and its planned stops (tag ``primus.tail``) cap the re-planned tail, so it reads
exactly the records it was planned with. Increments are started by the stream sensor (Dagster) or
``primus-dagster live`` (once, or ``--follow``); see docs/automation.md for the design.

Example::

    result = run_live_increment(LiveIncrement(job, "job.yaml", "/data", kafka_bootstrap="127.0.0.1:9092"))
    result.records, result.start.why, result.training.model_uri if result.training else None
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from primus_dagster.data import DataTask, KafkaSource, SourceContext, TimeWindow, make_adapter
from primus_dagster.spec import JobSpec
from primus_dagster.spec.sources import KafkaSourceSpec
from primus_dagster.training.result import TrainingResult
from primus_dagster.training.run_state import RunHooks, TrainingRequest
from primus_dagster.training.tracking import RUN_KEY_TAG, RUN_KIND_TAG, MlflowTracker
from primus_dagster.training.window import train_window

log = logging.getLogger(__name__)

BASE_TAG = "primus.live_base"  # run key of the trained window an increment builds on ("" without one)
TAIL_TAG = "primus.tail"  # JSON {source: {"stops": {partition: offset}, "planned_at": iso}}
START_TAG = "primus.live_start"  # why the increment started where it did


class NotLiveError(ValueError):
    """The job has no stream an increment could follow (no Kafka stream source, or ``training.mode: batch``)."""


def live_sources(job: JobSpec) -> list[tuple[str, KafkaSourceSpec]]:
    """``(stream name, source)`` of every Kafka source of kind ``stream`` outside joins;
    :class:`NotLiveError` when the job trains none (batch mode) or has none."""
    found, why = job.live_stream_sources()
    if not found:
        raise NotLiveError(why)
    return found


@dataclass(frozen=True)
class TrainedRun:
    """A finished MLflow run an increment can build on: its run key and what it consumed."""

    run_key: str
    window_end: datetime | None = None  # a trained window's end
    base_key: str | None = None  # an increment's base
    stops: dict[str, dict[int, int]] = field(default_factory=dict)  # an increment's planned stops


@dataclass(frozen=True)
class LiveStart:
    """Where an increment starts: the model it continues (``warm_start``: a run key), the base of its
    chain, the offsets it reads from per source (a source absent: from its first retained offset)."""

    warm_start: str | None
    base_key: str | None
    committed: dict[str, dict[int, int]]
    why: str

    def run_key(self, job: JobSpec) -> str:
        """Deterministic in where the increment starts: a killed attempt is resumed by the next one."""
        digest = hashlib.sha1(
            json.dumps([self.base_key, {s: sorted(o.items()) for s, o in sorted(self.committed.items())}]).encode()
        ).hexdigest()[:16]
        return f"{job.name}/live/{digest}"


def choose_start(
    base: TrainedRun | None,
    head: TrainedRun | None,
    offsets_at: Callable[[datetime], dict[str, dict[int, int]]],
) -> LiveStart:
    """Pure: continue ``head`` (the newest increment) when it was built on ``base`` (the newest trained
    window), else rebase onto ``base`` from ``offsets_at(base.window_end)``, else start fresh."""
    base_key = base.run_key if base is not None else None
    if head is not None and head.base_key == base_key:
        return LiveStart(head.run_key, base_key, head.stops, f"continues increment {head.run_key}")
    if base is not None and base.window_end is not None:
        return LiveStart(
            base.run_key,
            base_key,
            offsets_at(base.window_end),
            f"builds on window {base.run_key} from its end {base.window_end.isoformat()}",
        )
    return LiveStart(None, None, {}, "no trained model: a fresh model from the first retained offsets")


def _window_run(run: Any) -> TrainedRun:
    end = run.data.params.get("window_end")
    return TrainedRun(run.data.tags[RUN_KEY_TAG], window_end=datetime.fromisoformat(end) if end else None)


def _increment_run(run: Any) -> TrainedRun:
    tail = json.loads(run.data.tags.get(TAIL_TAG) or "{}")
    stops = {source: {int(p): int(o) for p, o in entry["stops"].items()} for source, entry in tail.items()}
    return TrainedRun(run.data.tags[RUN_KEY_TAG], base_key=run.data.tags.get(BASE_TAG) or None, stops=stops)


@dataclass
class LiveIncrement:
    """One increment of ``job`` (module docstring); ``executors``: data executors (default
    ``pools.data.replicas``); ``progress`` as for :class:`TrainingRequest`."""

    job: JobSpec
    job_path: str | Path
    data_root: str | Path
    kafka_bootstrap: str | None = None
    executors: int | None = None
    tracker: MlflowTracker | None = None
    progress: Callable[[dict[str, Any]], None] | None = None
    tags: dict[str, str] = field(default_factory=dict)  # extra MLflow run tags


@dataclass
class LiveResult:
    """What an increment did: where it started, the records it planned, the lag it left (records
    produced after planning), and the training result (None when there was nothing new)."""

    start: LiveStart
    run_key: str
    records: int
    tail: dict[str, dict[str, Any]]
    training: TrainingResult | None

    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "live_run_key": self.run_key,
            "live_start": self.start.why,
            "base": self.start.base_key or "",
            "new_records": self.records,
            "tail": {s: {k: v for k, v in t.items() if k != "tasks"} for s, t in self.tail.items()},
        }
        if self.training is not None:
            out.update(self.training.metadata())
        return out


def _tail_tag(plans: Mapping[str, Any]) -> str:
    return json.dumps(
        {
            name: {"stops": {str(p): o for p, o in plan.stops.items()}, "planned_at": plan.planned_at.isoformat()}
            for name, plan in plans.items()
        },
        sort_keys=True,
    )


def run_live_increment(cfg: LiveIncrement, hooks: RunHooks | None = None) -> LiveResult:
    """Train the newest model on the stream since it and publish it (module docstring)."""
    job = cfg.job
    sources = live_sources(job)
    tracker = cfg.tracker or MlflowTracker(job.tracking.tracking_uri, job.tracking.experiment)
    base_run = tracker.latest_finished({"primus.job": job.name, RUN_KIND_TAG: "window"}, "params.window_end DESC")
    head_run = tracker.latest_finished({"primus.job": job.name, RUN_KIND_TAG: "live"})
    context = SourceContext(str(cfg.data_root), kafka_bootstrap_servers=cfg.kafka_bootstrap)
    adapters: dict[str, KafkaSource] = {}
    try:
        for _, source in sources:
            adapter = make_adapter(source, context)
            assert isinstance(adapter, KafkaSource)
            adapters[source.name] = adapter

        def offsets_at(moment: datetime) -> dict[str, dict[int, int]]:
            return {name: adapter.offsets_at(moment) for name, adapter in adapters.items()}

        start = choose_start(
            _window_run(base_run) if base_run is not None else None,
            _increment_run(head_run) if head_run is not None else None,
            offsets_at,
        )
        run_key = start.run_key(job)
        until: dict[str, dict[int, int]] = {}
        planned_at: dict[str, datetime] = {}
        killed = tracker.unfinished_run(run_key)
        if killed is not None and killed.data.tags.get(TAIL_TAG):  # resume: re-plan exactly its records
            for name, entry in json.loads(killed.data.tags[TAIL_TAG]).items():
                until[name] = {int(p): int(o) for p, o in entry["stops"].items()}
                planned_at[name] = datetime.fromisoformat(entry["planned_at"])
            log.info("live: resuming the unfinished increment %s", run_key)
        plans = {
            name: adapter.tail(start.committed.get(name), until=until.get(name), planned_at=planned_at.get(name))
            for name, adapter in adapters.items()
        }
    finally:
        for adapter in adapters.values():
            adapter.close()
    tail = {name: plan.to_dict() for name, plan in plans.items()}
    records = sum(plan.records for plan in plans.values())
    log.info("live: %s; %d new record(s) %s", start.why, records, {n: p.lag for n, p in plans.items()})
    if records == 0:
        return LiveResult(start, run_key, 0, tail, None)
    stream_of = {source.name: stream for stream, source in sources}
    tasks = [DataTask.for_read(stream_of[name], "stream", read) for name, plan in plans.items() for read in plan.tasks]
    planned = min(plan.planned_at for plan in plans.values()).astimezone(timezone.utc)
    hour = planned.replace(minute=0, second=0, microsecond=0)
    result = train_window(
        TrainingRequest(
            job,
            cfg.job_path,
            cfg.data_root,
            TimeWindow(hour, hour + timedelta(hours=1)),  # the hour the tail was planned in (params only)
            kafka_bootstrap=cfg.kafka_bootstrap,
            executors=cfg.executors,
            run_key=run_key,
            tracker=tracker,
            progress=cfg.progress,
            evaluate=False,  # the hours after an increment have not happened yet
            warm_start=start.warm_start,
            tasks=tasks,
            tags={
                **cfg.tags,
                RUN_KIND_TAG: "live",
                BASE_TAG: start.base_key or "",
                TAIL_TAG: _tail_tag(plans),
                START_TAG: start.why,
            },
        ),
        hooks,
    )
    return LiveResult(start, run_key, records, tail, result)

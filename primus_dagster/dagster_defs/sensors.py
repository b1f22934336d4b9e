"""Sensors that turn new data into runs: one batch sensor per job, one stream sensor per Kafka source.

**Batch sensor** (``<job>_batch_sensor``). Each tick lists, through the source adapters, the partitions
of every Parquet / Delta / Iceberg source over its stream's sliding window (``streams[].window``, ending
``label_delay`` before now) and over the inputs of the next training partition. A partition is picked
up once it is *ready* (its success marker written; committed files in the current Delta version or
Iceberg snapshot) and *complete* (``end + label_delay`` has passed). The cursor (JSON) maps each
picked-up partition to its version and a fingerprint of its files:

- a partition the cursor does not hold -> one run of its source asset partition (the sources that share
  a partition key share the run); a late partition (an older hour landing after newer ones) is inside
  the window and is picked up like any other; one already materialised (before the sensor was on) is
  only recorded;
- the same fingerprint -> nothing, however often it is listed;
- another fingerprint (a new Delta version or Iceberg snapshot touching it, a rewritten directory) ->
  if a training partition already learnt from it, an ``AssetObservation`` on the source partition
  (once: the cursor takes the new fingerprint) and ``automation.rerun``: ``never`` stops there,
  ``retrain`` runs the source partition again and then the training partitions it fed; if nothing
  trained on it yet, the source partition is simply scanned again.

Partitions older than the window are settled: their changes are not looked for (a backfill re-reads
them). One sensor per job rather than per source: the training partition it asks for needs every
source, and one cursor keeps "what is new" one decision per tick.

**Stream sensor** (``<job>_<source>_stream_sensor``, per Kafka source). Each tick reads the topic's
partition offsets (the fetch high watermark: ``end_offsets`` under-reports on some brokers), records an
``AssetObservation`` on the Kafka source asset when they moved (high watermark, lag per partition =
records not yet in the newest model, new records), and, once ``automation.min_new_records`` records
arrived since its last request or ``automation.max_wait`` passed with at least one:

- asks for a **live increment** (the live model asset, :mod:`~primus_dagster.dagster_defs.live_asset`):
  the newest model trained on the records up to the current high watermarks and published -- one at a
  time (none while one is queued or running; the next tick asks again);
- asks for the **closed hours** of the stream: runs of the Kafka source asset for every complete hour
  (``end + label_delay`` passed, a record after it exists) it has not asked for, in order; the training
  partition whose window closed follows once its inputs are there (below).

**Training partitions** (both sensors, each tick). Partitions train in order, each continuing the model
of the one before it, so a sensor asks for one at a time: the first partition after the latest
materialised one, once its window ended and every input is there -- each source partition it reads
(:func:`~primus_dagster.spec.training_inputs`, the rule the planner plans by: of the kinds the mode
trains, the stream sources' partitions of its window, the batch sources' partitions of the window shifted
back by ``training.batch_lag`` whose labels are complete by its end) materialised with no failed blocking
check.
A run is asked for once per set of input materialisations (run tag ``primus/training_inputs``; a failed
run is not repeated on the same inputs: re-execute it, or fix the input so that it is scanned again).

Example::

    sensors = build_sensors(job)                                        # batch + one per Kafka source
    defs = build_definitions(job, job_path="job.yaml", sensors=sensors)
    result = sensors[0](build_sensor_context(instance=instance, resources=resources))
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from dagster import (
    AssetCheckSeverity,
    AssetKey,
    AssetObservation,
    AssetPartitionStatus,
    AssetRecordsFilter,
    AssetSelection,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    EventLogRecord,
    MetadataValue,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    TimeWindowPartitionsDefinition,
    define_asset_job,
    sensor,
)

from primus_dagster.dagster_defs.live_asset import LIVE_TAG, live_asset_job, live_asset_name
from primus_dagster.dagster_defs.partitions import time_partitions
from primus_dagster.dagster_defs.resources import PrimusStorageResource
from primus_dagster.dagster_defs.schedules import AssetJob, training_asset_job
from primus_dagster.dagster_defs.training_asset import training_asset_name, training_partitions_def
from primus_dagster.data import KafkaSource, Partition, SourceAdapter, SourceContext, TimeWindow, make_adapter
from primus_dagster.run_queue import RUN_KIND_TAG
from primus_dagster.spec import (
    JobSpec,
    KafkaSourceSpec,
    SourceSpec,
    StreamSpec,
    Window,
    clip_to_dataset,
    complete_at,
    granularity_step,
    training_inputs,
    training_span_fed_by,
)

TRIGGER_TAG = "primus/trigger"
TRAINING_INPUTS_TAG = "primus/training_inputs"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def _floor(moment: datetime, step: timedelta) -> datetime:
    return _EPOCH + ((moment - _EPOCH) // step) * step


def _digest(value: object) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _some(keys: Sequence[str]) -> str:
    return keys[0] + (f" and {len(keys) - 1} more" if len(keys) > 1 else "")


def _ident(job: JobSpec) -> str:
    return job.name.replace("-", "_")


# ---- time: the window a sensor watches (pure; what a training partition reads: primus_dagster.spec.inputs) --


def sensor_window(job: JobSpec, stream: StreamSpec, source: SourceSpec, now: datetime) -> TimeWindow | None:
    """The partitions a sensor watches: the stream's sliding window (``streams[].window``) of complete
    partitions, i.e. those whose ``end + label_delay`` passed in the last ``window``."""
    step = granularity_step(source.granularity)
    last_end = _floor(now - source.label_delay, step)
    clipped = clip_to_dataset(job.dataset, TimeWindow(last_end - stream.window, last_end))
    return TimeWindow(clipped.start, clipped.end) if clipped is not None else None


# ---- the batch sensor's cursor: what is new since it (pure) --------------------------------------------


@dataclass(frozen=True)
class ListedPartition:
    """A ready, complete partition as the batch sensor saw it: ``version`` is what a person reads (table
    version, snapshot id), ``fingerprint`` what identifies its content (its files)."""

    source: str
    key: str
    start: datetime
    version: str
    fingerprint: str


@dataclass
class PartitionChanges:
    """The outcome of :func:`diff_partitions`: partitions never seen, partitions seen with other content
    (with the version seen before) and the cursor's next ``seen`` map."""

    new: list[ListedPartition] = field(default_factory=list)
    changed: list[tuple[str, ListedPartition]] = field(default_factory=list)
    seen: dict[str, dict[str, list[str]]] = field(default_factory=dict)


def diff_partitions(
    seen: Mapping[str, Mapping[str, Sequence[str]]], listed: Iterable[ListedPartition], keep_from: Mapping[str, str]
) -> PartitionChanges:
    """What is new in ``listed`` since ``seen`` (source -> partition key -> [version, fingerprint]).

    Entries of a source whose key sorts before ``keep_from[source]`` (keys of one granularity sort in
    time order) leave the cursor: they are out of every window the sensor still lists."""
    out = PartitionChanges()
    for source, entries in seen.items():
        floor = keep_from.get(source, "")
        out.seen[source] = {key: list(value) for key, value in entries.items() if key >= floor}
    for part in listed:
        before = seen.get(part.source, {}).get(part.key)
        if before is None:
            out.new.append(part)
        elif before[1] != part.fingerprint:
            out.changed.append((before[0], part))
        out.seen.setdefault(part.source, {})[part.key] = [part.version, part.fingerprint]
    return out


def partition_fingerprint(adapter: SourceAdapter, partition: Partition) -> str:
    """A digest of a ready partition's files: it changes exactly when the partition's content does. A
    Parquet listing carries ``(file, size)`` pairs; Delta and Iceberg answer ``split`` from the listing
    just made (file paths are unique per commit), so no extra I/O either way."""
    files = partition.detail.get("files")
    if files is None:
        files = [(t.uri, t.start, t.stop, t.size_bytes) for t in adapter.split(partition)]
    return _digest(sorted(list(f) for f in files))


def _parse_cursor(text: str | None, sensor_name: str, keys: Sequence[str]) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        value, problem = None, f"not JSON ({exc})"
    else:
        problem = "" if isinstance(value, dict) and set(value) <= set(keys) else f"expected an object with {keys}"
    if problem:
        raise ValueError(
            f"sensor {sensor_name}: its cursor is {problem}: {text[:120]!r}; reset the cursor (UI: the sensor's "
            "page, or `dagster sensor cursor <name> --delete`) to start from the data there is now"
        )
    return value


@dataclass
class BatchCursor:
    """The batch sensor's cursor: ``seen`` (source -> partition key -> [version, fingerprint]) and
    ``retrain`` (training partition keys waiting for their re-scanned inputs, ``rerun: retrain``)."""

    seen: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    retrain: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str | None, sensor_name: str) -> BatchCursor:
        value = _parse_cursor(text, sensor_name, ("seen", "retrain"))
        return cls(seen=value.get("seen", {}), retrain=list(value.get("retrain", [])))

    def dumps(self) -> str:
        return json.dumps({"seen": self.seen, "retrain": sorted(set(self.retrain))}, sort_keys=True)


# ---- the stream sensor's thresholds (pure) -------------------------------------------------------------


@dataclass
class StreamCursor:
    """The stream sensor's cursor: per topic-partition the high watermark at its last request
    (``requested``) and at its last observation (``observed``), when the first record it has not asked
    for was seen (``pending_since``), the start of the next hour to ask for (``next_start``) and why the
    topic could not be read at the last tick (``kafka_error``: warned once per change, not every tick)."""

    requested: dict[str, int] = field(default_factory=dict)
    observed: dict[str, int] = field(default_factory=dict)
    pending_since: datetime | None = None
    next_start: datetime | None = None
    kafka_error: str | None = None

    @classmethod
    def parse(cls, text: str | None, sensor_name: str) -> StreamCursor:
        value = _parse_cursor(
            text, sensor_name, ("requested", "observed", "pending_since", "next_start", "kafka_error")
        )
        when = {
            k: datetime.fromisoformat(v) if v else None for k, v in value.items() if k.endswith(("_since", "_start"))
        }
        return cls(
            requested={str(k): int(v) for k, v in value.get("requested", {}).items()},
            observed={str(k): int(v) for k, v in value.get("observed", {}).items()},
            pending_since=when.get("pending_since"),
            next_start=when.get("next_start"),
            kafka_error=value.get("kafka_error"),
        )

    def dumps(self) -> str:
        return json.dumps(
            {
                "requested": self.requested,
                "observed": self.observed,
                "pending_since": self.pending_since.isoformat() if self.pending_since else None,
                "next_start": self.next_start.isoformat() if self.next_start else None,
                "kafka_error": self.kafka_error,
            },
            sort_keys=True,
        )


@dataclass(frozen=True)
class StreamProgress:
    """One tick's view of a topic: lag per partition (records not in a trained model), records since the
    last request, since when they wait, and whether the thresholds are met (``why``: which one)."""

    lag: dict[str, int]
    new_records: int
    pending_since: datetime | None
    due: bool
    why: str


def stream_progress(
    cursor: StreamCursor,
    watermarks: Mapping[str, tuple[int, int]],
    trained: Mapping[str, int],
    now: datetime,
    min_new_records: int,
    max_wait: timedelta,
) -> StreamProgress:
    """Lag and thresholds of a topic (``watermarks``: partition -> (low, high); ``trained``: partition ->
    the offset up to which a trained model read it)."""
    lag, new = {}, 0
    for p, (low, high) in sorted(watermarks.items()):
        lag[p] = max(0, high - max(trained.get(p, low), low))
        new += max(0, high - max(cursor.requested.get(p, trained.get(p, low)), low))
    pending_since = (cursor.pending_since or now) if new else None
    if new >= min_new_records:
        return StreamProgress(lag, new, pending_since, True, f"{new} new records >= min_new_records {min_new_records}")
    if pending_since is not None and now - pending_since >= max_wait:
        return StreamProgress(lag, new, pending_since, True, f"{new} new record(s) waited max_wait {max_wait}")
    return StreamProgress(lag, new, pending_since, False, f"{new} new record(s), below the thresholds")


def kafka_watermarks(source: KafkaSourceSpec, context: SourceContext) -> dict[str, tuple[int, int]]:
    """``{partition: (low, high)}`` of the source's topic, ``high`` the fetch high watermark
    (:meth:`primus_dagster.data.KafkaSource.watermarks`)."""
    with KafkaSource(source, context) as adapter:
        return {str(partition): marks for partition, marks in adapter.watermarks().items()}


# ---- the training partition to ask for (Dagster instance) ----------------------------------------------


class TrainingRequests:
    """One tick's view of the training asset and its inputs in the instance (see module docstring)."""

    def __init__(self, job: JobSpec, key_prefix: list[str] | None, instance: DagsterInstance, now: datetime):
        self.job, self.prefix, self.instance, self.now = job, list(key_prefix or []), instance, now
        self.key = AssetKey([*self.prefix, training_asset_name(job)])
        self.job_name = training_asset_job(job, key_prefix).name
        self.partitions = training_partitions_def(job)
        self.keys = list(self.partitions.get_partition_keys(current_time=now))
        self._key_set = set(self.keys)
        self.materialized = instance.get_materialized_partitions(self.key)
        self._source_partitions: dict[str, TimeWindowPartitionsDefinition] = {}
        self._checks: dict[str, list[Any]] = {}

    def source_partitions(self, source: SourceSpec) -> TimeWindowPartitionsDefinition:
        if source.granularity not in self._source_partitions:
            self._source_partitions[source.granularity] = time_partitions(
                source.granularity, self.job.dataset.start, self.job.dataset.end
            )
        return self._source_partitions[source.granularity]

    def source_key(self, source: SourceSpec, start: datetime) -> str:
        return self.source_partitions(source).get_partition_key_for_timestamp(start.timestamp())

    def window(self, key: str) -> TimeWindow:
        span = self.partitions.time_window_for_partition_key(key)
        return TimeWindow(span.start, span.end)

    def next_key(self) -> str | None:
        """The first partition after the latest materialised one (partitions train in order)."""
        done = [i for i, key in enumerate(self.keys) if key in self.materialized]
        index = done[-1] + 1 if done else 0
        return self.keys[index] if index < len(self.keys) else None

    def trained_on(self, span: Window) -> list[str]:
        """The materialised training partitions whose windows overlap ``span``, in order."""
        windows = {k: self.window(k) for k in self.materialized if k in self._key_set}
        return sorted(k for k, w in windows.items() if w.start < span.end and span.start < w.end)

    def _latest(self, asset_key: AssetKey, keys: list[str]) -> dict[str, EventLogRecord]:
        """The latest materialisation of each of ``keys`` that has one."""
        latest: dict[str, EventLogRecord] = {}
        wanted, cursor = set(keys), None
        while wanted:
            result = self.instance.fetch_materializations(
                AssetRecordsFilter(asset_key=asset_key, asset_partitions=keys),
                limit=max(100, 4 * len(keys)),
                cursor=cursor,
            )
            for record in result.records:
                if record.partition_key in wanted:
                    latest.setdefault(record.partition_key, record)
            if len(latest) == len(wanted) or not result.has_more:
                break
            cursor = result.cursor
        return latest

    def _failed_blocking_checks(self, asset_key: AssetKey, record: EventLogRecord) -> list[str]:
        if record.run_id not in self._checks:
            events = self.instance.get_records_for_run(record.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
            self._checks[record.run_id] = [e.event_log_entry.dagster_event.event_specific_data for e in events.records]
        return [
            e.check_name
            for e in self._checks[record.run_id]
            if e.asset_key == asset_key
            and e.partition in (None, record.partition_key)
            and not e.passed
            and e.blocking
            and e.severity == AssetCheckSeverity.ERROR
        ]

    def inputs(self, key: str) -> tuple[list[str], list[int]]:
        """What the training partition ``key`` still waits for, and the storage ids of its inputs'
        latest materialisations (their digest names the set of inputs a run trains on)."""
        waiting: list[str] = []
        storage_ids: list[int] = []
        inputs = training_inputs(self.job, self.window(key))
        if not any(inputs.values()):
            return [f"any input: no source partition feeds {key} (dataset range, batch_lag, label_delay)"], []
        for name, starts in inputs.items():
            source = self.job.dataset.source(name)
            asset_key = AssetKey([*self.prefix, name])
            keys = [self.source_key(source, s) for s in starts]
            late = [k for k, s in zip(keys, starts, strict=True) if complete_at(source, s) > self.now]
            if late:
                waiting.append(f"{name} {_some(late)} not complete (label_delay {source.label_delay})")
            latest = self._latest(asset_key, keys)
            missing = [k for k in keys if k not in latest and k not in late]
            if missing:
                waiting.append(f"{name} {_some(missing)} not materialised")
            for partition_key, record in sorted(latest.items()):
                failed = self._failed_blocking_checks(asset_key, record)
                if failed:
                    waiting.append(f"{name} {partition_key}: blocking check(s) {failed} failed")
                storage_ids.append(record.storage_id)
        return waiting, sorted(storage_ids)

    def request(self, key: str, trigger: str, newer_than_training: bool = False) -> tuple[RunRequest | None, str]:
        """A run of training partition ``key`` if its inputs are there and no run on them exists yet;
        ``newer_than_training``: only if an input was materialised after the partition (a retrain)."""
        status = self.instance.get_status_by_partition(self.key, [key], self.partitions) or {}
        if status.get(key) == AssetPartitionStatus.IN_PROGRESS:
            return None, f"training {key}: a run is in progress"
        waiting, storage_ids = self.inputs(key)
        if waiting:
            return None, f"training {key} waits for: " + "; ".join(waiting[:4])
        if newer_than_training:
            trained = self._latest(self.key, [key]).get(key)
            if trained is not None and max(storage_ids, default=0) < trained.storage_id:
                return None, f"training {key} waits for its changed inputs to be scanned again"
        tag = f"{key}@{_digest(storage_ids)}"
        existing = self.instance.get_run_records(RunsFilter(tags={TRAINING_INPUTS_TAG: tag}), limit=1)
        if existing:
            return None, f"training {key}: run {existing[0].dagster_run.run_id} already ran on these inputs"
        tags = {TRAINING_INPUTS_TAG: tag, TRIGGER_TAG: trigger}
        request = RunRequest(
            run_key=f"train:{tag}", job_name=self.job_name, asset_selection=[self.key], partition_key=key, tags=tags
        )
        return request, ""

    def next_request(self, trigger: str) -> tuple[RunRequest | None, str]:
        key = self.next_key()
        if key is None:
            return None, "training is up to date (no closed partition after the latest trained one)"
        return self.request(key, trigger)

    def trained_offsets(self, source: str) -> dict[str, int]:
        """Per topic-partition, the offset up to which the newest model read ``source``: the latest
        training partition's, or the live model's where it read further."""
        done = [k for k in self.keys if k in self.materialized]
        records = [self._latest(self.key, done[-1:]).get(done[-1]) if done else None]
        live_key = AssetKey([*self.prefix, live_asset_name(self.job)])
        records += self.instance.fetch_materializations(live_key, limit=1).records
        out: dict[str, int] = {}
        for record in records:
            materialization = record.asset_materialization if record is not None else None
            value = materialization.metadata.get("source_versions") if materialization is not None else None
            offsets = getattr(value, "value", None) or {}
            spans = offsets.get(source, {}).get("offsets", {}) if isinstance(offsets, dict) else {}
            for uri, span in spans.items():
                partition = uri.rpartition(":")[2]
                out[partition] = max(out.get(partition, 0), int(span[1]))
        return out

    def live_run_in_progress(self, job_name: str) -> bool:
        """Whether a run of the live job is queued or running (increments follow one another)."""
        active = [
            DagsterRunStatus.QUEUED,
            DagsterRunStatus.NOT_STARTED,
            DagsterRunStatus.STARTING,
            DagsterRunStatus.STARTED,
        ]
        return bool(self.instance.get_run_records(RunsFilter(job_name=job_name, statuses=active), limit=1))


def unmaterialized_inputs(
    job: JobSpec, instance: DagsterInstance, key_prefix: list[str] | None = None
) -> dict[str, list[str]]:
    """Lineage that does not add up: per materialised training partition, the source partitions it read
    (:func:`~primus_dagster.spec.training_inputs`) that are not Materialized in ``instance`` (``"<source>
    <key>"``); empty when every consumed input is. The sensors ask for a training partition only once its
    inputs are materialised, and the demo materialises them before it trains.

    Example::

        assert unmaterialized_inputs(job, DagsterInstance.get()) == {}
    """
    plan = TrainingRequests(job, key_prefix, instance, utc_now())
    out: dict[str, list[str]] = {}
    for key in (k for k in plan.keys if k in plan.materialized):
        missing: list[str] = []
        for name, starts in training_inputs(job, plan.window(key)).items():
            source = job.dataset.source(name)
            keys = [plan.source_key(source, start) for start in starts]
            asset_key = AssetKey([*plan.prefix, name])
            status = instance.get_status_by_partition(asset_key, keys, plan.source_partitions(source)) or {}
            missing += [f"{name} {k}" for k in keys if status.get(k) != AssetPartitionStatus.MATERIALIZED]
        if missing:
            out[key] = missing
    return out


def source_asset_jobs(
    job: JobSpec, sources: Iterable[SourceSpec], label: str, key_prefix: list[str] | None = None
) -> dict[str, AssetJob]:
    """Per granularity, ``<job>_<label>_<hour|day>_job``: the asset job of those of ``sources`` partitioned
    so (one partitions definition per job; a run selects some of its assets at one partition key)."""
    by_granularity: dict[str, list[AssetKey]] = {}
    for source in sources:
        by_granularity.setdefault(source.granularity, []).append(AssetKey([*(key_prefix or []), source.name]))
    return {
        granularity: define_asset_job(
            f"{_ident(job)}_{label}_{granularity}_job",
            selection=AssetSelection.assets(*keys),
            run_tags={RUN_KIND_TAG: "source"},
        )
        for granularity, keys in by_granularity.items()
    }


# ---- the sensors ----------------------------------------------------------------------------------------


def _result(
    context: SensorEvaluationContext, run_requests: list[RunRequest], notes: list[str], cursor: str, **kwargs: Any
) -> SensorResult:
    if run_requests:
        if notes:  # a tick that asks for runs shows no skip reason: the rest goes to its log
            context.log.info("; ".join(notes))
        return SensorResult(run_requests=run_requests, cursor=cursor, **kwargs)
    return SensorResult(skip_reason="; ".join(notes) or "nothing new", cursor=cursor, **kwargs)


def _complete_partitions(
    plan: TrainingRequests, source: SourceSpec, storage: PrimusStorageResource, windows: list[TimeWindow]
) -> list[ListedPartition]:
    """The ready and complete partitions of ``source`` over ``windows``, with their fingerprints."""
    out: dict[datetime, ListedPartition] = {}  # the windows may overlap
    with make_adapter(source, storage.source_context([source])) as adapter:
        for window in windows:
            for part in adapter.partitions(window):
                if part.ready and complete_at(source, part.start) <= plan.now and part.start not in out:
                    fingerprint = partition_fingerprint(adapter, part)
                    key = plan.source_key(source, part.start)
                    out[part.start] = ListedPartition(
                        source.name, key, part.start, part.version or fingerprint, fingerprint
                    )
    return list(out.values())


def build_batch_sensor(
    job: JobSpec,
    key_prefix: list[str] | None = None,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
    clock: Clock = utc_now,
    training: bool = True,
) -> SensorDefinition | None:
    """The batch sensor of ``job`` (module docstring); None when it has no Parquet/Delta/Iceberg source.
    ``training``: also ask for training partitions (the training asset is in the same Definitions)."""
    watched = [(stream, source) for stream, source in job.dataset.all_sources() if source.type != "kafka"]
    if not watched:
        return None
    name = f"{_ident(job)}_batch_sensor"
    source_keys = {source.name: AssetKey([*(key_prefix or []), source.name]) for _, source in watched}
    source_jobs = source_asset_jobs(job, (source for _, source in watched), "files", key_prefix)
    jobs = [*source_jobs.values()] + ([training_asset_job(job, key_prefix)] if training else [])

    @sensor(
        name=name,
        minimum_interval_seconds=max(1, int(job.automation.sensor_interval.total_seconds())),
        default_status=default_status,
        jobs=jobs,
        description=f"New and changed partitions of job `{job.name}`'s file and table sources -> source and "
        "training runs (docs/automation.md).",
    )
    def _batch_sensor(context: SensorEvaluationContext, storage: PrimusStorageResource) -> SensorResult:
        now = clock()
        cursor = BatchCursor.parse(context.cursor, name)
        plan = TrainingRequests(job, key_prefix, context.instance, now)
        next_key = plan.next_key() if training else None
        next_inputs = training_inputs(job, plan.window(next_key)) if next_key else {}
        notes: list[str] = []
        listed: list[ListedPartition] = []
        keep_from: dict[str, str] = {}
        for stream, source in watched:
            windows = [sensor_window(job, stream, source, now)]
            starts = next_inputs.get(source.name, [])
            if starts:
                windows.append(TimeWindow(starts[0], starts[-1] + granularity_step(source.granularity)))
            windows = [w for w in windows if w is not None]
            if not windows:
                continue
            keep_from[source.name] = plan.source_key(source, min(w.start for w in windows))
            try:
                listed += _complete_partitions(plan, source, storage, windows)
            except Exception as exc:  # one source failing to list must not stop the others
                notes.append(f"{source.name}: listing failed: {type(exc).__name__}: {exc}")
                context.log.warning(notes[-1])
        changes = diff_partitions(cursor.seen, listed, keep_from)
        scan: dict[str, dict[str, ListedPartition]] = {}
        retrain = set(cursor.retrain)
        observations = []
        for source_name in sorted({part.source for part in changes.new}):
            new = [part for part in changes.new if part.source == source_name]
            partitions = plan.source_partitions(job.dataset.source(source_name))
            keys = [part.key for part in new]
            status = context.instance.get_status_by_partition(source_keys[source_name], keys, partitions) or {}
            for part in new:  # one materialised before the sensor knew it is only recorded
                if status.get(part.key) != AssetPartitionStatus.MATERIALIZED:
                    scan.setdefault(part.key, {})[source_name] = part
        for previous, part in changes.changed:
            source = job.dataset.source(part.source)
            trained = plan.trained_on(training_span_fed_by(job, source, part.start))
            if not trained:
                scan.setdefault(part.key, {})[part.source] = part
                continue
            rerun = job.automation.rerun
            observations.append(
                AssetObservation(
                    asset_key=source_keys[part.source],
                    partition=part.key,
                    description=f"{part.source} {part.key} changed after training partitions {trained} learnt from it",
                    metadata={
                        "previous_version": previous,
                        "version": part.version,
                        "fingerprint": part.fingerprint,
                        "trained_partitions": MetadataValue.json(trained),
                        "rerun": rerun,
                    },
                )
            )
            context.log.warning(
                f"{part.source} {part.key}: new version {part.version} (was {previous}); rerun: {rerun}"
            )
            if rerun == "retrain":
                scan.setdefault(part.key, {})[part.source] = part
                retrain.update(trained)
        run_requests = [
            RunRequest(
                run_key=f"scan:{key}:" + ",".join(f"{s}@{p.fingerprint}" for s, p in sorted(parts.items())),
                job_name=source_jobs[job.dataset.source(next(iter(parts))).granularity].name,
                asset_selection=[source_keys[s] for s in sorted(parts)],
                partition_key=key,
                tags={TRIGGER_TAG: "batch sensor: new or changed partition"},
            )
            for key, parts in sorted(scan.items())
        ]
        if training:
            for key in sorted(retrain):
                request, note = plan.request(key, "batch sensor: retrain", newer_than_training=True)
                if request is not None:
                    run_requests.append(request)
                    retrain.discard(key)
                else:
                    notes.append(note)
            request, note = plan.next_request("batch sensor: inputs ready")
            if request is not None and request.partition_key not in {r.partition_key for r in run_requests}:
                run_requests.append(request)
            elif note:
                notes.append(note)
        next_cursor = BatchCursor(seen=changes.seen, retrain=sorted(retrain)).dumps()
        return _result(context, run_requests, notes, next_cursor, asset_events=observations)

    return _batch_sensor


def build_stream_sensor(
    job: JobSpec,
    stream: StreamSpec,
    source: KafkaSourceSpec,
    key_prefix: list[str] | None = None,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
    clock: Clock = utc_now,
    training: bool = True,
) -> SensorDefinition:
    """The stream sensor of Kafka ``source`` (module docstring)."""
    name = f"{_ident(job)}_{source.name}_stream_sensor"
    source_key = AssetKey([*(key_prefix or []), source.name])
    (hour_job,) = source_asset_jobs(job, [source], source.name, key_prefix).values()
    jobs = [hour_job] + ([training_asset_job(job, key_prefix)] if training else [])
    live = training and any(s.name == source.name for _, s in job.live_stream_sources()[0])
    live_job = live_asset_job(job, key_prefix) if live else None
    jobs += [live_job] if live_job is not None else []
    automation = job.automation

    @sensor(
        name=name,
        minimum_interval_seconds=max(1, int(automation.sensor_interval.total_seconds())),
        default_status=default_status,
        jobs=jobs,
        description=f"Offsets and lag of Kafka topic `{source.topic}` -> live increments, closed stream hours "
        f"and training runs of job `{job.name}` (min_new_records {automation.min_new_records}, max_wait "
        f"{automation.max_wait}).",
    )
    def _stream_sensor(context: SensorEvaluationContext, storage: PrimusStorageResource) -> SensorResult:
        now = clock()
        cursor = StreamCursor.parse(context.cursor, name)
        plan = TrainingRequests(job, key_prefix, context.instance, now)
        notes: list[str] = []
        run_requests: list[RunRequest] = []
        observations = []
        try:
            marks = kafka_watermarks(source, storage.source_context([source]))
        except Exception as exc:  # Kafka down or unconfigured: say so (every tick's skip reason), keep the cursor
            marks = None
            notes.append(f"{source.name}: cannot read the offsets of topic {source.topic!r}: {exc}")
            if notes[-1] != cursor.kafka_error:  # the log says it once per change, not every tick
                context.log.warning(notes[-1])
            cursor.kafka_error = notes[-1]
        if marks is not None and cursor.kafka_error is not None:
            context.log.info(f"{source.name}: topic {source.topic!r} readable again")
            cursor.kafka_error = None
        if marks is not None:
            trained = plan.trained_offsets(source.name)
            progress = stream_progress(cursor, marks, trained, now, automation.min_new_records, automation.max_wait)
            highs = {p: high for p, (_, high) in marks.items()}
            if highs != cursor.observed:
                observations.append(
                    AssetObservation(
                        asset_key=source_key,
                        description=f"topic {source.topic}: {sum(progress.lag.values())} records not in a trained model",
                        metadata={
                            "high_watermarks": MetadataValue.json(highs),
                            "lag": MetadataValue.json(progress.lag),
                            "total_lag": sum(progress.lag.values()),
                            "new_records": progress.new_records,
                            "trained_offsets": MetadataValue.json(trained),
                            "due": progress.due,
                        },
                    )
                )
                cursor.observed = highs
            cursor.pending_since = progress.pending_since
            requested, caught_up = [], False
            if progress.due and live_job is not None:
                if plan.live_run_in_progress(live_job.name):  # the next tick asks once it is done
                    notes.append(f"{progress.why}; a live increment is running")
                else:
                    run_requests.append(
                        RunRequest(
                            run_key=f"live:{_digest(highs)}",
                            job_name=live_job.name,
                            asset_selection=[AssetKey([*(key_prefix or []), live_asset_name(job)])],
                            tags={TRIGGER_TAG: f"stream sensor: {progress.why}", LIVE_TAG: source.name},
                        )
                    )
                    cursor.requested, cursor.pending_since = dict(highs), None
            # With live increments the thresholds gate those; closed hours are asked for once complete.
            if progress.due or live_job is not None:
                try:
                    requested, caught_up = _closed_hours(plan, source, cursor, storage, now)
                except Exception as exc:  # the listing failed: the next tick tries again
                    notes.append(f"{source.name}: listing the closed hours failed: {type(exc).__name__}: {exc}")
                    context.log.warning(notes[-1])
                why = progress.why if progress.due else "the hour is complete"
                run_requests += [
                    RunRequest(
                        run_key=f"hour:{key}",
                        job_name=hour_job.name,
                        asset_selection=[source_key],
                        partition_key=key,
                        tags={TRIGGER_TAG: f"stream sensor: {why}"},
                    )
                    for key in requested
                ]
                if caught_up and requested and live_job is None:
                    cursor.requested, cursor.pending_since = highs, None
                if progress.due and not requested and cursor.next_start is not None:
                    notes.append(
                        f"{progress.why}, but no closed hour to ask for yet: {cursor.next_start:%Y-%m-%dT%H:%M}Z is "
                        f"complete at {complete_at(source, cursor.next_start):%Y-%m-%dT%H:%M}Z once a record after "
                        "it exists"
                    )
            if not progress.due:
                notes.append(progress.why)
        if training:
            request, note = plan.next_request("stream sensor: inputs ready")
            if request is not None:
                run_requests.append(request)
            elif note:
                notes.append(note)
        return _result(context, run_requests, notes, cursor.dumps(), asset_events=observations)

    return _stream_sensor


def _closed_hours(
    plan: TrainingRequests, source: KafkaSourceSpec, cursor: StreamCursor, storage: PrimusStorageResource, now: datetime
) -> tuple[list[str], bool]:
    """Keys of the complete Kafka partitions from ``cursor.next_start`` on, in order, up to the first not
    ready, at most one training window's worth (advances ``cursor.next_start``), and whether that reached
    the last complete one."""
    step = granularity_step(source.granularity)
    last_end = _floor(now - source.label_delay, step)
    first = cursor.next_start
    if first is None:  # start with what the next training partition reads of the stream
        next_key = plan.next_key()
        starts = training_inputs(plan.job, plan.window(next_key)).get(source.name, []) if next_key else []
        first = starts[0] if starts else last_end - step
    first = max(first, plan.job.dataset.start)
    span = max(step, granularity_step(plan.job.training.partition))
    end = min(last_end, first + span)
    if end <= first:
        return [], True
    keys: list[str] = []
    with make_adapter(source, storage.source_context([source])) as adapter:
        for part in adapter.partitions(TimeWindow(first, end)):
            if not part.ready:
                break
            key = plan.source_key(source, part.start)
            status = plan.instance.get_status_by_partition(
                AssetKey([*plan.prefix, source.name]), [key], plan.source_partitions(source)
            )
            if (status or {}).get(key) != AssetPartitionStatus.MATERIALIZED:
                keys.append(key)
            cursor.next_start = part.start + step
    return keys, (cursor.next_start or first) >= last_end


def build_sensors(
    job: JobSpec,
    key_prefix: list[str] | None = None,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
    clock: Clock = utc_now,
    training: bool = True,
) -> list[SensorDefinition]:
    """The batch sensor of ``job`` (if it has file/table sources) and a stream sensor per Kafka source."""
    sensors: list[SensorDefinition] = []
    batch = build_batch_sensor(job, key_prefix, default_status, clock, training)
    if batch is not None:
        sensors.append(batch)
    for stream, source in job.dataset.all_sources():
        if isinstance(source, KafkaSourceSpec):
            sensors.append(build_stream_sensor(job, stream, source, key_prefix, default_status, clock, training))
    return sensors

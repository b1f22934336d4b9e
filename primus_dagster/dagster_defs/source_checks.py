"""The blocking asset checks of a source asset, one per concern, from what scanning its partition found.

``no_unreadable_files``, ``schema_matches_spec``, ``not_empty``, ``event_times_in_partition``,
``label_rate_in_range`` and ``freshness`` are declared on every source asset (:func:`source_check_specs`) and evaluated in the same step as
the materialisation (:func:`source_check_results`): a readable partition with problems is still
materialised with its metadata, and a failed check (severity ERROR, blocking) keeps the assets
downstream of it in the same run -- the training asset -- from running. A failed check names the
problems in its description and metadata (``problems``; the files in ``failing_files`` and
``failing_file``; per file and rule, rows and example values in ``findings``), and the partition in
its metadata (the checks are per asset, not per partition: Dagster's partitioned checks are a preview
feature). Dagster then fails the step with ``DagsterAssetCheckFailedError``, which names only the
checks: that is how a blocking check stops the run; the reasons are in the check results.

Values, whatever the source's quality action did with the rows (see
:data:`~primus_dagster.data.GATED_RULES`): ids that are not whole int64 (a fractional float,
NaN, a null; integer-valued floats and hashed string ids are ids) fail ``schema_matches_spec``; null
event times and event times outside the partition fail ``event_times_in_partition``.

The last two take their bounds from the source's ``checks`` block (:class:`~primus_dagster.spec.sources.SourceChecks`):
``label_rate_in_range`` -- positives / labelled rows of the partition within ``checks.label_rate``;
``freshness`` -- the partition's newest event time at most ``checks.max_staleness`` before its end (a
source that stopped writing mid-partition). A bound that is not configured does not fail: the check
passes and records the measured value with ``bound: not configured``. Both come from the one scan's
counters (label column and event-time column only), no second read.

Example::

    found = scan_with_findings(adapter, adapter.partition(start))   # from primus_dagster.data
    results = source_check_results(key, "2026-11-01-00:00", found, allow_empty=False)
    [(r.check_name, r.passed) for r in results]      # [("no_unreadable_files", True), ...]
"""

from __future__ import annotations

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, AssetKey, MetadataValue, PartitionsDefinition

from primus_dagster.dagster_defs.partitions import partitioned_check_spec
from primus_dagster.data import PartitionFindings, PartitionScan, RuleFinding, schema_hash
from primus_dagster.spec.durations import format_duration
from primus_dagster.spec.sources import SourceChecks

NO_UNREADABLE_FILES = "no_unreadable_files"
SCHEMA_MATCHES_SPEC = "schema_matches_spec"
NOT_EMPTY = "not_empty"
EVENT_TIMES_IN_PARTITION = "event_times_in_partition"
LABEL_RATE_IN_RANGE = "label_rate_in_range"
FRESHNESS = "freshness"
NOT_CONFIGURED = "not configured"

SOURCE_CHECK_DESCRIPTIONS = {
    NO_UNREADABLE_FILES: "every file / offset range of the partition could be read",
    SCHEMA_MATCHES_SPEC: "every file has the columns the spec maps, with usable types; every id is a whole number "
    "or a string (hashed)",
    NOT_EMPTY: "the partition has rows (unless the source sets allow_empty)",
    EVENT_TIMES_IN_PARTITION: "every row has an event time, inside the partition's time window",
    LABEL_RATE_IN_RANGE: "the share of positive labels lies in the source's checks.label_rate [lo, hi]",
    FRESHNESS: "the newest event time is at most checks.max_staleness before the partition's end",
}

#: The check each gated data-quality rule fails (the one place rules meet checks).
RULE_CHECKS = {
    "bad_id": SCHEMA_MATCHES_SPEC,
    "null_ts": EVENT_TIMES_IN_PARTITION,
    "ts_outside_partition": EVENT_TIMES_IN_PARTITION,
}

_LISTED_PROBLEMS = 20


def source_check_specs(asset_key: AssetKey, partitions: PartitionsDefinition | None = None) -> list[AssetCheckSpec]:
    """The blocking checks of the source asset ``asset_key``, partitioned as it is (each evaluation is
    recorded against the partition it scanned)."""
    return [
        partitioned_check_spec(name, partitions, asset=asset_key, description=description, blocking=True)
        for name, description in SOURCE_CHECK_DESCRIPTIONS.items()
    ]


def _error_lines(errors: list[tuple[str, str]]) -> list[str]:
    return [message if message.startswith(uri) else f"{uri}: {message}" for uri, message in errors]


def _result(
    asset_key: AssetKey,
    check_name: str,
    problems: list[str],
    metadata: dict[str, object],
    files: list[str] | None = None,
) -> AssetCheckResult:
    """Passed without ``problems``; else failed (severity ERROR) with the problems, and the ``files`` they
    are in, in its description and metadata."""
    if not problems:
        return AssetCheckResult(asset_key=asset_key, check_name=check_name, passed=True, metadata=metadata)
    listed = problems[:_LISTED_PROBLEMS]
    more = f"\n- … and {len(problems) - len(listed)} more" if len(problems) > len(listed) else ""
    failing = list(dict.fromkeys(files or []))
    file_metadata: dict[str, object] = {}
    if failing:
        file_metadata = {
            "failing_file": MetadataValue.path(failing[0]),
            "failing_files": MetadataValue.json(failing[:_LISTED_PROBLEMS]),
        }
    return AssetCheckResult(
        asset_key=asset_key,
        check_name=check_name,
        passed=False,
        severity=AssetCheckSeverity.ERROR,
        description="\n- ".join([f"{len(problems)} problem(s):", *listed]) + more,
        metadata={
            **metadata,
            **file_metadata,
            "problem_count": MetadataValue.int(len(problems)),
            "problems": MetadataValue.json(listed),
        },
    )


def _rule_metadata(findings: list[RuleFinding]) -> dict[str, object]:
    """Rows and example values per file and rule, for a check that gated rules fail."""
    if not findings:
        return {}
    return {
        "bad_rows": MetadataValue.int(sum(f.rows for f in findings)),
        "findings": MetadataValue.json([f.as_json() for f in findings[:_LISTED_PROBLEMS]]),
    }


def label_rate_problems(scan: PartitionScan, checks: SourceChecks) -> tuple[list[str], dict[str, object]]:
    """The ``label_rate_in_range`` problems of ``scan`` and the check's metadata (rate, counts, bound)."""
    metadata: dict[str, object] = {
        "positives": MetadataValue.int(scan.positives),
        "labelled_rows": MetadataValue.int(scan.labelled_rows),
        "bound": MetadataValue.text(NOT_CONFIGURED if checks.label_rate is None else str(list(checks.label_rate))),
    }
    if not scan.labelled_rows:
        return [], {**metadata, "reason": MetadataValue.text("no labelled rows (not_empty decides on empty)")}
    rate = scan.positives / scan.labelled_rows
    metadata["label_rate"] = MetadataValue.float(rate)
    if checks.label_rate is None or checks.label_rate[0] <= rate <= checks.label_rate[1]:
        return [], metadata
    lo, hi = checks.label_rate
    return [
        f"label rate {rate:.4g} ({scan.positives} positive(s) of {scan.labelled_rows} labelled rows) "
        f"outside checks.label_rate [{lo}, {hi}]"
    ], metadata


def freshness_problems(scan: PartitionScan, checks: SourceChecks) -> tuple[list[str], dict[str, object]]:
    """The ``freshness`` problems of ``scan`` (its newest event time too long before the partition's end)
    and the check's metadata (newest event time, staleness, bound)."""
    bound = checks.max_staleness
    metadata: dict[str, object] = {
        "bound": MetadataValue.text(NOT_CONFIGURED if bound is None else format_duration(bound))
    }
    if scan.max_ts is None:
        return [], {**metadata, "reason": MetadataValue.text("no event times (not_empty decides on empty)")}
    staleness = scan.partition.end - scan.max_ts
    metadata["newest_event_time"] = MetadataValue.timestamp(scan.max_ts)
    metadata["staleness_s"] = MetadataValue.float(staleness.total_seconds())
    if bound is None or staleness <= bound:
        return [], metadata
    return [
        f"newest event time {scan.max_ts.isoformat()} is {format_duration(staleness)} before the partition's end "
        f"{scan.partition.end.isoformat()}: more than checks.max_staleness {format_duration(bound)}"
    ], metadata


def source_check_results(
    asset_key: AssetKey,
    partition_key: str,
    found: PartitionFindings,
    allow_empty: bool,
    checks: SourceChecks | None = None,
) -> list[AssetCheckResult]:
    """One result per check of :func:`source_check_specs` for the scanned partition ``partition_key``
    (``found``: :func:`scan_with_findings`); ``checks``: the source's bounds (default: none configured)."""
    checks = checks or SourceChecks()
    scan = found.scan
    partition = scan.partition
    partition_metadata = {"partition": MetadataValue.text(partition_key), "tasks": MetadataValue.int(scan.tasks)}

    def by_check(name: str) -> list[RuleFinding]:
        return found.of(*(rule for rule, check in RULE_CHECKS.items() if check == name))

    empty_problems = []
    if scan.rows == 0 and not allow_empty:
        cause = "no row could be read" if scan.errors else "no rows"
        empty_problems.append(
            f"partition {partition.key} of {partition.source} is empty ({cause}); "
            "set allow_empty: true if that is expected"
        )

    bounds = f"[{partition.start.isoformat()}, {partition.end.isoformat()})"
    event_time_metadata: dict[str, object] = {**partition_metadata, "partition_window": MetadataValue.text(bounds)}
    if scan.min_ts is not None and scan.max_ts is not None:
        found_range = f"{scan.min_ts.isoformat()} .. {scan.max_ts.isoformat()}"
        event_time_metadata["event_time_range"] = MetadataValue.text(found_range)
    time_findings = by_check(EVENT_TIMES_IN_PARTITION)
    time_problems = [f.line() for f in time_findings]

    id_findings = by_check(SCHEMA_MATCHES_SPEC)
    schema_metadata = {
        **partition_metadata,
        "schema_hash": MetadataValue.text(schema_hash(scan.schema) if scan.schema is not None else ""),
        **_rule_metadata(id_findings),
    }
    schema_problems = _error_lines(found.schema_errors) + [f.line() for f in id_findings]
    schema_files = [uri for uri, _ in found.schema_errors] + [f.uri for f in id_findings]
    label_problems, label_metadata = label_rate_problems(scan, checks)
    fresh_problems, fresh_metadata = freshness_problems(scan, checks)
    return [
        _result(
            asset_key,
            NO_UNREADABLE_FILES,
            _error_lines(found.read_errors),
            partition_metadata,
            [uri for uri, _ in found.read_errors],
        ),
        _result(asset_key, SCHEMA_MATCHES_SPEC, schema_problems, schema_metadata, schema_files),
        _result(asset_key, NOT_EMPTY, empty_problems, {**partition_metadata, "rows": MetadataValue.int(scan.rows)}),
        _result(
            asset_key,
            EVENT_TIMES_IN_PARTITION,
            time_problems,
            {**event_time_metadata, **_rule_metadata(time_findings)},
            [f.uri for f in time_findings],
        ),
        _result(asset_key, LABEL_RATE_IN_RANGE, label_problems, {**partition_metadata, **label_metadata}),
        _result(asset_key, FRESHNESS, fresh_problems, {**partition_metadata, **fresh_metadata}),
    ]

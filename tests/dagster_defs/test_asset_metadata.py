"""The Dagster metadata users expect of the job's assets: code references (each asset's function and the
job spec), column lineage in their definitions (canonical columns from the source's native ones; the
training asset's from the source assets) and a freshness policy per source asset -- and none of it warns at definitions load."""

from __future__ import annotations

import subprocess
import sys
import warnings
from datetime import timedelta
from pathlib import Path

from dagster import (
    AssetKey,
    AssetsDefinition,
    CodeReferencesMetadataValue,
    Definitions,
    LocalFileCodeReference,
    TableColumnDep,
    asset,
)

from primus_dagster.dagster_defs import build_definitions, build_source_assets
from primus_dagster.dagster_defs import definitions as definitions_module
from primus_dagster.dagster_defs import live_asset as live_asset_module
from primus_dagster.dagster_defs import source_assets as source_assets_module
from primus_dagster.dagster_defs import training_asset as training_asset_module
from primus_dagster.dagster_defs.definitions import CODE_REFERENCES
from primus_dagster.dagster_defs.source_assets import COLUMN_LINEAGE, source_column_lineage, source_freshness_policy
from primus_dagster.dagster_defs.training_asset import training_column_lineage
from primus_dagster.data import canonical_schema
from primus_dagster.spec import parse_job_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from jobkit import make_job

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "job.yaml"

SPEC = """
name: t
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: 1d
      sources:
        - name: clicks
          type: parquet
          path: pq
          columns: {ts: event_time, label: click, id: sample_id, dense: [d0, d1], sparse: {user: user_id}}
        - name: views
          type: parquet
          granularity: day
          label_delay: 6h
          path: pv
          columns: {ts: t, dense: vec, lists: {tags: tag_ids}, weights: {tags: tag_weights}}
training:
  partition: hour
"""


def references(assets_def: AssetsDefinition) -> list:
    (metadata,) = assets_def.metadata_by_key.values()
    value = metadata[CODE_REFERENCES]
    assert isinstance(value, CodeReferencesMetadataValue)
    return value.code_references


def lineage_of(lineage) -> dict[str, list[tuple[str, str]]]:
    return {
        name: [(dep.asset_key.to_user_string(), dep.column_name) for dep in deps]
        for name, deps in lineage.deps_by_column.items()
    }


def test_every_asset_links_to_its_function_and_the_job_spec() -> None:
    defs = build_definitions(EXAMPLE)  # sources, training asset and (a Kafka stream) the live asset
    modules = {
        "ctr_demo_model": training_asset_module.__file__,
        "ctr_demo_live_model": live_asset_module.__file__,
    }
    assets_defs = list(defs.assets)
    assert len(assets_defs) == 6
    for assets_def in assets_defs:
        name = assets_def.key.to_user_string()
        function, spec = references(assets_def)
        assert isinstance(function, LocalFileCodeReference) and isinstance(spec, LocalFileCodeReference)
        assert function.file_path == modules.get(name, source_assets_module.__file__)
        assert function.line_number and function.line_number > 1
        assert (spec.file_path, spec.label) == (str(EXAMPLE), "job spec")
    Definitions.validate_loadable(defs)


@asset
def report() -> None:
    """A user's own asset, downstream of nothing."""


def test_extra_assets_get_their_own_reference_and_existing_references_stay(tmp_path: Path) -> None:
    (referenced,) = definitions_module.with_code_references([report])
    (again,) = definitions_module.with_code_references([referenced])  # already referenced: unchanged
    (function,) = references(again)
    assert function.file_path == __file__ and function.line_number is not None
    env = make_job(tmp_path, hours=0)
    defs = build_definitions(env["job_path"], extra_assets=[report])
    by_name = {a.key.to_user_string(): a for a in defs.assets}
    assert set(by_name) == {"imp", "events", "train_test_model", "report"}
    assert [r.file_path for r in references(by_name["report"])] == [__file__]  # no job spec: not the job's
    assert references(by_name["imp"])[1].file_path == str(env["job_path"].resolve())


def test_source_lineage_maps_each_canonical_column_to_its_native_ones() -> None:
    job = parse_job_spec(SPEC)
    clicks, views = (source for _, source in job.dataset.all_sources())
    assert lineage_of(source_column_lineage(clicks, AssetKey("clicks"))) == {
        "sample_id": [("clicks", "sample_id")],
        "ts": [("clicks", "event_time")],
        "label": [("clicks", "click")],
        "dense": [("clicks", "d0"), ("clicks", "d1")],  # stacked into one list column
        "user": [("clicks", "user_id")],  # sparse, renamed
    }
    # no label nor id mapped: no entry; a dense list column; a list column and its weights
    assert lineage_of(source_column_lineage(views, AssetKey(["pre", "views"]))) == {
        "ts": [("pre/views", "t")],
        "dense": [("pre/views", "vec")],
        "tags": [("pre/views", "tag_ids")],
        "tags.weights": [("pre/views", "tag_weights")],
    }
    for source in (clicks, views):  # every entry a column of the canonical schema
        dense = source.columns.dense
        canonical = canonical_schema(source.columns, len(dense) if isinstance(dense, list) else -1)
        assert set(source_column_lineage(source, AssetKey("x")).deps_by_column) <= set(canonical.names)


def test_the_asset_definitions_carry_the_column_lineage(tmp_path: Path) -> None:
    job = parse_job_spec(SPEC)
    by_name = {a.key.to_user_string(): a for a in build_source_assets(job, key_prefix=["pre"])}
    (metadata,) = by_name["pre/clicks"].metadata_by_key.values()
    lineage = metadata[COLUMN_LINEAGE].value
    assert lineage.deps_by_column["ts"] == [
        TableColumnDep(asset_key=AssetKey(["pre", "clicks"]), column_name="event_time")
    ]
    assert lineage == source_column_lineage(job.dataset.source("clicks"), AssetKey(["pre", "clicks"]))
    env = make_job(tmp_path, hours=0)
    defs = build_definitions(env["job_path"])
    training = next(a for a in defs.assets if a.key == AssetKey("train_test_model"))
    (metadata,) = training.metadata_by_key.values()
    assert metadata[COLUMN_LINEAGE].value == training_column_lineage(env["job"])


def test_training_lineage_names_the_same_column_of_every_source(tmp_path: Path) -> None:
    job = make_job(tmp_path, hours=0)["job"]  # imp (batch) and events (stream) share one column mapping
    lineage = lineage_of(training_column_lineage(job, ["p"]))
    assert sorted(lineage["ts"]) == [("p/events", "ts"), ("p/imp", "ts")]
    assert sorted(lineage["dense"]) == [("p/events", "dense"), ("p/imp", "dense")]
    assert set(lineage) == {"sample_id", "ts", "label", "dense", "user_id", "item_id", "topic_id"}


def test_freshness_policy_follows_granularity_and_label_delay() -> None:
    job = parse_job_spec(SPEC)
    clicks, views = (source for _, source in job.dataset.all_sources())
    hourly = source_freshness_policy(clicks)  # hourly, no label delay
    assert hourly.fail_window.to_timedelta() == timedelta(hours=2)
    assert hourly.warn_window.to_timedelta() == timedelta(minutes=90)
    daily = source_freshness_policy(views)  # daily, label delay 6h
    assert daily.fail_window.to_timedelta() == timedelta(days=2, hours=6)
    assert daily.warn_window.to_timedelta() == timedelta(days=1, hours=18)
    by_name = {a.key.to_user_string(): a for a in build_source_assets(job)}
    (spec,) = by_name["views"].specs
    assert spec.freshness_policy == daily
    # the example's hourly sources with a 24h label delay
    defs = build_definitions(EXAMPLE)
    (spec,) = next(a for a in defs.assets if a.key == AssetKey("impressions_parquet")).specs
    assert spec.freshness_policy.fail_window.to_timedelta() == timedelta(hours=26)


def test_building_the_definitions_warns_nothing(tmp_path: Path) -> None:
    env = make_job(tmp_path, hours=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        defs = build_definitions(env["job_path"])
        Definitions.validate_loadable(defs)
    assert [str(w.message) for w in caught] == []
    # a fresh interpreter, every warning an error: imports and the reference code location as well
    code = (
        "from dagster import Definitions\n"
        "from primus_dagster.dagster_defs import build_definitions\n"
        f"Definitions.validate_loadable(build_definitions({str(EXAMPLE)!r}))\n"
        "import definitions\n"
        "Definitions.validate_loadable(definitions.defs)\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""

"""The job spec: the reference example loads, bad specs fail naming the key path."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from primus_dagster.spec import (
    JobSpec,
    SpecError,
    job_spec_json_schema,
    load_job_spec,
    parse_duration,
    parse_job_spec,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "job.yaml"

MINIMAL = """
name: tiny
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: 2h
      sources:
        - name: clicks
          type: parquet
          path: p
          columns: {ts: t, label: y, dense: [a, b]}
"""


def test_reference_example_loads() -> None:
    job = load_job_spec(EXAMPLE)
    names = [s.name for _, s in job.dataset.all_sources()]
    assert names == ["impressions_parquet", "impressions_delta", "impressions_iceberg", "events_kafka"]
    assert {s.type for _, s in job.dataset.all_sources()} == {"parquet", "delta", "iceberg", "kafka"}
    assert job.dataset.streams[0].window == timedelta(hours=24)
    assert job.dataset.source("events_kafka").label_delay == timedelta(minutes=15)


def test_minimal_spec_gets_defaults() -> None:
    job = parse_job_spec(MINIMAL)
    source = job.dataset.source("clicks")
    assert source.granularity == "hour" and source.kind == "batch"
    assert source.success_marker == "_SUCCESS"
    assert job.training.mode == "batch_then_stream"
    assert job.dataset.start.tzinfo is not None


def test_round_trip_through_json() -> None:
    job = load_job_spec(EXAMPLE)
    again = JobSpec.model_validate_json(job.model_dump_json())
    assert again == job


def _mutate(path: str, value: object, delete: bool = False) -> str:
    data = yaml.safe_load(MINIMAL)
    node = data
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if key.isdigit() else node[key]
    last = keys[-1]
    if delete:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return yaml.safe_dump(data)


BAD_SPECS = [
    # (description, yaml text, expected key path, expected words in the message)
    (
        "misspelled source key",
        _mutate("dataset.streams.0.sources.0.pathh", "p"),
        "dataset.streams[0].sources[0].pathh",
        "unknown key",
    ),
    ("negative window", _mutate("dataset.streams.0.window", "-1h"), "dataset.streams[0].window", "positive"),
    ("window not a duration", _mutate("dataset.streams.0.window", "soon"), "dataset.streams[0].window", "duration"),
    (
        "unknown source type",
        _mutate("dataset.streams.0.sources.0.type", "csv"),
        "dataset.streams[0].sources[0]",
        "parquet",
    ),
    (
        "bad granularity",
        _mutate("dataset.streams.0.sources.0.granularity", "minute"),
        "dataset.streams[0].sources[0].granularity",
        "hour",
    ),
    ("bad kind", _mutate("dataset.streams.0.sources.0.kind", "micro"), "dataset.streams[0].sources[0].kind", "batch"),
    (
        "missing path",
        _mutate("dataset.streams.0.sources.0.path", None, delete=True),
        "dataset.streams[0].sources[0].path",
        "required",
    ),
    ("misspelled top-level key", _mutate("trainning", {"mode": "batch"}), "trainning", "unknown key"),
    ("bad training mode", _mutate("training", {"mode": "online"}), "training.mode", "batch_then_stream"),
    (
        "negative label delay",
        _mutate("dataset.streams.0.sources.0.label_delay", "-5m"),
        "dataset.streams[0].sources[0].label_delay",
        "negative",
    ),
    ("window not whole hours", _mutate("dataset.streams.0.window", "90m"), "dataset.streams[0]", "whole number"),
    ("bad job name", _mutate("name", "Tiny Job"), "name", "pattern"),
    (
        "replicas out of bounds",
        _mutate("pools", {"data": {"replicas": 9, "max_replicas": 4}}),
        "pools.data",
        "max_replicas",
    ),
    (
        "thresholds inverted",
        _mutate("scaling", {"horizontal": {"scale_up_threshold": 0.2, "scale_down_threshold": 0.5}}),
        "scaling.horizontal",
        "below",
    ),
    (
        "template without HH",
        _mutate("dataset.streams.0.sources.0.layout", "template").replace(
            "path: p", "path: p\n      template: '{YYYY}{MM}{DD}'"
        ),
        "dataset.streams[0].sources[0]",
        "{HH}",
    ),
    (
        "no feature at all",
        _mutate("dataset.streams.0.sources.0.columns", {"ts": "t", "dense": []}),
        "dataset.streams[0].sources[0].columns",
        "no features",
    ),
    (
        "unknown metric",
        _mutate("scaling", {"horizontal": {"metrics": [{"name": "gpu", "weight": 1}]}}),
        "scaling.horizontal.metrics[0].name",
        "buffer_fill",
    ),
    ("no streams", _mutate("dataset.streams", []), "dataset.streams", "at least 1"),
    ("string for an integer", _mutate("data", {"planner_threads": "four"}), "data.planner_threads", "integer"),
    ("end before start", _mutate("dataset.end", "2026-10-01"), "dataset", "after start"),
]


@pytest.mark.parametrize("what,text,key_path,words", BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
def test_bad_spec_names_the_key_path(what: str, text: str, key_path: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec(text, "bad.yaml")
    message = str(info.value)
    assert "bad.yaml" in message
    paths = [path for path, _ in info.value.problems]
    assert any(p == key_path or p.startswith(key_path + " ") for p in paths), (what, paths, message)
    assert words in message, (what, message)


def test_offending_value_and_line_are_reported() -> None:
    text = MINIMAL.replace("window: 2h", "window: -1h")
    with pytest.raises(SpecError) as info:
        parse_job_spec(text, "job.yaml")
    ((path, message),) = info.value.problems
    assert path == f"dataset.streams[0].window (line {text.splitlines().index('      window: -1h') + 1})"
    assert "'-1h'" in message


def test_several_problems_are_all_reported() -> None:
    text = MINIMAL.replace("window: 2h", "window: 0h").replace("path: p", "path: p\n          colour: red")
    with pytest.raises(SpecError) as info:
        parse_job_spec(text)
    assert len(info.value.problems) == 2


def test_duplicate_source_names_rejected() -> None:
    text = (
        MINIMAL
        + """    - name: other
      sources:
        - name: clicks
          type: kafka
          topic: t
          columns: {ts: t, dense: [a]}
"""
    )
    with pytest.raises(SpecError, match="used twice"):
        parse_job_spec(text)


def test_join_must_name_stream_sources() -> None:
    text = MINIMAL.replace("window: 2h", "window: 2h\n      join: {left: clicks, right: views, key: id}")
    with pytest.raises(SpecError, match="'views' is not one of this stream's sources"):
        parse_job_spec(text)


@pytest.mark.parametrize("text", ["", "- a list", "name: [unclosed"])
def test_not_a_mapping_or_bad_yaml(text: str) -> None:
    with pytest.raises(SpecError):
        parse_job_spec(text)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_job_spec(tmp_path / "nope.yaml")


def test_json_schema_export_validates_keys() -> None:
    schema = json.loads(job_spec_json_schema())
    assert schema["additionalProperties"] is False
    assert "dataset" in schema["required"]
    source_defs = [d for d in schema["$defs"] if d.endswith("SourceSpec")]
    assert len(source_defs) == 4


@pytest.mark.parametrize("text,seconds", [("30m", 1800), ("1h", 3600), ("2d", 172800), ("1.5h", 5400), (90, 90)])
def test_parse_duration(text: object, seconds: int) -> None:
    assert parse_duration(text).total_seconds() == seconds


def test_owners_and_tags_are_checked_as_dagster_takes_them() -> None:
    job = parse_job_spec(MINIMAL + "owners: [ml@example.com, 'team:recsys']\ntags: {domain: ads, tier: ''}\n")
    assert job.owners == ["ml@example.com", "team:recsys"] and job.tags == {"domain": "ads", "tier": ""}
    with pytest.raises(SpecError, match=r"owners \['recsys'\]: each must be an e-mail address or team:<name>"):
        parse_job_spec(MINIMAL + "owners: [recsys]\n")
    with pytest.raises(SpecError, match=r"tags \['a b: x'\]"):
        parse_job_spec(MINIMAL + "tags: {'a b': x}\n")


def test_mtrm_without_a_stream_source_is_refused_when_asked_for_and_advised_against_by_default(capsys) -> None:
    """MINIMAL's one source is of kind batch: MTRM's adapt tower would learn no stream."""
    asked = MINIMAL + "training: {mode: mixed, model: {type: mtrm}}\n"
    with pytest.raises(SpecError, match=r"needs a source of kind 'stream' \(its adapt tower learns it\).*'single'"):
        parse_job_spec(asked)
    (advice,) = parse_job_spec(MINIMAL).advisories()  # the default model type
    assert "set training.model.type: single" in advice
    assert parse_job_spec(MINIMAL + "training: {model: {type: single}}\n").advisories() == []

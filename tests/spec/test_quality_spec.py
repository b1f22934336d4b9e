"""The data-quality policy and path keys of a source: defaults, every key accepted, clear errors."""

from __future__ import annotations

import pytest

from primus_dagster.spec import SpecError, parse_job_spec
from primus_dagster.spec.sources import REPAIRS, KafkaQualityPolicy, QualityPolicy

SPEC = """
name: q
dataset:
  start: 2026-11-01
  streams:
    - name: s
      sources:
        - {{name: src, type: {type}, kind: {kind}, {where}, {extra}columns: {{ts: t, label: y, dense: [a]}}}}
"""
WHERE = {"parquet": "path: p", "delta": "uri: d", "iceberg": "table: ns.t", "kafka": "topic: t"}


def source(type_: str = "parquet", kind: str = "batch", extra: str = "", where: str | None = None):
    text = SPEC.format(type=type_, kind=kind, where=where or WHERE[type_], extra=extra)
    return parse_job_spec(text).dataset.source("src")


def problems(**kw: str) -> str:
    with pytest.raises(SpecError) as info:
        source(**kw)
    return str(info.value)


@pytest.mark.parametrize("type_", list(WHERE))
def test_defaults_a_user_expects(type_: str) -> None:
    batch, stream = source(type_).quality.actions("batch"), source(type_, "stream").quality.actions("stream")
    assert batch["null_label"] == "drop" and stream["null_label"] == "repair"  # a stream row may not be clicked yet
    assert batch["dense_invalid"] == "repair" and batch["bad_id"] == "repair"
    assert batch["null_ts"] == "drop" and batch["ts_outside_partition"] == "repair"
    assert ("missing_field" in batch) == (type_ == "kafka")
    assert set(batch) <= set(REPAIRS)


@pytest.mark.parametrize("rule", sorted(set(KafkaQualityPolicy.model_fields)))
@pytest.mark.parametrize("action", ["repair", "drop", "fail"])
def test_every_rule_takes_every_action(rule: str, action: str) -> None:
    spec = source("kafka", extra=f"quality: {{{rule}: {action}}}, ")
    assert spec.quality.actions("batch")[rule] == action


def test_unknown_action_and_rule_are_named() -> None:
    text = problems(extra="quality: {dense_invalid: ignore}, ")
    assert "quality.dense_invalid" in text and "repair" in text and "drop" in text and "fail" in text
    assert "quality.nan_dense" in problems(extra="quality: {nan_dense: drop}, ")


def test_missing_field_is_a_kafka_rule_only() -> None:
    assert "quality.missing_field" in problems(extra="quality: {missing_field: drop}, ")
    assert set(QualityPolicy.model_fields) < set(KafkaQualityPolicy.model_fields)


@pytest.mark.parametrize(
    "type_, where, key",
    [("parquet", "path: ../elsewhere", "path"), ("parquet", "path: a/../../b", "path"), ("delta", "uri: ../t", "uri")],
)
def test_relative_paths_cannot_leave_the_data_root(type_: str, where: str, key: str) -> None:
    text = problems(type_=type_, where=where)
    assert key in text and "leaves the data root" in text


@pytest.mark.parametrize(
    "type_, where",
    [
        ("parquet", "path: /abs/data"),
        ("parquet", "path: s3://bucket/../x"),
        ("parquet", "path: a/../b"),
        ("delta", "uri: file:///tmp/t"),
        ("delta", "uri: /tmp/t"),
    ],
)
def test_absolute_paths_urls_and_inner_relative_paths_are_allowed(type_: str, where: str) -> None:
    source(type_, where=where)


def test_iceberg_warehouse_stays_inside_the_data_root() -> None:
    assert "leaves the data root" in problems(type_="iceberg", extra="catalog: {warehouse: ../w}, ")
    assert source("iceberg", extra="catalog: {warehouse: /w}, ").catalog.warehouse == "/w"

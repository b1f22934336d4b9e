"""Source locations stay inside the data root: every path form is checked by one rule at load time.

``path``, ``template``, ``uri``, ``catalog.warehouse`` and ``catalog.properties.warehouse`` may not climb
out with ``..``, and a ``file://`` URI must be absolute; the error names the source and the key. Absolute
paths and ``file:///`` URIs are the explicit opt-out; object-store URLs are never checked.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from primus_dagster.spec import SpecError, parse_job_spec
from primus_dagster.spec.sources import ParquetSourceSpec, outside_root

SPEC = """
name: q
dataset:
  start: 2026-11-01
  streams:
    - name: s
      sources:
        - {{name: imp, type: {type}, {where}, columns: {{ts: t, label: y, dense: [a]}}}}
"""
TEMPLATE = "layout: template, template: '{t}'"


def source(type_: str, where: str):
    return parse_job_spec(SPEC.format(type=type_, where=where)).dataset.source("imp")


def problems(type_: str, where: str) -> str:
    with pytest.raises(SpecError) as info:
        source(type_, where)
    return str(info.value)


@pytest.mark.parametrize(
    "type_, where, key, says",
    [
        ("parquet", "path: p, " + TEMPLATE.format(t="../../../../other/{YYYY}{MM}{DD}/{HH}"), "template", "path"),
        ("parquet", "path: p, " + TEMPLATE.format(t="{YYYY}/../../x/{HH}"), "template", "path"),
        ("parquet", "path: /abs/p, " + TEMPLATE.format(t="../{YYYY}{MM}{DD}/{HH}"), "template", "path"),
        ("parquet", "path: 'file://../x'", "path", "not absolute"),
        ("parquet", "path: 'file://pq'", "path", "not absolute"),
        ("delta", "uri: 'file://../x'", "uri", "not absolute"),
        ("delta", "uri: a/../../t", "uri", "leaves the data root"),
        ("iceberg", "table: ns.t, catalog: {warehouse: 'file://../w'}", "catalog.warehouse", "not absolute"),
        ("iceberg", "table: ns.t, catalog: {properties: {warehouse: ../w}}", "catalog.properties.warehouse", "leaves"),
    ],
)
def test_every_path_form_that_leaves_the_root_is_refused_naming_source_and_key(
    type_: str, where: str, key: str, says: str
) -> None:
    text = problems(type_, where)
    assert f"source 'imp': {key}:" in text and says in text
    assert "dataset.streams[0].sources[0]" in text  # the loader locates it in the file


@pytest.mark.parametrize(
    "type_, where",
    [
        ("parquet", "path: parquet/imp, " + TEMPLATE.format(t="{YYYY}{MM}{DD}/{HH}")),
        ("parquet", "path: p, " + TEMPLATE.format(t="x/../{YYYY}-{MM}-{DD}/{HH}")),  # stays under path
        ("parquet", "path: a/../b"),
        ("parquet", "path: /abs/p"),  # the explicit opt-out
        ("parquet", "path: 's3://bucket/../x', " + TEMPLATE.format(t="{YYYY}/{MM}/{DD}/{HH}")),
        ("delta", "uri: 'file:///abs/t'"),
        ("delta", "uri: 'file://localhost/abs/t'"),
        ("delta", "uri: 'gs://bucket/t'"),
        ("iceberg", "table: ns.t, catalog: {warehouse: wh, properties: {warehouse: 'file:///abs/w'}}"),
    ],
)
def test_paths_inside_the_root_absolute_paths_and_urls_load(type_: str, where: str) -> None:
    source(type_, where)


def test_the_model_alone_refuses_with_a_validation_error_on_the_key() -> None:
    base = {"name": "imp", "type": "parquet", "columns": {"ts": "t", "dense": ["a"]}}
    with pytest.raises(ValidationError) as info:
        ParquetSourceSpec.model_validate({**base, "path": "p", "layout": "template", "template": "../{YYYY}/{HH}"})
    (error,) = info.value.errors()
    assert error["loc"] == ("template",) and "source 'imp'" in error["msg"]
    with pytest.raises(ValidationError) as info:
        ParquetSourceSpec.model_validate({**base, "path": "../elsewhere"})
    assert info.value.errors()[0]["loc"] == ("path",)


def test_the_rule_with_a_root_follows_symlinks_and_names_link_and_target(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "inner").mkdir(parents=True)
    outside.mkdir()
    os.symlink(outside, root / "out")
    os.symlink(root / "inner", root / "in")
    assert outside_root("in/x", str(root)) is None  # a symlink inside the root is fine
    assert outside_root(str(root / "inner" / "f"), str(root)) is None
    problem = outside_root("out/x", str(root))
    assert problem is not None and f"symlink {root / 'out'} -> {outside}" in problem
    problem = outside_root(str(tmp_path / "elsewhere"), str(root))
    assert problem is not None and "outside the data root" in problem
    assert outside_root("s3://bucket/x", str(root)) is None

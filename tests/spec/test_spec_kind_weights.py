"""w_i of the mixture prioritisation: one source of truth, ``dataset.streams[].weight``."""

from __future__ import annotations

import pytest

from primus_dagster.spec import SpecError, parse_job_spec

COLUMNS = "columns: {ts: t, label: y, dense: [d0], sparse: [u]}"


def job(weights: tuple[float, float, float], training: str = "{mode: mixed}") -> str:
    old, mid, live = weights
    return f"""
name: weights
dataset:
  start: 2026-11-01
  streams:
    - name: history
      weight: {old}
      sources:
        - {{name: files, type: parquet, kind: batch, path: a, {COLUMNS}}}
        - {{name: table, type: parquet, kind: batch, path: b, {COLUMNS}}}
    - name: recent
      weight: {mid}
      sources:
        - {{name: more_files, type: parquet, kind: batch, path: c, {COLUMNS}}}
    - name: live
      weight: {live}
      sources:
        - {{name: events, type: kafka, kind: stream, topic: events, {COLUMNS}}}
training: {training}
"""


def test_kind_weights_average_the_streams_weights_per_source() -> None:
    spec = parse_job_spec(job((1.0, 4.0, 3.0)), "<test>")
    # batch: history's two sources (1, 1) and recent's one (4) -> 2; stream: live's 3
    assert spec.kind_weights() == {"batch": 2.0, "stream": 3.0}
    assert parse_job_spec(job((1.0, 1.0, 1.0)), "<test>").kind_weights() == {"batch": 1.0, "stream": 1.0}


def test_training_priority_weights_is_an_error_naming_the_replacement() -> None:
    with pytest.raises(SpecError, match=r"training.*priority_weights was removed.*dataset\.streams\[\]\.weight"):
        parse_job_spec(job((1.0, 1.0, 1.0), "{mode: mixed, priority_weights: {batch: 1, stream: 1}}"), "<test>")


def test_the_removed_key_is_one_problem_among_the_others() -> None:
    training = "{mode: mixed, priority_weights: {batch: 1}, batch_size: 0, model: {hash_buckets: 0}}"
    with pytest.raises(SpecError) as caught:
        parse_job_spec(job((1.0, 1.0, 1.0), training), "<test>")
    where = sorted(path for path, _ in caught.value.problems)
    assert len(where) == 3, caught.value
    assert [w.split(" ")[0] for w in where] == [
        "training.batch_size",
        "training.model.hash_buckets",
        "training.priority_weights",
    ]
    assert "stream stream" not in str(caught.value)

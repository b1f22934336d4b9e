"""Compact ledgers and the snapshot payload encoder."""

from __future__ import annotations

import json
import random
from dataclasses import replace

from primus_dagster.data.driver.ledger import RowSet
from primus_dagster.data.tasks import DataTask, JoinInfo


def test_rowset_is_a_sorted_set():
    rows = RowSet([5, 1, 5])
    assert rows.to_list() == [1, 5] and len(rows) == 2
    values = list(range(0, 1000, 7))
    random.Random(3).shuffle(values)
    for v in values:
        assert rows.add(v) is (v not in (1, 5))
        assert not rows.add(v)
    assert rows.to_list() == sorted(set(values) | {1, 5})
    assert 14 in rows and 15 not in rows and "14" not in rows
    copy = rows.copy()
    copy.add(10_000)
    assert 10_000 not in rows and rows.to_tuple() == tuple(sorted(set(values) | {1, 5}))


def test_task_payload_round_trips(task_factory):
    left = task_factory(1, pad="x", nested={"a": [1, 2]})
    joined = DataTask(
        task_id="join:1",
        stream="clicks",
        kind="stream",
        partition=left.partition,
        read=left.read,
        right_reads=(task_factory(2).read, replace(task_factory(3).read, stop=9)),
        join=JoinInfo("impressions", "clicks", "request_id", 3600.0),
        size_bytes=7,
        meta={"k": 1},
    )
    for task in (left, joined):
        assert json.loads(json.dumps(task.to_dict())) == task.to_dict()
        assert DataTask.from_dict(task.to_dict()) == task
        assert DataTask.from_json(task.to_json()) == task

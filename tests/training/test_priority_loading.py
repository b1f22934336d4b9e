"""Mixture prioritisation on the loading side (LoadingPriority), the share floor, and the serving
buffers' rows in the reader's policy; the driver leasing by the policy in a stream surge."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primus_dagster.data.driver import DataDriver, ExecutorReport
from primus_dagster.data.reader import QueueStat
from primus_dagster.data.sources.base import ReadTask
from primus_dagster.data.tasks import DataTask
from primus_dagster.training.priority import LoadingPriority, MixturePriority, share_floor, sigmoid

T0 = datetime(2026, 11, 2, tzinfo=timezone.utc)


def test_balanced_buffers_keep_handout_order_and_running_shares_steer() -> None:
    policy = LoadingPriority({"batch": 1.0, "stream": 1.0})
    # balanced buffers, nothing running: P = 0.5 each, a tie -> the chronologically first kind
    assert policy(["stream", "batch"], {}, {"batch": 100, "stream": 100}) == "stream"
    assert policy(["batch", "stream"], {}, {"batch": 100, "stream": 100}) == "batch"
    # 3 batch runners, 0 stream: stream's share (0 / 4) lies furthest below its 0.5
    assert policy(["batch", "stream"], {"batch": 3}, {"batch": 100, "stream": 100}) == "stream"
    assert policy(["batch", "stream"], {"batch": 1, "stream": 3}, {}) == "batch"
    assert policy.picks == {"stream": 2, "batch": 2}


def test_a_full_stream_buffer_takes_more_loaders_up_to_its_share() -> None:
    policy = LoadingPriority({"batch": 1.0, "stream": 1.0})
    surge = {"batch": 1000.0, "stream": 9000.0}  # q = -/+ 0.8
    p = policy.probabilities(["batch", "stream"], surge)
    assert p["stream"] == pytest.approx(sigmoid(0.8))
    # P(stream) = 0.69: with 2 of 4 loaders on the stream it still gets the next one ...
    assert policy(["batch", "stream"], {"batch": 2, "stream": 2}, surge) == "stream"
    # ... with 3 of 4 it does not: 0.69 - 3/5 < 0.31 - 1/5, batch gets the next one
    assert policy(["batch", "stream"], {"batch": 1, "stream": 3}, surge) == "batch"


def test_weights_gain_and_zero_weight() -> None:
    heavy = LoadingPriority({"batch": 1.0, "stream": 3.0}, gain=2.0)
    p = heavy.probabilities(["batch", "stream"], {"batch": 100.0, "stream": 300.0})  # q = -/+ 2 * 0.5
    s, b = 3 * sigmoid(1.0), sigmoid(-1.0)
    assert p["stream"] == pytest.approx(s / (s + b))
    flat = LoadingPriority({"batch": 1.0, "stream": 3.0}, gain=0.0)  # q = 0: fixed shares w_i / sum w
    assert flat.probabilities(["batch", "stream"], {"batch": 1.0, "stream": 99.0}) == {"batch": 0.25, "stream": 0.75}
    muted = LoadingPriority({"batch": 1.0, "stream": 0.0})
    assert muted(["stream", "batch"], {"batch": 5}, {"stream": 1e6}) == "batch"
    assert muted(["stream"], {"batch": 5}, {}) == "stream"  # alone: leased rather than left behind
    assert LoadingPriority({}).probabilities([], {}) == {}


def test_loading_priority_errors() -> None:
    with pytest.raises(ValueError, match="no kind has a task"):
        LoadingPriority({})([], {}, {})
    with pytest.raises(ValueError, match="buffered rows of kind 'stream'"):
        LoadingPriority({})(["stream"], {}, {"stream": -1.0})
    with pytest.raises(ValueError, match="every priority weight is 0"):
        LoadingPriority({"batch": 0.0, "stream": 0.0})
    with pytest.raises(ValueError, match="gain"):
        LoadingPriority({}, gain=math.inf)
    with pytest.raises(ValueError, match="gain"):
        MixturePriority({}, gain=-1.0)
    with pytest.raises(ValueError, match=r"priority weight of 'batch'.*dataset.streams\[\]\.weight"):
        LoadingPriority({"batch": -1.0})


def test_share_floor_hand_computed() -> None:
    assert share_floor({"batch": 1, "stream": 1}, "batch") == pytest.approx(sigmoid(-1.0))  # ~0.269
    b, s = sigmoid(-2.0), 3 * sigmoid(2.0)
    assert share_floor({"batch": 1, "stream": 3}, "batch", gain=2.0) == pytest.approx(b / (b + s))
    assert share_floor({"batch": 0, "stream": 1}, "batch") == 0.0


@settings(max_examples=200, deadline=None)
@given(
    batch_rows=st.floats(0, 1e7),
    stream_rows=st.floats(0, 1e7),
    w_stream=st.floats(0.01, 100),
    gain=st.floats(0, 5),
)
def test_no_kind_falls_below_its_floor(batch_rows: float, stream_rows: float, w_stream: float, gain: float) -> None:
    weights = {"batch": 1.0, "stream": w_stream}
    p = LoadingPriority(weights, gain=gain).probabilities(
        ["batch", "stream"], {"batch": batch_rows, "stream": stream_rows}
    )
    assert sum(p.values()) == pytest.approx(1.0)
    for kind in ("batch", "stream"):
        assert p[kind] >= share_floor(weights, kind, gain) * (1 - 1e-9)


def test_reader_policy_adds_its_queue_rows_to_the_executors_rows() -> None:
    stats = {
        "batch": QueueStat("batch", 2, 4, 2, 0.0, rows=2000),
        "stream": QueueStat("stream", 1, 4, 1, 0.0, rows=500),
    }
    upstream = {"stream": 5500.0}  # rows buffered at the executors (+ arrived at the driver)
    choose = MixturePriority({}, backlog_fn=lambda: upstream, queue_rows=True)
    # b = (2000, 6000): mean 4000, q = -/+ 0.5
    assert choose.probabilities(stats)["stream"] == pytest.approx(sigmoid(0.5))
    alone = MixturePriority({}, queue_rows=True)  # the reader's queues only: b = (2000, 500)
    assert alone.probabilities(stats)["stream"] == pytest.approx(sigmoid(500 / 1250 - 1))
    doubled = MixturePriority({}, backlog_fn=lambda: upstream, queue_rows=True, gain=2.0)
    assert doubled.probabilities(stats)["stream"] == pytest.approx(sigmoid(1.0))


def _task(kind: str, index: int, seconds: float, rows: int) -> DataTask:
    partition = T0 + timedelta(seconds=seconds)
    read = ReadTask(
        source="events" if kind == "stream" else "files", partition=partition, uri=f"{kind}/{index}", rows=rows
    )
    return DataTask.for_read("live" if kind == "stream" else "history", kind, read)  # type: ignore[arg-type]


def test_driver_gives_a_stream_surge_more_loaders_and_batch_keeps_some() -> None:
    """The driver leasing by LoadingPriority: FIFO hands out the earlier batch files first; with the
    policy a surge of stream rows waiting at the driver takes most loaders, batch still gets its floor."""
    now = [0.0]
    tasks = [_task("batch", i, i, 2000) for i in range(40)] + [_task("stream", i, 100 + i, 600) for i in range(40)]

    def lease_kinds(policy: LoadingPriority | None) -> list[str]:
        driver = DataDriver(clock=lambda: now[0], loading_policy=policy)
        driver.add_tasks(tasks)
        kinds = []
        for i in range(8):  # 8 loaders take a task each; the executors report their buffers
            driver.heartbeat(ExecutorReport(f"e{i}", "", metrics={"buffered_rows.batch": 500.0}))
            kinds += [lease.task.kind for lease in driver.lease(f"e{i}")]
        return kinds

    assert lease_kinds(None) == ["batch"] * 8  # chronological: every batch file is older
    policy = LoadingPriority({"batch": 1.0, "stream": 1.0})
    kinds = lease_kinds(policy)
    assert kinds.count("stream") >= 5 and kinds.count("batch") >= 2, kinds
    assert kinds[0] == "stream"  # 24000 stream rows wait against 4000 buffered batch rows

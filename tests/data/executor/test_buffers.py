"""TrainerBuffers: bounded per-trainer FIFOs with blocking puts (backpressure)."""

from __future__ import annotations

import threading
import time

import pytest

from primus_dagster.data.executor.buffers import TrainerBuffers
from primus_dagster.data.shuffle import ForwardShuffle, RebalanceShuffle


def test_put_blocks_when_the_target_is_full_and_resumes_after_get() -> None:
    buffers: TrainerBuffers[int] = TrainerBuffers(trainers=2, capacity=2)
    fwd = ForwardShuffle(1, 2)
    assert [buffers.put(i, fwd) for i in range(2)] == [1, 1]
    done = threading.Event()
    threading.Thread(target=lambda: (buffers.put(2, fwd), done.set()), daemon=True).start()
    assert not done.wait(0.2)  # blocked: trainer 1's buffer is full (trainer 0's is empty)
    assert buffers.fills() == [0, 2]
    assert buffers.get(1) == 0
    assert done.wait(2) and buffers.fills() == [0, 2] and buffers.high_water == 2


def test_rebalance_fills_the_emptiest_and_blocks_only_when_all_are_full() -> None:
    buffers: TrainerBuffers[int] = TrainerBuffers(trainers=3, capacity=1)
    reb = RebalanceShuffle(3)
    assert sorted(buffers.put(i, reb) for i in range(3)) == [0, 1, 2]
    assert buffers.put(9, reb, abort=lambda: True) is None  # all full: waits until aborted
    assert buffers.fill_ratio() == 1.0 and buffers.fill_ratio([0]) == 1.0


def test_get_returns_none_when_finished_and_empty_or_closed() -> None:
    buffers: TrainerBuffers[str] = TrainerBuffers(trainers=1, capacity=3)
    assert buffers.get(0, timeout=0.05) is None
    buffers.put("a", RebalanceShuffle(1))
    assert buffers.get(0, finished=lambda: True) == "a"  # drains before finishing
    assert buffers.get(0, finished=lambda: True) is None
    buffers.put("b", RebalanceShuffle(1))
    buffers.close()
    assert buffers.get(0) is None and buffers.put("c", RebalanceShuffle(1)) is None


def test_purge_and_requeue() -> None:
    buffers: TrainerBuffers[str] = TrainerBuffers(trainers=2, capacity=4)
    reb = RebalanceShuffle(2)
    for item in ["a1", "b1", "a2", "b2"]:
        buffers.put(item, reb)
    assert buffers.purge(lambda x: x.startswith("a")) == 2 and buffers.fills() == [0, 2]
    buffers.requeue(1, "first")
    assert buffers.get(1) == "first"


def test_a_waiting_get_wakes_on_put() -> None:
    buffers: TrainerBuffers[int] = TrainerBuffers(trainers=1, capacity=1)
    threading.Timer(0.05, lambda: buffers.put(7, RebalanceShuffle(1))).start()
    start = time.monotonic()
    assert buffers.get(0, timeout=2) == 7 and time.monotonic() - start < 1


def test_bad_sizes() -> None:
    with pytest.raises(ValueError):
        TrainerBuffers(trainers=0, capacity=1)

"""Forward and rebalance shuffles (pure)."""

from __future__ import annotations

import pytest

from primus_dagster.data.shuffle import (
    ForwardShuffle,
    RebalanceShuffle,
    executor_index_from_id,
    make_shuffle,
)


def test_forward_pairs_executor_i_with_trainer_i_mod_t() -> None:
    assert [ForwardShuffle(i, 3).choose([5, 0, 0]) for i in range(6)] == [0, 1, 2, 0, 1, 2]
    assert ForwardShuffle(4, 3).targets() == [1]


def test_rebalance_picks_the_emptiest_buffer() -> None:
    r = RebalanceShuffle(4)
    assert r.choose([3, 1, 2, 4]) == 1
    assert r.choose([0, 5, 5, 5]) == 0
    assert r.targets() == [0, 1, 2, 3]


def test_rebalance_breaks_ties_round_robin() -> None:
    r = RebalanceShuffle(3)
    assert [r.choose([0, 0, 0]) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    r = RebalanceShuffle(3)
    assert [r.choose([1, 0, 0]), r.choose([1, 0, 0]), r.choose([1, 0, 0])] == [1, 2, 1]


def test_rebalance_spreads_a_stream_evenly_and_avoids_a_slow_trainer() -> None:
    r = RebalanceShuffle(3)
    fills = [0, 0, 0]
    counts = [0, 0, 0]
    for _step in range(300):
        t = r.choose(fills)
        fills[t] += 1
        counts[t] += 1
        for fast in (0, 1):  # trainers 0 and 1 drain their buffers, trainer 2 never does
            fills[fast] = max(0, fills[fast] - 1)
    assert counts[2] <= 2 and counts[0] + counts[1] >= 298


def test_errors_and_factory() -> None:
    with pytest.raises(ValueError, match="at least one trainer"):
        RebalanceShuffle(0)
    with pytest.raises(ValueError, match="executor_index"):
        ForwardShuffle(-1, 2)
    with pytest.raises(ValueError, match="expected 2 buffer fills"):
        RebalanceShuffle(2).choose([0])
    with pytest.raises(ValueError, match="unknown shuffle"):
        make_shuffle("random")
    assert isinstance(make_shuffle("forward", 3, 2), ForwardShuffle) and make_shuffle("forward", 3, 2).trainer == 1
    assert isinstance(make_shuffle("rebalance", trainers=2), RebalanceShuffle)


def test_executor_index_from_id() -> None:
    assert executor_index_from_id("data-12") == 12
    assert executor_index_from_id("pod-abc") == executor_index_from_id("pod-abc") >= 0

"""Mixture data prioritisation: the formula, weights, the stream-surge acceptance test, errors."""

from __future__ import annotations

import math

import pytest

from primus_dagster.data.reader.remote_reader import QueueStat
from primus_dagster.training.priority import MixturePriority, backlog_signals, mixture_probabilities, sigmoid


def stat(name: str, size: int, head_age_s: float = 0.0, capacity: int = 4) -> QueueStat:
    return QueueStat(name=name, size=size, capacity=capacity, received=size, head_age_s=head_age_s)


def stats(batch: int, stream: int, batch_age: float = 0.0, stream_age: float = 0.0) -> dict[str, QueueStat]:
    return {"batch": stat("batch", batch, batch_age), "stream": stat("stream", stream, stream_age)}


def test_sigmoid() -> None:
    assert sigmoid(0.0) == 0.5
    assert sigmoid(2.0) == pytest.approx(1 / (1 + math.exp(-2)))
    assert sigmoid(-2.0) == pytest.approx(1 - sigmoid(2.0))
    assert sigmoid(-1000.0) == 0.0 and sigmoid(1000.0) == 1.0  # no OverflowError


def test_balanced_backlogs_give_probabilities_proportional_to_weights() -> None:
    signals = backlog_signals(stats(3, 3))
    assert signals == {"batch": 0.0, "stream": 0.0}
    assert mixture_probabilities({"batch": 1.0, "stream": 1.0}, signals) == {"batch": 0.5, "stream": 0.5}
    assert mixture_probabilities({"batch": 1.0, "stream": 3.0}, signals) == {"batch": 0.25, "stream": 0.75}


def test_backlog_signal_hand_computed() -> None:
    # b = (1, 10): mean 5.5, q = b / 5.5 - 1 = -/+ 9/11
    signals = backlog_signals(stats(1, 10))
    assert signals["batch"] == pytest.approx(-9 / 11)
    assert signals["stream"] == pytest.approx(9 / 11)
    probs = mixture_probabilities({}, signals)  # missing weights count as 1.0
    # sigma(x) + sigma(-x) = 1, so with equal weights p_stream = sigma(q_stream)
    assert probs["stream"] == pytest.approx(1 / (1 + math.exp(-9 / 11)))
    assert probs["stream"] == pytest.approx(0.6938, abs=1e-4)
    assert sum(probs.values()) == pytest.approx(1.0)


def test_weights_scale_the_share() -> None:
    signals = backlog_signals(stats(1, 10))
    s, b = sigmoid(9 / 11), sigmoid(-9 / 11)
    probs = mixture_probabilities({"batch": 1.0, "stream": 2.0}, signals)
    assert probs["stream"] == pytest.approx(2 * s / (2 * s + b))
    heavy_batch = mixture_probabilities({"batch": 5.0, "stream": 1.0}, signals)
    assert heavy_batch["batch"] == pytest.approx(5 * b / (5 * b + s))
    assert heavy_batch["batch"] > probs["batch"]


def test_backlog_mapping_overrides_queue_fill_and_lag_term() -> None:
    # the queues are both full (4/4) but upstream 20 stream batches and 5 batch batches wait
    signals = backlog_signals(stats(4, 4), backlog={"batch": 5, "stream": 20})
    assert signals == pytest.approx({"batch": 5 / 12.5 - 1, "stream": 20 / 12.5 - 1})
    partial = backlog_signals(stats(4, 2), backlog={"stream": 8})  # batch falls back to its size
    assert partial == pytest.approx({"batch": 4 / 6 - 1, "stream": 8 / 6 - 1})
    assert backlog_signals(stats(0, 0)) == {"batch": 0.0, "stream": 0.0}  # mean 0
    # head ages 0 s and 10 s, scale 5 s: a = (0, 2), minus their mean 1
    lagged = backlog_signals(stats(2, 2, stream_age=10.0), lag_scale_s=5.0)
    assert lagged == pytest.approx({"batch": -1.0, "stream": 1.0})
    assert backlog_signals({}) == {}
    with pytest.raises(ValueError, match="backlog of queue 'stream'"):
        backlog_signals(stats(1, 1), backlog={"stream": -1})


def test_bad_weights_raise_clear_errors() -> None:
    signals = {"batch": 0.0, "stream": 0.0}
    with pytest.raises(ValueError, match=r"every priority weight is 0.*batch.*stream"):
        mixture_probabilities({"batch": 0.0, "stream": 0}, signals)
    with pytest.raises(ValueError, match=r"priority weight of 'stream' must be .*>= 0, got -1"):
        mixture_probabilities({"batch": 1.0, "stream": -1.0}, signals)
    with pytest.raises(ValueError, match="priority weight of 'batch'"):
        mixture_probabilities({"batch": float("nan")}, signals)
    with pytest.raises(ValueError, match="weights="):
        MixturePriority({"batch": -0.5})
    with pytest.raises(ValueError, match="every priority weight is 0"):
        MixturePriority({"batch": 0, "stream": 0})
    with pytest.raises(ValueError, match="lag_scale_s"):
        MixturePriority({}, lag_scale_s=-1)
    assert mixture_probabilities({"batch": 0.0}, {"batch": 0.0, "stream": 0.0}) == {"batch": 0.0, "stream": 1.0}


def test_only_non_empty_queues_are_picked() -> None:
    choose = MixturePriority({"batch": 1.0, "stream": 100.0}, seed=1)
    only_batch = stats(3, 0)
    assert choose.probabilities(only_batch) == {"batch": 1.0, "stream": 0.0}
    assert {choose(only_batch) for _ in range(200)} == {"batch"}
    assert choose.picks == {"batch": 200}
    assert choose.probabilities(stats(0, 0)) == {"batch": 0.0, "stream": 0.0}
    with pytest.raises(ValueError, match="every queue is empty"):
        choose(stats(0, 0))


def test_zero_weight_queue_is_served_only_when_alone() -> None:
    choose = MixturePriority({"batch": 1.0, "stream": 0.0})
    assert {choose(stats(2, 4)) for _ in range(300)} == {"batch"}
    assert choose(stats(0, 4)) == "stream"  # rather than stalling the reader


def test_seeded_sampling_is_deterministic() -> None:
    seq = [stats(1 + i % 5, 1 + (7 * i) % 9) for i in range(500)]
    first, second, other = (MixturePriority({"batch": 1, "stream": 2}, seed=s) for s in (7, 7, 8))
    picks = [first(s) for s in seq]
    assert picks == [second(s) for s in seq]
    assert picks != [other(s) for s in seq]
    assert first.picks == second.picks


def three_sigma(count: int, expected: float, variance: float) -> None:
    sigma = math.sqrt(variance)
    assert abs(count - expected) <= 3 * sigma, f"{count} picks vs {expected:.1f} expected (sigma {sigma:.1f})"


def test_stream_surge_fixed_stats_matches_predicted_share() -> None:
    draws = 20_000
    before = MixturePriority({"batch": 1.0, "stream": 1.0}, seed=3)
    balanced = stats(4, 4)
    for _ in range(draws):
        before(balanced)
    surge_backlog = {"batch": 40.0, "stream": 400.0}  # stream backlog 10x the batch backlog
    after = MixturePriority({"batch": 1.0, "stream": 1.0}, seed=3, backlog_fn=lambda: surge_backlog)
    surge = stats(4, 4)
    p = after.probabilities(surge)["stream"]
    assert p == pytest.approx(sigmoid(9 / 11))
    for _ in range(draws):
        after(surge)
    three_sigma(after.picks["stream"], draws * p, draws * p * (1 - p))
    three_sigma(before.picks["stream"], draws * 0.5, draws * 0.25)
    assert after.picks["stream"] / draws > before.picks["stream"] / draws + 0.1
    assert after.picks["batch"] / draws > 0.25  # batch data is slowed, never starved


class QueueSim:
    """Two reader queues fed at constant rates from an upstream backlog; one batch consumed per draw.

    The trainer is the bottleneck (arrivals > 1 batch per draw), as when Primus prioritises.
    """

    def __init__(self, rates: dict[str, float], backlog: dict[str, float], capacity: int = 4) -> None:
        self.rates, self.backlog, self.capacity = rates, backlog, capacity

    def stats(self) -> dict[str, QueueStat]:
        return {
            name: stat(name, min(self.capacity, int(b)), capacity=self.capacity) for name, b in self.backlog.items()
        }

    def run(self, choose: MixturePriority, draws: int) -> tuple[dict[str, int], float, float]:
        """Picks per queue, the expected stream picks (sum of p) and their variance (sum of p(1-p))."""
        picks = {name: 0 for name in self.backlog}
        expected = variance = 0.0
        for _ in range(draws):
            for name, rate in self.rates.items():
                self.backlog[name] += rate
            current = self.stats()
            p = choose.probabilities(current)["stream"]
            expected, variance = expected + p, variance + p * (1 - p)
            name = choose(current)
            picks[name] += 1
            self.backlog[name] -= 1
        return picks, expected, variance


def test_stream_surge_simulated_reader() -> None:
    """Acceptance: a stream surge is served first (the share p predicts), batch is never starved."""
    draws = 20_000
    sim = QueueSim(rates={"batch": 0.55, "stream": 0.55}, backlog={"batch": 50.0, "stream": 50.0})
    choose = MixturePriority({"batch": 1.0, "stream": 1.0}, seed=11, backlog_fn=lambda: sim.backlog)
    before, expected, variance = sim.run(choose, draws)
    three_sigma(before["stream"], expected, variance)
    assert before["stream"] / draws == pytest.approx(0.5, abs=0.02)

    # the surge: the stream backlog jumps to 10x the batch backlog and keeps arriving 10x as fast
    sim.backlog["stream"] = 10 * sim.backlog["batch"]
    sim.rates["stream"] = 10 * sim.rates["batch"]
    predicted_now = choose.probabilities(sim.stats())["stream"]
    assert predicted_now == pytest.approx(sigmoid(9 / 11), abs=1e-6)
    batch_backlog = sim.backlog["batch"]
    after, expected, variance = sim.run(choose, draws)
    three_sigma(after["stream"], expected, variance)
    assert expected / draws == pytest.approx(predicted_now, abs=0.03)  # the stats stay ~10x through the surge
    assert after["stream"] / draws > before["stream"] / draws + 0.1  # the surge is served first
    assert after["batch"] / draws > 0.15  # batch data is still consumed, never starved
    assert after["batch"] > 0.5 * draws * 0.55 and sim.backlog["batch"] > batch_backlog
    assert choose.picks["stream"] == before["stream"] + after["stream"]

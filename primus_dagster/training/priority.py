"""Mixture data prioritisation (Primus): which reader queue the next batch comes from.

The trainer-side reader keeps one queue per data kind (``batch`` and ``stream``). With mode
``mixed`` the next batch comes from queue ``i`` with probability

    P(i) = p_i / sum_j p_j,        p_i = w_i * sigmoid(q_i)

where ``w_i`` are the spec's ``TrainingSpec.priority_weights`` and ``q_i`` is a normalised
backlog signal of queue ``i`` (:func:`backlog_signals`). A queue whose backlog grows (a stream
surge) gets a larger share and is served first, while ``sigmoid`` keeps every share of a queue
with a positive weight away from zero: batch data is slowed down, never starved. With two queues
the backlog part of ``q_i`` lies in ``[-1, 1]``, so with equal weights no non-empty queue gets
less than ``sigmoid(-1) / (sigmoid(-1) + sigmoid(1)) ~= 0.27`` of the draws (a lag term, when
enabled, can move that further).

Pure logic, no I/O: :class:`MixturePriority` plugs into ``RemoteReader(choose_queue=...)``.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Literal

from primus_dagster.data import QueueStat

__all__ = ["MixturePriority", "backlog_signals", "mixture_probabilities", "sigmoid"]

#: ``w_i`` by queue name (``training.priority_weights`` is keyed by the kinds themselves)
QueueWeights = Mapping[str, float] | Mapping[Literal["batch", "stream"], float]


def sigmoid(x: float) -> float:
    """The logistic function ``1 / (1 + e^-x)``, without overflow for large ``|x|``."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def backlog_signals(
    stats: Mapping[str, QueueStat], *, lag_scale_s: float = 0.0, backlog: Mapping[str, float] | None = None
) -> dict[str, float]:
    """The normalised backlog signal ``q_i`` of every queue in ``stats``.

    * ``b_i``, the backlog of queue ``i``: ``backlog[i]`` when ``backlog`` has that key (e.g. the
      upstream lag in rows, or the batches still waiting at the data executors), else the
      queue's fill ``stats[i].size``.
    * ``q_i = b_i / mean_j(b_j) - 1``: 0 when every queue has the same backlog, positive for a
      queue behind the others; all 0 when the mean backlog is 0.
    * with ``lag_scale_s > 0``, plus ``a_i - mean_j(a_j)`` where ``a_i = head_age_s / lag_scale_s``:
      a queue whose head batch has waited longer than the others' gains priority.

    Example: sizes ``{"batch": 4, "stream": 4}`` -> ``{"batch": 0.0, "stream": 0.0}``;
    backlogs ``{"batch": 1, "stream": 10}`` -> ``{"batch": -0.818..., "stream": 0.818...}``.
    """
    names = list(stats)
    if not names:
        return {}
    extra = backlog or {}
    for name in names:
        if name in extra and (not math.isfinite(extra[name]) or extra[name] < 0):
            raise ValueError(f"backlog of queue {name!r} must be a finite number >= 0, got {extra[name]!r}")
    sizes = {name: float(extra[name]) if name in extra else float(stats[name].size) for name in names}
    mean = sum(sizes.values()) / len(names)
    signals = {name: (sizes[name] / mean - 1.0) if mean > 0 else 0.0 for name in names}
    if lag_scale_s > 0:
        ages = {name: max(0.0, stats[name].head_age_s) / lag_scale_s for name in names}
        mean_age = sum(ages.values()) / len(names)
        signals = {name: signals[name] + ages[name] - mean_age for name in names}
    return signals


def _check_weights(weights: Mapping[str, float]) -> None:
    for name, weight in weights.items():
        try:
            value = float(weight)
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise ValueError(
                f"priority weight of {name!r} must be a finite number >= 0, got {weight!r} "
                f"(priority_weights={dict(weights)})"
            )


def mixture_probabilities(weights: Mapping[str, float], signals: Mapping[str, float]) -> dict[str, float]:
    """``p_i / sum_j p_j`` with ``p_i = w_i * sigmoid(q_i)`` over the keys of ``signals``.

    A queue missing from ``weights`` has weight 1.0. A negative (or NaN / infinite) weight, or
    every weight of the queues in ``signals`` being 0, raises :class:`ValueError`.

    Example::

        mixture_probabilities({"batch": 1, "stream": 1}, {"batch": 0.0, "stream": 0.0})
        # {"batch": 0.5, "stream": 0.5}: balanced backlogs -> p proportional to w
    """
    _check_weights(weights)
    if not signals:
        return {}
    used = {name: float(weights.get(name, 1.0)) for name in signals}
    if not any(w > 0 for w in used.values()):
        raise ValueError(
            f"every priority weight is 0 for queues {list(signals)} (weights {used}): "
            "at least one queue needs a positive weight"
        )
    # q is clipped to +-500 so that sigmoid never underflows to 0 (the share stays positive)
    raw = {name: used[name] * sigmoid(max(-500.0, min(500.0, q))) for name, q in signals.items()}
    total = sum(raw.values())
    return {name: value / total for name, value in raw.items()}


class MixturePriority:
    """A reader ``choose_queue`` sampling the next queue with the mixture probabilities.

    Samples among the non-empty queues only, with :func:`mixture_probabilities` restricted to
    them (signals from :func:`backlog_signals` over all queues), using its own seeded
    ``random.Random``: the same seed and the same sequence of stats give the same picks. A queue
    with weight 0 is served only while no queue with a positive weight has data (so it cannot
    stall the reader). ``backlog_fn``, when given, is called on every pick (under the reader's
    lock: keep it cheap) and its mapping is the ``backlog`` of :func:`backlog_signals`.
    ``picks`` counts the picks per queue.

    Example::

        choose = MixturePriority(spec.training.priority_weights, seed=spec.training.seed)
        reader = RemoteReader(driver, trainer_id=0, choose_queue=choose)
        ...
        choose.picks        # Counter({"batch": 812, "stream": 1236})
    """

    def __init__(
        self,
        weights: QueueWeights,
        *,
        seed: int = 0,
        lag_scale_s: float = 0.0,
        backlog_fn: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        named: dict[str, float] = {str(name): weight for name, weight in weights.items()}
        _check_weights(named)
        if named and not any(float(w) > 0 for w in named.values()):
            raise ValueError(
                f"every priority weight is 0 (priority_weights={named}): at least one queue needs a positive weight"
            )
        if lag_scale_s < 0:
            raise ValueError(f"lag_scale_s must be >= 0, got {lag_scale_s}")
        self.weights = named
        self.lag_scale_s = lag_scale_s
        self.backlog_fn = backlog_fn
        self.picks: Counter[str] = Counter()
        self._rng = random.Random(seed)

    def probabilities(self, stats: Mapping[str, QueueStat]) -> dict[str, float]:
        """The probability of each queue in ``stats`` being picked next (0.0 for empty queues;
        all 0.0 when every queue is empty)."""
        result = dict.fromkeys(stats, 0.0)
        live = [name for name, stat in stats.items() if stat.size > 0]
        if not live:
            return result
        backlog = self.backlog_fn() if self.backlog_fn is not None else None
        signals = backlog_signals(stats, lag_scale_s=self.lag_scale_s, backlog=backlog)
        positive = [name for name in live if float(self.weights.get(name, 1.0)) > 0]
        if positive:
            result.update(mixture_probabilities(self.weights, {name: signals[name] for name in positive}))
        else:  # only zero-weight queues have data: serve them rather than stall the reader
            result.update({name: 1.0 / len(live) for name in live})
        return result

    def __call__(self, stats: Mapping[str, QueueStat]) -> str:
        """The name of the queue to pop next; ValueError when every queue is empty."""
        probs = self.probabilities(stats)
        candidates = [(name, p) for name, p in probs.items() if p > 0]
        if not candidates:
            raise ValueError(f"every queue is empty: {list(stats)}")
        draw = self._rng.random()
        cumulative = 0.0
        chosen = candidates[-1][0]  # guards against rounding leaving draw above the last sum
        for name, p in candidates:
            cumulative += p
            if draw < cumulative:
                chosen = name
                break
        self.picks[chosen] += 1
        return chosen

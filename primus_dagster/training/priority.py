"""Mixture data prioritisation (Primus): how fast each data kind is loaded and in which order it is served.

The data plane keeps one serving buffer per data kind (``batch`` and ``stream``): the rows of that
kind waiting in the data executors' buffers (reported with their heartbeats) and in the trainer
reader's queue. Wherever both kinds are live, kind ``i`` gets the weight

    p_i = w_i * sigmoid(q_i),      P(i) = p_i / sum_j p_j

where ``w_i`` is the ``weight`` of the streams feeding kind ``i`` (:meth:`JobSpec.kind_weights
<primus_dagster.spec.JobSpec.kind_weights>`) and ``q_i = gain * (b_i / mean_j(b_j) - 1)`` is the
state of serving buffer ``i`` (:func:`backlog_signals`, ``b_i`` its buffered rows). ``P`` steers two
things:

* **loading** (:class:`LoadingPriority`, plugged into the data driver): the next task leased goes to
  the kind whose share of the running tasks lies furthest below ``P(i)`` -- how many executors
  work on each kind;
* **serving** (:class:`MixturePriority`, a reader ``choose_queue``): which reader queue the next
  batch comes from.

With ``data.deterministic`` the serving side gives up the backlog: :class:`MixturePriority` with
``deterministic=True`` samples ``P(i) = w_i / sum_j w_j`` from its seeded generator alone, one draw per
batch, so the same seed gives the same sequence of kinds in every run (the reader then waits for the
drawn kind's next batch in the plan's order, and takes the other kind once the drawn one is exhausted).

A kind whose buffer fills (a stream surge) gets a larger share of the loaders and of the trainer,
while ``sigmoid`` keeps every share of a kind with a positive weight above
``w_i * sigmoid(-gain) / (w_i * sigmoid(-gain) + sum_{j != i} w_j * sigmoid(gain))`` (two kinds:
``q`` lies in ``[-gain, gain]``): batch data is slowed down, never starved. With equal weights
and ``gain = 1`` no non-empty kind gets less than ``sigmoid(-1) / (sigmoid(-1) + sigmoid(1)) ~= 0.27``.

Pure logic, no I/O (``bench/surge.py`` measures it on a replay of the data plane).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from primus_dagster.data import QueueStat

__all__ = [
    "LoadingPriority",
    "MixturePriority",
    "backlog_signals",
    "mixture_probabilities",
    "relative_signals",
    "share_floor",
    "sigmoid",
]

#: ``w_i`` by kind (queue) name: :meth:`JobSpec.kind_weights <primus_dagster.spec.JobSpec.kind_weights>`
QueueWeights = Mapping[str, float] | Mapping[Literal["batch", "stream"], float]


def sigmoid(x: float) -> float:
    """The logistic function ``1 / (1 + e^-x)``, without overflow for large ``|x|``."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def backlog_signals(
    stats: Mapping[str, QueueStat],
    *,
    lag_scale_s: float = 0.0,
    backlog: Mapping[str, float] | None = None,
    gain: float = 1.0,
) -> dict[str, float]:
    """The normalised backlog signal ``q_i`` of every queue in ``stats``.

    * ``b_i``, the backlog of queue ``i``: ``backlog[i]`` when ``backlog`` has that key (e.g. the
      upstream lag in rows, or the batches still waiting at the data executors), else the
      queue's fill ``stats[i].size``.
    * ``q_i = gain * (b_i / mean_j(b_j) - 1)``: 0 when every queue has the same backlog, positive
      for a queue behind the others; all 0 when the mean backlog is 0.
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
    signals = relative_signals(sizes, gain)
    if lag_scale_s > 0:
        ages = {name: max(0.0, stats[name].head_age_s) / lag_scale_s for name in names}
        mean_age = sum(ages.values()) / len(names)
        signals = {name: signals[name] + ages[name] - mean_age for name in names}
    return signals


def relative_signals(backlog: Mapping[str, float], gain: float = 1.0) -> dict[str, float]:
    """``q_i = gain * (b_i / mean_j(b_j) - 1)`` over the keys of ``backlog`` (all 0 when the mean is 0).

    Example: ``relative_signals({"batch": 1000, "stream": 3000})`` -> ``{"batch": -0.5, "stream": 0.5}``.
    """
    if not math.isfinite(gain) or gain < 0:
        raise ValueError(f"gain must be a finite number >= 0, got {gain!r}")
    if not backlog:
        return {}
    mean = sum(backlog.values()) / len(backlog)
    return {name: gain * (float(b) / mean - 1.0) if mean > 0 else 0.0 for name, b in backlog.items()}


def _live_shares(weights: Mapping[str, float], signals: Mapping[str, float]) -> dict[str, float]:
    """:func:`mixture_probabilities` over the kinds of ``signals`` with a positive weight (the others
    get 0); equal shares when no kind has a positive weight (they are served rather than stalled)."""
    positive = [name for name in signals if float(weights.get(name, 1.0)) > 0]
    if not positive:
        return {name: 1.0 / len(signals) for name in signals}
    shares = dict.fromkeys(signals, 0.0)
    shares.update(mixture_probabilities(weights, {name: signals[name] for name in positive}))
    return shares


def _check_weights(weights: Mapping[str, float]) -> None:
    for name, weight in weights.items():
        try:
            value = float(weight)
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise ValueError(
                f"priority weight of {name!r} must be a finite number >= 0, got {weight!r} "
                f"(weights={dict(weights)}; set by dataset.streams[].weight)"
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
    lock: keep it cheap) and its mapping is the ``backlog`` of :func:`backlog_signals` (the data
    plane: the rows each kind has buffered at the data executors). With ``queue_rows`` the rows
    in the reader's own queues (``QueueStat.rows``) are added to it: ``b_i`` is then the whole
    serving buffer of kind ``i``. ``picks`` counts the picks per queue.

    ``deterministic=True`` (``data.deterministic``): the picks depend on the seed alone -- each call
    draws once and picks queue ``i`` of ``stats`` with probability ``w_i / sum_j w_j`` whatever the
    queues hold (no backlog, no head ages; ``backlog_fn`` is not called), so the same seed gives the
    same sequence in every run; the reader stands in for an exhausted queue. :meth:`skip` replays the
    draws of batches already trained (a resumed run goes on with the same sequence).

    Example::

        choose = MixturePriority(job.kind_weights(), seed=job.training.seed,
                                 backlog_fn=driver.buffered_rows_by_kind, queue_rows=True)
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
        gain: float = 1.0,
        queue_rows: bool = False,
        deterministic: bool = False,
    ) -> None:
        named: dict[str, float] = {str(name): weight for name, weight in weights.items()}
        _check_weights(named)
        if named and not any(float(w) > 0 for w in named.values()):
            raise ValueError(
                f"every priority weight is 0 (weights={named}): at least one queue needs a positive weight"
            )
        if lag_scale_s < 0:
            raise ValueError(f"lag_scale_s must be >= 0, got {lag_scale_s}")
        if not math.isfinite(gain) or gain < 0:
            raise ValueError(f"gain must be a finite number >= 0, got {gain!r}")
        self.weights = named
        self.lag_scale_s = lag_scale_s
        self.backlog_fn = backlog_fn
        self.gain = gain
        self.queue_rows = queue_rows
        self.deterministic = deterministic
        self.picks: Counter[str] = Counter()
        self._rng = random.Random(seed)

    def _backlog(self, stats: Mapping[str, QueueStat]) -> Mapping[str, float] | None:
        backlog = self.backlog_fn() if self.backlog_fn is not None else None
        if not self.queue_rows:
            return backlog
        upstream = backlog or {}
        return {name: float(upstream.get(name, 0.0)) + stat.rows for name, stat in stats.items()}

    def probabilities(self, stats: Mapping[str, QueueStat]) -> dict[str, float]:
        """The probability of each queue in ``stats`` being picked next (0.0 for empty queues;
        all 0.0 when every queue is empty)."""
        result = dict.fromkeys(stats, 0.0)
        if self.deterministic:  # the fixed weights alone: nothing that depends on timing
            result.update(_live_shares(self.weights, dict.fromkeys(stats, 0.0)))
            return result
        live = [name for name, stat in stats.items() if stat.size > 0]
        if not live:
            return result
        signals = backlog_signals(stats, lag_scale_s=self.lag_scale_s, backlog=self._backlog(stats), gain=self.gain)
        result.update(_live_shares(self.weights, {name: signals[name] for name in live}))
        return result

    def skip(self, draws: int) -> None:
        """Advance the generator by ``draws`` picks without picking (a resumed deterministic run: the
        batches trained before its checkpoint each took one)."""
        for _ in range(max(0, int(draws))):
            self._rng.random()

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


def share_floor(weights: Mapping[str, float], kind: str, gain: float = 1.0) -> float:
    """The least share :class:`MixturePriority` / :class:`LoadingPriority` give ``kind`` while it has
    data, with two or more kinds live: ``w_k * sigmoid(-gain)`` against every other kind at
    ``w_j * sigmoid(gain)`` (``q`` of two kinds lies in ``[-gain, gain]``; for more kinds this is a
    lower bound). 0 for a kind of weight 0.

    Example: ``share_floor({"batch": 1, "stream": 3}, "batch", gain=2.0)`` -> ``0.0396...``.
    """
    _check_weights(weights)
    mine = float(weights.get(kind, 1.0)) * sigmoid(-gain)
    others = sum(float(w) for name, w in weights.items() if name != kind) * sigmoid(gain)
    return mine / (mine + others) if mine + others > 0 else 0.0


class LoadingPriority:
    """The data driver's loading policy: which kind the next leased task is of.

    Called by :class:`~primus_dagster.data.driver.DataDriver` (``loading_policy=``) with the kinds
    that have a task to lease (in hand-out order: the kind of the chronologically first task
    first), the tasks running per kind and the rows each kind has buffered at the data executors.
    It computes ``P(i)`` over the kinds with data (buffered or to lease) from
    :func:`backlog_signals` of the buffered rows and picks the candidate whose share of the running
    tasks, counting the one about to start, lies furthest below ``P(i)``: the number of executors
    working on each kind follows ``P``. Ties go to the earlier candidate, so with balanced buffers
    and weights hand-out stays chronological. A candidate of weight 0 is picked only when it is
    the only candidate. Deterministic; ``picks`` counts the choices.

    Example::

        policy = LoadingPriority({"batch": 1.0, "stream": 3.0}, gain=2.0)
        driver = DataDriver.for_job(job.data, loading_policy=policy)
        policy(["batch", "stream"], {"batch": 3, "stream": 1}, {"batch": 8000, "stream": 2000})  # "stream"
    """

    def __init__(self, weights: QueueWeights, *, gain: float = 1.0) -> None:
        named: dict[str, float] = {str(name): weight for name, weight in weights.items()}
        _check_weights(named)
        if named and not any(float(w) > 0 for w in named.values()):
            raise ValueError(f"every priority weight is 0 (weights={named}): at least one kind needs a positive weight")
        if not math.isfinite(gain) or gain < 0:
            raise ValueError(f"gain must be a finite number >= 0, got {gain!r}")
        self.weights = named
        self.gain = gain
        self.picks: Counter[str] = Counter()

    def probabilities(self, kinds: Sequence[str], buffered: Mapping[str, float]) -> dict[str, float]:
        """``P(i)`` over ``kinds`` (the live ones) from their buffered rows; kinds of weight 0 get 0
        (all of them share equally when every kind has weight 0)."""
        live = list(dict.fromkeys(kinds))
        if not live:
            return {}
        for name in live:
            rows = buffered.get(name, 0.0)
            if not math.isfinite(rows) or rows < 0:
                raise ValueError(f"buffered rows of kind {name!r} must be a finite number >= 0, got {rows!r}")
        signals = relative_signals({name: float(buffered.get(name, 0.0)) for name in live}, self.gain)
        return _live_shares(self.weights, signals)

    def __call__(self, candidates: Sequence[str], running: Mapping[str, int], buffered: Mapping[str, float]) -> str:
        """The kind of the next task to lease among ``candidates`` (ValueError when there is none)."""
        if not candidates:
            raise ValueError("no kind has a task to lease")
        live = [*candidates, *(k for k, n in running.items() if n > 0), *(k for k, b in buffered.items() if b > 0)]
        probs = self.probabilities(live, buffered)
        total = sum(max(0, int(n)) for n in running.values()) + 1
        usable = [k for k in candidates if probs.get(k, 0.0) > 0] or list(candidates)
        best = max(usable, key=lambda k: probs.get(k, 0.0) - max(0, int(running.get(k, 0))) / total)
        self.picks[best] += 1
        return best

"""A seeded synthetic CTR world: stable long-term affinity, drifting trends, a daily cycle, label delay.

Pure and I/O free. Every hour is generated from its own random stream keyed by
``(seed, absolute UTC hour)``, so any hour can be produced independently, in any order, in any
process, and two worlds with the same config but different ``start`` agree on the hours they
share. The latent state (user/item vectors, item topics, popularity, the trend trajectory)
is a function of the seed alone. The model is described in ``docs/synthetic_world.md``.

Example::

    from datetime import datetime, timezone
    world = SyntheticWorld(WorldConfig(seed=7, rows_per_hour=20_000), datetime(2026, 11, 1, tzinfo=timezone.utc))
    table = world.hour(0)            # pyarrow.Table of hour 2026-11-01T00
    stream = world.stream_copy(table)  # clicks seen within the stream label window only
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import ClassVar

import numpy as np
import pyarrow as pa

from primus_dagster.spec.durations import parse_duration

TS_TYPE = pa.timestamp("us", tz="UTC")
ROW_BITS = 28  # sample_id = (epoch_hour << ROW_BITS) | row
HOUR_US = 3_600_000_000
N_DEVICES = 4
_DEVICE_P = np.array([0.55, 0.30, 0.10, 0.05])
_DEVICE_EFFECT = np.array([0.0, 0.10, -0.15, 0.20], dtype=np.float32)
_DIRECT_EFFECTS = ((3, 0.25), (4, -0.15))  # (dense index, logit weight) of the per-row context features
_TREND_BLOCK = 512  # hours of trend innovations drawn per random stream
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass
class WorldConfig:
    """Knobs of the synthetic world (durations accept timedelta, seconds or '15m'/'24h' strings).

    Example::

        cfg = WorldConfig(seed=1, users=5_000, items=1_000, rows_per_hour=10_000)
    """

    seed: int = 7
    users: int = 20_000
    items: int = 5_000
    topics: int = 24
    latent_dim: int = 8
    rows_per_hour: float = 20_000.0
    daily_amplitude: float = 0.5
    peak_hour: float = 20.0
    base_ctr: float = 0.05
    affinity_scale: float = 1.5
    trend_scale: float = 1.0
    trend_persistence: float = 0.8
    trend_noise: float = 0.6
    popularity_skew: float = 1.0
    dense_scale: float = 1.0
    n_dense: int = 13
    stream_label_window: timedelta = field(default=timedelta(minutes=15))
    mean_click_delay: timedelta = field(default=timedelta(hours=1))
    click_delay_sigma: float = 2.0
    max_label_delay: timedelta = field(default=timedelta(hours=24))

    HELP: ClassVar[dict[str, str]] = {
        "seed": "seed of the whole world (latent state and every hour)",
        "users": "number of users (Zipf-like popularity)",
        "items": "number of items (Zipf-like popularity)",
        "topics": "number of item topics (each topic has its own drifting trend)",
        "latent_dim": "dimension of the long-term user/item vectors",
        "rows_per_hour": "mean impressions per hour (Poisson, modulated by the daily cycle)",
        "daily_amplitude": "daily cycle: traffic x(1+a*cos), CTR logit +a*cos (peak at --peak-hour)",
        "peak_hour": "UTC hour of the daily traffic and CTR peak",
        "base_ctr": "average CTR of the world (the logit bias is calibrated to it)",
        "affinity_scale": "weight of the stable long-term affinity <u_user, v_item> (unit variance)",
        "trend_scale": "weight of the short-lived per-topic trend in the logit",
        "trend_persistence": "AR(1) rho of each topic's trend from one hour to the next",
        "trend_noise": "AR(1) innovation std of the trend (stationary std = noise/sqrt(1-rho^2))",
        "popularity_skew": "Zipf exponent of user and item popularity",
        "dense_scale": "weight of the direct dense-feature effects",
        "n_dense": "number of dense float features d0..d{n-1} (first 5 informative)",
        "stream_label_window": "clicks later than this after the impression are missing from the stream copy",
        "mean_click_delay": "mean of the lognormal click delay (before the cap)",
        "click_delay_sigma": "lognormal sigma of the click delay (spread from seconds to hours)",
        "max_label_delay": "cap of the click delay (labels are complete after it)",
    }

    def __post_init__(self) -> None:
        for name in ("stream_label_window", "mean_click_delay", "max_label_delay"):
            setattr(self, name, parse_duration(getattr(self, name)))
        checks = [
            (self.users >= 1 and self.items >= 1 and self.topics >= 1, "users, items and topics must be >= 1"),
            (self.latent_dim >= 1, "latent_dim must be >= 1"),
            (self.rows_per_hour >= 0, "rows_per_hour must be >= 0"),
            (0 <= self.daily_amplitude < 1, "daily_amplitude must be in [0, 1)"),
            (0 < self.base_ctr < 1, "base_ctr must be in (0, 1)"),
            (0 <= self.trend_persistence < 1, "trend_persistence must be in [0, 1)"),
            (self.trend_noise >= 0 and self.click_delay_sigma >= 0, "trend_noise and click_delay_sigma must be >= 0"),
            (self.n_dense >= 1, "n_dense must be >= 1"),
            (self.mean_click_delay.total_seconds() > 0, "mean_click_delay must be > 0"),
            (self.max_label_delay.total_seconds() > 0, "max_label_delay must be > 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @classmethod
    def knobs(cls) -> list[str]:
        """Names of all knobs, in declaration order."""
        return [f.name for f in fields(cls)]


def world_schema(n_dense: int) -> pa.Schema:
    """Native schema of :meth:`SyntheticWorld.hour` (not the canonical schema)."""
    cols = [
        pa.field("sample_id", pa.int64(), nullable=False),
        pa.field("event_time", TS_TYPE, nullable=False),
        pa.field("click", pa.int32(), nullable=False),
        pa.field("click_delay_s", pa.float32()),
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("item_id", pa.int64(), nullable=False),
        pa.field("topic_id", pa.int64(), nullable=False),
        pa.field("device", pa.int64(), nullable=False),
        pa.field("hour_of_day", pa.int64(), nullable=False),
    ]
    cols += [pa.field(f"d{j}", pa.float32(), nullable=False) for j in range(n_dense)]
    return pa.schema(cols)


def shard_of(sample_ids: np.ndarray | pa.Array | pa.ChunkedArray, n: int) -> np.ndarray:
    """Shard index in ``[0, n)`` of each sample id (splitmix64 hash, then mod ``n``)."""
    if isinstance(sample_ids, (pa.Array, pa.ChunkedArray)):
        sample_ids = sample_ids.to_numpy()
    x = np.asarray(sample_ids).astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(n)).astype(np.int64)


def stream_copy(table: pa.Table, window: timedelta, label: str = "click") -> pa.Table:
    """Same rows with the ``label`` column (0/1 int32) = 1 only where the click arrived within ``window``
    (what a stream joiner sees); ``click_delay_s`` says when each click arrived."""
    delay = table.column("click_delay_s").to_numpy(zero_copy_only=False)
    click = table.column(label).to_numpy()
    seen = np.nan_to_num(delay.astype(np.float64), nan=np.inf) <= window.total_seconds()
    early = (click.astype(bool) & seen).astype(np.int32)
    index = table.schema.get_field_index(label)
    return table.set_column(index, table.schema.field(index), pa.array(early, pa.int32()))


class _AliasSampler:
    """Walker/Vose alias table: O(1), cache-friendly sampling from a discrete distribution."""

    def __init__(self, p: np.ndarray):
        n = len(p)
        scaled = p * n
        prob = np.ones(n)
        alias = np.arange(n, dtype=np.int64)
        small = [i for i in range(n) if scaled[i] < 1.0]
        large = [i for i in range(n) if scaled[i] >= 1.0]
        while small and large:
            s, g = small.pop(), large.pop()
            prob[s], alias[s] = scaled[s], g
            scaled[g] -= 1.0 - scaled[s]
            (small if scaled[g] < 1.0 else large).append(g)
        self.n, self.prob, self.alias = n, prob, alias

    def __call__(self, rng: np.random.Generator, size: int) -> np.ndarray:
        idx = rng.integers(0, self.n, size=size, dtype=np.int64)
        return np.where(rng.random(size) < self.prob[idx], idx, self.alias[idx])


def _zipf_weights(n: int, skew: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Popularity probabilities (random id order) and the standardized log-popularity per id."""
    ranks = rng.permutation(n)
    w = 1.0 / np.power(ranks + 10.0, skew)
    p = w / w.sum()
    logp = np.log(p)
    z = (logp - logp.mean()) / (logp.std() + 1e-12)
    return p, z.astype(np.float32)


class SyntheticWorld:
    """The seeded world; :meth:`hour` returns one hour of impressions as a pyarrow Table.

    ``h`` counts hours from ``start`` (which must be a whole UTC hour); randomness is keyed by
    the absolute hour, so results do not depend on call order or process.

    Example::

        world = SyntheticWorld(WorldConfig(seed=3), datetime(2026, 11, 1, tzinfo=timezone.utc))
        t = world.hour(5)
        auc_feature = world.affinity(t["user_id"].to_numpy(), t["item_id"].to_numpy())
    """

    def __init__(self, config: WorldConfig, start: datetime):
        start = start.replace(tzinfo=timezone.utc) if start.tzinfo is None else start.astimezone(timezone.utc)
        if start.minute or start.second or start.microsecond:
            raise ValueError(f"world start must be a whole UTC hour, got {start.isoformat()}")
        self.config = config
        self.start = start
        self.start_epoch_hour = int((start - _EPOCH).total_seconds()) // 3600
        cfg = config
        rng = np.random.default_rng([cfg.seed, 0])
        d = cfg.latent_dim
        sigma = d**-0.25  # <u, v> then has unit variance
        self.user_vectors = (rng.standard_normal((cfg.users, d)) * sigma).astype(np.float32)
        topic_centres = rng.standard_normal((cfg.topics, d))
        topic_p, _ = _zipf_weights(cfg.topics, 0.5, rng)
        self.item_topic = rng.choice(cfg.topics, size=cfg.items, p=topic_p).astype(np.int64)
        item_raw = math.sqrt(0.5) * topic_centres[self.item_topic] + math.sqrt(0.5) * rng.standard_normal(
            (cfg.items, d)
        )
        self.item_vectors = (item_raw * sigma).astype(np.float32)
        self.user_p, self.user_activity = _zipf_weights(cfg.users, cfg.popularity_skew, rng)
        self.item_p, self.item_popularity = _zipf_weights(cfg.items, cfg.popularity_skew, rng)
        self.user_bias = (0.3 * rng.standard_normal(cfg.users)).astype(np.float32)
        self.item_bias = (0.15 * self.item_popularity + 0.15 * rng.standard_normal(cfg.items)).astype(np.float32)
        self.user_device = rng.choice(N_DEVICES, size=cfg.users, p=_DEVICE_P).astype(np.int64)
        self._sample_user = _AliasSampler(self.user_p)
        self._sample_item = _AliasSampler(self.item_p)
        rho = cfg.trend_persistence
        self.trend_std = cfg.trend_noise / math.sqrt(1 - rho**2)
        self.bias = self._calibrate_bias()
        self._trend_lags = 0 if rho == 0 else min(math.ceil(math.log(1e-4) / math.log(rho)), 8192)
        self._trend_weights = cfg.trend_noise * rho ** np.arange(self._trend_lags + 1)
        self._trend_blocks: dict[int, np.ndarray] = {}
        mu = math.log(cfg.mean_click_delay.total_seconds()) - cfg.click_delay_sigma**2 / 2
        self._delay_mu = mu

    def _calibrate_bias(self, samples: int = 200_000) -> float:
        """Logit bias such that the world's average CTR is ``base_ctr`` (Monte Carlo, seeded, bisection)."""
        cfg = self.config
        rng = np.random.default_rng([cfg.seed, 3])
        users, items = self._sample_user(rng, samples), self._sample_item(rng, samples)
        direct = np.zeros(samples)
        for j, weight in _DIRECT_EFFECTS:
            if j < cfg.n_dense:
                direct += weight * rng.standard_normal(samples)
        rest = (
            self.user_bias[users]
            + self.item_bias[items]
            + _DEVICE_EFFECT[self.user_device[users]]
            + cfg.affinity_scale * self.affinity(users, items)
            + cfg.trend_scale * self.trend_std * rng.standard_normal(samples)
            + cfg.daily_amplitude * np.cos(rng.uniform(0, 2 * np.pi, samples))
            + cfg.dense_scale * direct
        )
        lo, hi = -30.0, 30.0
        for _ in range(50):
            mid = (lo + hi) / 2
            if np.mean(1.0 / (1.0 + np.exp(-(mid + rest)))) < cfg.base_ctr:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    # -- time ---------------------------------------------------------------------------
    def hour_start(self, h: int) -> datetime:
        """UTC start of hour ``h`` (``start + h`` hours)."""
        return self.start + timedelta(hours=h)

    def epoch_hour(self, h: int) -> int:
        return self.start_epoch_hour + h

    def traffic_multiplier(self, h: int) -> float:
        """Daily cycle of the traffic: ``1 + amplitude * cos(2 pi (hour + 0.5 - peak) / 24)``."""
        tod = (self.epoch_hour(h) % 24) + 0.5
        return 1.0 + self.config.daily_amplitude * math.cos(2 * math.pi * (tod - self.config.peak_hour) / 24)

    def expected_rows(self, h: int) -> float:
        return self.config.rows_per_hour * self.traffic_multiplier(h)

    # -- latent trend -------------------------------------------------------------------
    def _innovations(self, first: int, last: int) -> np.ndarray:
        """Trend innovations eps[topic] of absolute hours first..last inclusive, shape (hours, topics)."""
        b0, b1 = first // _TREND_BLOCK, last // _TREND_BLOCK
        parts = []
        for b in range(b0, b1 + 1):
            block = self._trend_blocks.get(b)
            if block is None:
                rng = np.random.default_rng([self.config.seed, 2, b + (1 << 40)])
                block = rng.standard_normal((_TREND_BLOCK, self.config.topics))
                if len(self._trend_blocks) > 64:
                    self._trend_blocks.clear()
                self._trend_blocks[b] = block
            parts.append(block)
        stacked = np.concatenate(parts) if len(parts) > 1 else parts[0]
        offset = first - b0 * _TREND_BLOCK
        return stacked[offset : offset + last - first + 1]

    def trend(self, hours: Sequence[int] | range) -> np.ndarray:
        """Trend strength ``x[h, topic]`` for the given hours (relative to start), shape (len, topics).

        ``x_h = rho * x_{h-1} + noise * eps_h`` (stationary AR(1)), computed as the equivalent
        moving average over the last lags (error < 1e-4 of the scale), so every hour is exact
        and independent of which hours were asked for before.
        """
        epoch_hours = np.asarray(list(hours), dtype=np.int64) + self.start_epoch_hour
        out = np.empty((len(epoch_hours), self.config.topics))
        k = self._trend_lags
        w = self._trend_weights[::-1]  # oldest lag first
        for i, H in enumerate(epoch_hours):
            out[i] = w @ self._innovations(int(H) - k, int(H))
        return out

    def affinity(self, user_ids: np.ndarray, item_ids: np.ndarray) -> np.ndarray:
        """The stable long-term affinity ``<u_user, v_item>`` (unit variance), float32."""
        return np.einsum("ij,ij->i", self.user_vectors[user_ids], self.item_vectors[item_ids])

    # -- one hour -----------------------------------------------------------------------
    def hour(self, h: int) -> pa.Table:
        """Impressions of hour ``h`` (start + h hours), sorted by event_time; deterministic."""
        cfg = self.config
        H = self.epoch_hour(h)
        rng = np.random.default_rng([cfg.seed, 1, H])
        n = int(rng.poisson(self.expected_rows(h)))
        if n >= 1 << ROW_BITS:
            raise ValueError(f"hour {h} would have {n} rows; at most {(1 << ROW_BITS) - 1} fit a sample_id")
        offsets = np.sort(rng.integers(0, HOUR_US, size=n, dtype=np.int64))
        event_us = H * HOUR_US + offsets
        users = self._sample_user(rng, n)
        items = self._sample_item(rng, n)
        topics = self.item_topic[items]
        device = np.where(rng.random(n) < 0.85, self.user_device[users], rng.integers(0, N_DEVICES, n))
        trend_now, trend_prev = self.trend([h, h - 1])
        daily = self._daily((H % 24) + offsets / HOUR_US)

        dense = rng.standard_normal((cfg.n_dense, n), dtype=np.float32)
        informative = [  # (observed signal, noise std); later rows stay pure noise
            (self.user_bias[users] / 0.3, 0.7),
            (self.item_popularity[items], 0.3),
            (trend_prev[topics].astype(np.float32), 0.3),
        ]
        for j, (signal, noise) in enumerate(informative[: cfg.n_dense]):
            dense[j] = signal + noise * dense[j]
        direct = np.zeros(n, dtype=np.float32)
        for j, weight in _DIRECT_EFFECTS:  # per-row context features with a direct effect
            if j < cfg.n_dense:
                direct += weight * dense[j]

        trend = np.float32(cfg.trend_scale) * trend_now[topics].astype(np.float32)
        logit = self._logit(users, items, device, trend, daily, direct)
        click = rng.random(n, dtype=np.float32) < 1.0 / (1.0 + np.exp(-logit))
        delay = np.exp(self._delay_mu + cfg.click_delay_sigma * rng.standard_normal(n))
        delay = np.minimum(delay, cfg.max_label_delay.total_seconds()).astype(np.float32)

        sample_id = (np.int64(H) << ROW_BITS) | np.arange(n, dtype=np.int64)
        arrays: list[pa.Array] = [
            pa.array(sample_id),
            pa.array(event_us, TS_TYPE),
            pa.array(click.astype(np.int32)),
            pa.array(delay, mask=~click),
            pa.array(users),
            pa.array(items),
            pa.array(topics),
            pa.array(device.astype(np.int64)),
            pa.array(np.full(n, H % 24, dtype=np.int64)),
        ]
        arrays += [pa.array(dense[j]) for j in range(cfg.n_dense)]
        return pa.Table.from_arrays(arrays, schema=world_schema(cfg.n_dense))

    def click_logit(self, table: pa.Table, h: int, *, with_trend: bool = True) -> np.ndarray:
        """The generator's own click logit of each row of ``hour(h)`` (the oracle: the AUC ceiling of
        any model); ``with_trend=False`` drops this hour's trend term (the ceiling of a model that
        knows everything long-term and nothing of the current trends)."""
        cfg = self.config
        users, items, topics, device = (
            table.column(c).to_numpy() for c in ("user_id", "item_id", "topic_id", "device")
        )
        offsets = table.column("event_time").cast(pa.int64()).to_numpy() % HOUR_US
        tod = (self.epoch_hour(h) % 24) + offsets / HOUR_US
        direct = sum(
            (w * table.column(f"d{j}").to_numpy() for j, w in _DIRECT_EFFECTS if j < cfg.n_dense),
            np.zeros(len(table), dtype=np.float32),
        )
        trend = np.float32(cfg.trend_scale) * self.trend([h])[0][topics].astype(np.float32) if with_trend else 0.0
        return self._logit(users, items, device, trend, self._daily(tod), direct.astype(np.float32))

    def _daily(self, hour_of_day: np.ndarray) -> np.ndarray:
        """The daily cycle's term of the logit at each fractional hour of the day."""
        cfg = self.config
        return (cfg.daily_amplitude * np.cos(2 * np.pi * (hour_of_day - cfg.peak_hour) / 24)).astype(np.float32)

    def _logit(
        self,
        users: np.ndarray,
        items: np.ndarray,
        device: np.ndarray,
        trend: np.ndarray | float,
        daily: np.ndarray,
        direct: np.ndarray,
    ) -> np.ndarray:
        """The click logit: biases + long-term affinity + the topic trend + daily cycle + dense effects."""
        cfg = self.config
        return (
            self.bias
            + self.user_bias[users]
            + self.item_bias[items]
            + _DEVICE_EFFECT[device]
            + cfg.affinity_scale * self.affinity(users, items)
            + trend
            + daily
            + np.float32(cfg.dense_scale) * direct
        )

    def stream_copy(self, table: pa.Table) -> pa.Table:
        """:func:`stream_copy` with this world's ``stream_label_window``."""
        return stream_copy(table, self.config.stream_label_window)

    def __repr__(self) -> str:
        return f"SyntheticWorld(seed={self.config.seed}, start={self.start.isoformat()})"

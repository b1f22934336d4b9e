"""The synthetic world: determinism, shape, and the four problems it must make visible."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pytest

from primus_dagster.synth import SyntheticWorld, WorldConfig, shard_of, stream_copy, world_schema
from primus_dagster.synth.world import ROW_BITS

START = datetime(2026, 11, 1, tzinfo=timezone.utc)
SMALL = dict(users=2_000, items=500, topics=12, rows_per_hour=4_000)


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """Rank AUC (ties broken arbitrarily; fine for continuous scores)."""
    order = np.argsort(score, kind="stable")
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    pos = int(label.sum())
    return float((ranks[label == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(label) - pos)))


@pytest.fixture(scope="module")
def world() -> SyntheticWorld:
    return SyntheticWorld(WorldConfig(seed=3, **SMALL), START)


@pytest.fixture(scope="module")
def two_days(world: SyntheticWorld) -> list[pa.Table]:
    return [world.hour(h) for h in range(48)]


def test_hour_is_deterministic_and_order_independent(world: SyntheticWorld) -> None:
    fresh = SyntheticWorld(WorldConfig(seed=3, **SMALL), START)
    fresh.hour(30)
    fresh.hour(2)
    assert fresh.hour(7).equals(world.hour(7))
    # randomness is keyed by the absolute hour: a world started later agrees on shared hours
    later = SyntheticWorld(WorldConfig(seed=3, **SMALL), START + timedelta(hours=5))
    assert later.hour(2).equals(world.hour(7))
    assert np.allclose(later.trend([2]), world.trend([7]))


def test_different_seeds_differ(world: SyntheticWorld) -> None:
    other = SyntheticWorld(WorldConfig(seed=4, **SMALL), START)
    a, b = world.hour(0), other.hour(0)
    assert not a.equals(b)
    assert not np.allclose(world.user_vectors, other.user_vectors)


def test_schema_times_and_ids(world: SyntheticWorld) -> None:
    h = 5
    table = world.hour(h)
    assert table.schema.equals(world_schema(13))
    ts = table.column("event_time").cast(pa.int64()).to_numpy()
    start_us = int(world.hour_start(h).timestamp()) * 1_000_000
    assert np.all(np.diff(ts) >= 0)
    assert ts.min() >= start_us and ts.max() < start_us + 3_600_000_000
    ids = table.column("sample_id").to_numpy()
    assert len(np.unique(ids)) == len(ids)
    assert np.all(ids >> ROW_BITS == world.epoch_hour(h))
    assert set(table.column("hour_of_day").to_numpy()) == {5}
    click = table.column("click").to_numpy()
    delay = table.column("click_delay_s")
    assert delay.null_count == int((click == 0).sum())
    assert table.column("device").to_numpy().max() < 4
    assert table.column("topic_id").to_numpy().tolist() == world.item_topic[table.column("item_id").to_numpy()].tolist()


def test_popularity_is_skewed(two_days: list[pa.Table]) -> None:
    users = pa.concat_tables(two_days[:24]).column("user_id").to_numpy()
    counts = np.sort(np.bincount(users, minlength=SMALL["users"]))[::-1]
    top = counts[: len(counts) // 100].sum() / counts.sum()
    assert top > 0.05  # the top 1% of users get far more than 1% of impressions


def test_daily_cycle_in_traffic_and_ctr(world: SyntheticWorld, two_days: list[pa.Table]) -> None:
    rows = np.array([t.num_rows for t in two_days[:24]])
    peak = int(world.config.peak_hour)
    assert rows[peak] > 2 * rows[(peak + 12) % 24]  # amplitude 0.5 -> about 3x
    assert int(np.argmax(rows)) in {(peak + d) % 24 for d in (-2, -1, 0, 1, 2)}
    ctr = np.array([t.column("click").to_numpy().mean() for t in two_days[:24]])
    near_peak = [(peak + d) % 24 for d in range(-3, 4)]
    near_trough = [(peak + 12 + d) % 24 for d in range(-3, 4)]
    assert ctr[near_peak].mean() > ctr[near_trough].mean()


def test_average_ctr_is_calibrated(two_days: list[pa.Table]) -> None:
    clicks = pa.concat_tables(two_days).column("click").to_numpy()
    assert 0.035 < clicks.mean() < 0.065  # base_ctr 0.05


def test_long_term_affinity_is_predictive_on_a_later_day(world: SyntheticWorld, two_days: list[pa.Table]) -> None:
    aucs = []
    for day in (two_days[:24], two_days[24:]):
        t = pa.concat_tables(day)
        score = world.affinity(t.column("user_id").to_numpy(), t.column("item_id").to_numpy())
        aucs.append(auc(score, t.column("click").to_numpy()))
    assert aucs[1] > 0.6
    assert abs(aucs[0] - aucs[1]) < 0.05  # stable: as predictive on day 2 as on day 1


def test_trends_drift_hour_to_hour(world: SyntheticWorld, two_days: list[pa.Table]) -> None:
    topics = world.config.topics
    ctr = np.zeros((48, topics))
    for h, t in enumerate(two_days):
        topic = t.column("topic_id").to_numpy()
        click = t.column("click").to_numpy()
        ctr[h] = np.bincount(topic, click, topics) / np.maximum(np.bincount(topic, minlength=topics), 1)
    ctr -= ctr.mean(axis=1, keepdims=True)  # remove the daily cycle, keep the topic pattern

    def mean_corr(lag: int) -> float:
        return float(np.mean([np.corrcoef(ctr[h], ctr[h + lag])[0, 1] for h in range(48 - lag)]))

    assert mean_corr(1) > 0.5
    assert mean_corr(24) < 0.25
    assert mean_corr(1) > mean_corr(24) + 0.35
    trend = world.trend(range(400))
    lag1 = np.mean([np.corrcoef(trend[:-1, k], trend[1:, k])[0, 1] for k in range(topics)])
    lag24 = np.mean([np.corrcoef(trend[:-24, k], trend[24:, k])[0, 1] for k in range(topics)])
    assert abs(lag1 - world.config.trend_persistence) < 0.1
    assert abs(lag24) < 0.15


def test_label_delay_and_stream_copy(world: SyntheticWorld, two_days: list[pa.Table]) -> None:
    batch = pa.concat_tables(two_days[:24])
    stream = world.stream_copy(batch)
    b, s = batch.column("click").to_numpy(), stream.column("click").to_numpy()
    assert np.all(s <= b)
    assert 0.3 * b.sum() < s.sum() < 0.9 * b.sum()  # the stream sees only the early clicks
    assert stream.drop_columns(["click"]).equals(batch.drop_columns(["click"]))
    delay = batch.column("click_delay_s").drop_null().to_numpy()
    assert delay.min() >= 0 and delay.max() <= 24 * 3600
    assert delay.min() < 60 and delay.max() > 6 * 3600  # from seconds to many hours
    late = delay > world.config.stream_label_window.total_seconds()
    assert int(late.sum()) == int(b.sum() - s.sum())
    wider = stream_copy(batch, timedelta(hours=24))
    assert wider.column("click").equals(batch.column("click"))


def test_informative_dense_features(world: SyntheticWorld, two_days: list[pa.Table]) -> None:
    t = pa.concat_tables(two_days[24:])
    y = t.column("click").to_numpy()
    assert auc(t.column("d0").to_numpy(), y) > 0.53  # noisy user propensity
    assert auc(t.column("d2").to_numpy(), y) > 0.55  # last hour's trend of the item's topic
    assert abs(auc(t.column("d12").to_numpy(), y) - 0.5) < 0.04  # noise


def test_config_durations_and_validation() -> None:
    cfg = WorldConfig(stream_label_window="30m", mean_click_delay=600, max_label_delay="2d")
    assert cfg.stream_label_window == timedelta(minutes=30)
    assert cfg.mean_click_delay == timedelta(seconds=600)
    assert cfg.max_label_delay == timedelta(days=2)
    with pytest.raises(ValueError, match="base_ctr"):
        WorldConfig(base_ctr=1.5)
    with pytest.raises(ValueError, match="trend_persistence"):
        WorldConfig(trend_persistence=1.0)
    with pytest.raises(ValueError, match="whole UTC hour"):
        SyntheticWorld(WorldConfig(**SMALL), START + timedelta(minutes=5))
    assert (
        WorldConfig(n_dense=2, **SMALL)
        and SyntheticWorld(WorldConfig(n_dense=2, **SMALL), START).hour(0).num_columns == 11
    )


def test_shard_of_is_stable_and_balanced() -> None:
    ids = np.arange(100_000, dtype=np.int64) + (498_192 << ROW_BITS)
    shards = shard_of(ids, 3)
    assert shards.min() == 0 and shards.max() == 2
    assert np.all(np.abs(np.bincount(shards) / len(ids) - 1 / 3) < 0.01)
    assert np.array_equal(shards, shard_of(pa.array(ids), 3))


def test_click_logit_is_the_generators_oracle() -> None:
    from sklearn.metrics import roc_auc_score

    world = SyntheticWorld(WorldConfig(seed=3, rows_per_hour=20_000), datetime(2026, 11, 1, tzinfo=timezone.utc))
    table = world.hour(30)
    clicks = table.column("click").to_numpy()
    logit = world.click_logit(table, 30)
    assert abs(float((1 / (1 + np.exp(-logit))).mean()) - clicks.mean()) < 0.005  # calibrated: it made the clicks
    assert roc_auc_score(clicks, logit) > roc_auc_score(clicks, world.click_logit(table, 30, with_trend=False)) > 0.75

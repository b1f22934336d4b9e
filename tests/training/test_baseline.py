"""The popularity prior and the verdict a model must pass (guards for a model that does not learn):
counts on hand-made batches, smoothing, unseen ids, unlabelled rows skipped, per-feature AUCs on
held-out rows, and the verdict's texts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from primus_dagster.data import Batch
from primus_dagster.training.baseline import (
    CHANCE_MARGIN,
    BaselineVerdict,
    PopularityPrior,
    PriorScores,
    prior_aucs,
    verdict,
    verdict_text,
)
from primus_dagster.training.metrics import auc


def batch(ids: list[list[int]], labels: list[float], names: tuple[str, ...] = ("item", "user")) -> Batch:
    sparse = torch.tensor(ids, dtype=torch.int64).reshape(len(labels), len(names))
    dense = torch.zeros(len(labels), 1)
    return Batch.from_tensors(dense, sparse, torch.tensor(labels), kind="batch", sparse_names=names)


def test_the_prior_smooths_each_ids_rate_towards_the_global_rate() -> None:
    prior = PopularityPrior()  # a = 10
    prior.update(batch([[1, 7], [1, 7], [1, 8], [2, 8]], [1.0, 1.0, 0.0, 0.0]))
    assert prior.rows == 4 and prior.global_rate == 0.5 and prior.features == ["item", "user"]
    scores = prior.score(batch([[1, 7], [2, 8], [3, 9]], [0.0, 0.0, 0.0]))
    # item 1: 2 of 3 positive; item 2: 0 of 1; item 3 never seen: the global rate
    assert scores["item"] == pytest.approx([(2 + 10 * 0.5) / (3 + 10), (0 + 10 * 0.5) / (1 + 10), 0.5])
    assert scores["user"] == pytest.approx([(2 + 5) / 12, (0 + 5) / 12, 0.5])
    raw = PopularityPrior(smoothing=0.0).fit([batch([[1, 7], [1, 7], [1, 8], [2, 8]], [1.0, 1.0, 0.0, 0.0])])
    assert raw.rate("item", [1, 2, 3]).tolist() == pytest.approx([2 / 3, 0.0, 0.5])
    assert raw.rate("no_such_feature", np.array([1])).tolist() == [0.5]
    with pytest.raises(ValueError, match="smoothing"):
        PopularityPrior(smoothing=-1)


def test_unlabelled_rows_are_skipped_and_counts_merge_across_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    import primus_dagster.training.baseline as baseline_module

    monkeypatch.setattr(baseline_module, "_MIN_MERGE", 3)  # merge often: sorted ids + sums, merged per batch
    prior = PopularityPrior(smoothing=0.0)
    assert prior.update(batch([[5, 0], [5, 0]], [float("nan"), float("nan")])) == 0  # not labelled yet
    assert prior.rows == 0 and math.isnan(prior.global_rate) and prior.features == []
    assert prior.update(batch([[5, 0], [9, 0], [5, 0]], [1.0, float("nan"), 0.0])) == 2
    prior.update_arrays(["item", "user"], np.array([[9, 0], [5, 0], [-3, 0], [2**62, 0]]), np.array([1, 1, 0, 1.0]))
    prior.update(batch([[9, 0]], [1.0]))
    assert prior.rows == 7 and prior.positives == 5.0
    assert prior.rate("item", torch.tensor([5, 9, -3, 2**62, 4])).tolist() == pytest.approx(
        [2 / 3, 1.0, 0.0, 1.0, 5 / 7]
    )  # the NaN row of id 9 counted for nothing; -3 and 2**62 are ids like any other


def test_fit_stops_at_max_rows_without_pulling_another_batch() -> None:
    pulled = []

    def batches():
        for i in range(5):
            pulled.append(i)
            yield batch([[i, 0]] * 4, [1.0, 0.0, 1.0, 0.0])

    prior = PopularityPrior().fit(batches(), max_rows=6)
    assert prior.rows == 6 and pulled == [0, 1]
    assert prior.rate("item", [1]).tolist() == pytest.approx([(1 + 10 * 0.5) / (2 + 10)])  # 2 rows of batch 1


def test_prior_aucs_score_each_feature_on_held_out_rows_and_name_the_best() -> None:
    rng = np.random.default_rng(3)
    items, users = rng.integers(0, 50, 4000), rng.integers(0, 50, 4000)
    like = rng.random(50)  # items differ in like-rate; users do not
    labels = (rng.random(4000) < like[items]).astype(np.float32)
    rows = np.stack([items, users], axis=1)
    prior = PopularityPrior().fit([batch(rows[:3000].tolist(), labels[:3000].tolist())])
    held = [batch(rows[3000:3500].tolist(), labels[3000:3500].tolist()), batch(rows[3500:].tolist(), labels[3500:])]
    result = prior_aucs(prior, held, max_rows=800)
    assert isinstance(result, BaselineVerdict)
    assert result.popularity_feature == "item" and result.popularity_auc > 0.65 and result.aucs["user"] < 0.6
    assert (result.train_rows, result.eval_rows) == (3000, 800)  # the second batch cut at max_rows
    expected = auc(labels[3000:3800], prior.rate("item", items[3000:3800]))
    assert result.popularity_auc == pytest.approx(expected) and set(result.to_dict()) >= {"aucs", "popularity_auc"}
    # unlabelled held-out rows are negatives, as the model's evaluation reads them (skipped, one class: None)
    fitted = PopularityPrior().fit([batch([[1, 0], [1, 0], [2, 0], [2, 0]], [1.0, 1.0, 0.0, 0.0])])
    scores = PriorScores(fitted)
    assert list(scores.watch([batch([[1, 0], [2, 0]], [float("nan"), 1.0])])) and scores.rows == 2
    unlabelled_negative = scores.baseline()
    assert unlabelled_negative is not None and unlabelled_negative.aucs["item"] == 0.0
    # user 0 is in every row: one score for all, AUC 0.5 -- the best here
    assert unlabelled_negative.aucs["user"] == 0.5 and unlabelled_negative.popularity_feature == "user"


def test_no_baseline_without_sparse_features_rows_or_both_classes() -> None:
    no_sparse = Batch.from_tensors(
        torch.zeros(4, 2), torch.zeros(4, 0, dtype=torch.int64), torch.tensor([1.0, 0, 1, 0]), kind="batch"
    )
    prior = PopularityPrior().fit([no_sparse])
    assert prior.rows == 4 and prior.features == []
    assert prior_aucs(prior, [no_sparse]) is None  # a model with no sparse features: no prior
    fitted = PopularityPrior().fit([batch([[1, 1], [2, 2]], [1.0, 0.0])])
    assert prior_aucs(fitted, [batch([[1, 1], [2, 2]], [1.0, 1.0])]) is None  # one class: no AUC
    assert prior_aucs(fitted, []) is None and prior_aucs(fitted, [batch([[1, 1]], [1.0])], max_rows=0) is None
    assert prior_aucs(PopularityPrior(), [batch([[1, 1], [2, 2]], [1.0, 0.0])]) is None  # no training rows


def test_the_verdict_fails_at_chance_and_below_the_prior() -> None:
    prior = BaselineVerdict(0.703, "item_id", {"item_id": 0.703, "user_id": 0.55})
    assert verdict(0.712, prior) == (
        True,
        "AUC 0.7120 >= the popularity prior on feature item_id (0.7030) and > 0.5 + 0.01",
    )
    assert verdict(0.70, prior) == (False, "below the popularity prior on feature item_id: 0.7000 < 0.7030")
    assert verdict(0.703, prior)[0]  # equal to the prior: not below it
    assert verdict(0.5 + CHANCE_MARGIN, None) == (False, "no better than chance: AUC 0.5100 <= 0.5 + 0.01")
    assert verdict(0.45, prior)[1].startswith("no better than chance")  # chance is checked first
    assert verdict(0.52, None) == (True, "AUC 0.5200 > 0.5 + 0.01 (no popularity prior: chance is the only bar)")
    assert not verdict(0.56, None, margin=0.1)[0]
    assert verdict(float("nan"), prior)[0] is False and verdict(None, None)[0] is False
    assert verdict_text(0.712, prior) == "AUC 0.7120 vs popularity prior 0.7030 (feature item_id): ok"
    assert verdict_text(0.69, prior) == (
        "AUC 0.6900 vs popularity prior 0.7030 (feature item_id): BELOW BASELINE: "
        "below the popularity prior on feature item_id: 0.6900 < 0.7030"
    )
    assert verdict_text(0.505, None) == (
        "AUC 0.5050 (no popularity prior): BELOW BASELINE: no better than chance: AUC 0.5050 <= 0.5 + 0.01"
    )

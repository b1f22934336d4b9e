"""``data.deterministic: true`` end to end: the same spec, data and seed train the same samples in the same
order and give the same evaluation AUC, with two data executor processes -- for one trainer and for a group
of two (each rank the same samples in the same order in both runs).

Each run is ``train_window`` on its own copy of the same synthetic world (its own MLflow store), with
``pools.data.replicas: 2`` executors; the trained sample ids are read back from the dev sample log
(:mod:`primus_dagster.devtools.trained_sample_ids`), written by a ``RunHooks.on_batch`` hook. A run that
fails mid-phase and is started again resumes from its checkpoint and goes on in the same order.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from jobkit import expected_ids, make_job

from primus_dagster.data import Batch
from primus_dagster.data.graph import Planner
from primus_dagster.devtools.trained_sample_ids import TrainedSampleIdsLog, read_trained_sample_ids
from primus_dagster.spec import load_job_spec
from primus_dagster.training.run_state import RunHooks, TrainingRequest
from primus_dagster.training.window import train_window

pytestmark = pytest.mark.integration

PLAIN_DATA = "data: {lease: 5s, buffer_batches: 4}"


def _deterministic_job(root: Path, mode: str, model: str, every: int = 1000, trainers: int = 1) -> dict:
    """The jobkit job (``pools.data.replicas: 2``) with ``data.deterministic: true``, a seed and
    ``trainers`` trainers."""
    env = make_job(root, mode=mode, model=model, every=every, extra_training="seed: 11")
    path: Path = env["job_path"]
    text = path.read_text()
    assert PLAIN_DATA in text and text.count("training: {replicas: 1}") == 1
    text = text.replace(PLAIN_DATA, "data: {lease: 5s, buffer_batches: 4, deterministic: true}")
    path.write_text(text.replace("training: {replicas: 1}", f"training: {{replicas: {trainers}}}"))
    env["job"] = load_job_spec(path)
    assert env["job"].data.deterministic and env["job"].pools.data.replicas == 2
    assert env["job"].pools.training.replicas == trainers
    return env


class _Stop(RuntimeError):
    """Raised by the hook that fails a run mid-phase."""


def _train(env: dict, log: Path, fail_at_step: int | None = None) -> tuple[np.ndarray, float | None]:
    """One run (2 executors); the sample ids it trained, in order, and its eval AUC."""

    def on_batch(step: int, batch: Batch, trainer: int) -> None:
        samples.append(step, batch.sample_id)
        if fail_at_step is not None and step >= fail_at_step:
            raise _Stop(f"failed at step {step}")

    request = TrainingRequest(env["job"], env["job_path"], env["root"], env["window"], executors=2)
    auc = None
    with TrainedSampleIdsLog(log) as samples:
        if fail_at_step is None:
            result = train_window(request, RunHooks(on_batch=on_batch))
            assert result.evaluation is not None
            auc = result.evaluation.result.auc
        else:
            with pytest.raises(_Stop):
                train_window(request, RunHooks(on_batch=on_batch))
    ids = [ids for _, ids in read_trained_sample_ids(log)]
    return np.concatenate(ids), auc


@pytest.mark.parametrize(("mode", "model"), [("mixed", "mtrm"), ("batch", "single")])
def test_two_runs_train_the_same_samples_in_the_same_order(tmp_path: Path, mode: str, model: str) -> None:
    first = _deterministic_job(tmp_path / "a", mode, model)
    second = _deterministic_job(tmp_path / "b", mode, model)
    ids_a, auc_a = _train(first, tmp_path / "a.bin")
    ids_b, auc_b = _train(second, tmp_path / "b.bin")
    kinds = {"mixed": {"batch", "stream"}, "batch": {"batch"}}[mode]
    planned = Planner(first["job"].dataset, first["context"], threads=2).plan(first["window"]).tasks
    assert Counter(ids_a.tolist()) == expected_ids(first, [t for t in planned if t.kind in kinds])  # each once
    assert ids_a.tolist() == ids_b.tolist()
    assert auc_a is not None and auc_b is not None and abs(auc_a - auc_b) <= 1e-6


def test_a_resumed_run_goes_on_in_the_same_order(tmp_path: Path) -> None:
    reference = _deterministic_job(tmp_path / "ref", "mixed", "mtrm", every=6)
    resumed = _deterministic_job(tmp_path / "res", "mixed", "mtrm", every=6)
    whole, auc_whole = _train(reference, tmp_path / "ref.bin")
    before, _ = _train(resumed, tmp_path / "before.bin", fail_at_step=15)  # checkpoints at steps 6 and 12
    after, auc_after = _train(resumed, tmp_path / "after.bin")
    assert 0 < len(after) < len(whole)  # resumed from a checkpoint, not from the start
    kept = len(whole) - len(after)
    assert before[:kept].tolist() + after.tolist() == whole.tolist()
    assert auc_whole is not None and auc_after is not None and abs(auc_whole - auc_after) <= 1e-6


def test_a_group_of_two_trains_the_same_samples_in_the_same_order_on_each_rank(tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        env = _deterministic_job(tmp_path / name, "mixed", "mtrm", every=6, trainers=2)
        by_rank: dict[int, list[int]] = {0: [], 1: []}

        def on_batch(step: int, batch: Batch, trainer: int, into: dict[int, list[int]] = by_rank) -> None:
            into[trainer].extend(int(i) for i in batch.sample_id.tolist())

        request = TrainingRequest(env["job"], env["job_path"], env["root"], env["window"], executors=2)
        result = train_window(request, RunHooks(on_batch=on_batch))
        assert result.evaluation is not None and len(result.checkpoints) >= 2
        runs.append((env, by_rank, result.evaluation.result.auc, result.stats["ranks"]))
    (env, first, auc_a, ranks_a), (_, second, auc_b, ranks_b) = runs
    assert first[0] and first[1]  # both ranks trained
    planned = Planner(env["job"].dataset, env["context"], threads=2).plan(env["window"]).tasks
    assert Counter(first[0] + first[1]) == expected_ids(env, planned)  # each sample once across the ranks
    assert first == second  # per rank: the same samples in the same order
    assert abs(auc_a - auc_b) <= 1e-6
    assert ranks_a[0]["params_checksum"] == ranks_a[1]["params_checksum"] == ranks_b[0]["params_checksum"]


def _group_run(env: dict, fail_at_step: int | None = None) -> tuple[dict[int, list[int]], float | None]:
    """One run of a group of two; the sample ids each rank trained, in order, and the eval AUC."""
    by_rank: dict[int, list[int]] = {0: [], 1: []}

    def on_batch(step: int, batch: Batch, trainer: int) -> None:
        by_rank[trainer].extend(int(i) for i in batch.sample_id.tolist())
        if fail_at_step is not None and step >= fail_at_step:
            raise _Stop(f"failed at step {step}")

    request = TrainingRequest(env["job"], env["job_path"], env["root"], env["window"], executors=2)
    if fail_at_step is not None:
        with pytest.raises(_Stop):
            train_window(request, RunHooks(on_batch=on_batch))
        return by_rank, None
    result = train_window(request, RunHooks(on_batch=on_batch))
    assert result.evaluation is not None
    return by_rank, result.evaluation.result.auc


def test_a_resumed_group_goes_on_in_the_same_order_on_each_rank(tmp_path: Path) -> None:
    whole, auc_whole = _group_run(_deterministic_job(tmp_path / "ref", "mixed", "mtrm", every=6, trainers=2))
    resumed = _deterministic_job(tmp_path / "res", "mixed", "mtrm", every=6, trainers=2)
    before, _ = _group_run(resumed, fail_at_step=15)
    after, auc_after = _group_run(resumed)
    for rank in (0, 1):
        kept = len(whole[rank]) - len(after[rank])
        assert 0 < kept <= len(before[rank])  # resumed from a checkpoint, not from the start
        assert before[rank][:kept] + after[rank] == whole[rank]
    assert auc_whole is not None and auc_after is not None and abs(auc_whole - auc_after) <= 1e-6

"""The training asset in-process: lagged partition mappings, typed metadata, the AUC check across
partitions, and the model registry (a version per partition; ``champion`` only on a checked one) --
real data plane processes and MLflow on SQLite."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import mlflow
import mlflow.pytorch
import pytest
import torch
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    Definitions,
    MetadataValue,
    materialize,
)

from primus_dagster.dagster_defs import (
    ExecutorPoolResource,
    MlflowResource,
    PrimusStorageResource,
    build_training_asset,
)
from primus_dagster.dagster_defs import training_asset as training_asset_module
from primus_dagster.dagster_defs.schedules import auc_final_job
from primus_dagster.dagster_defs.training_asset import (
    auc_check,
    build_auc_final_check,
    promotes,
    register_version,
    source_deps,
    training_partitions_def,
    typed_metadata,
    url_or_text,
)
from primus_dagster.data import TimeWindow
from primus_dagster.training import window as window_module
from primus_dagster.training.baseline import BaselineVerdict, verdict
from primus_dagster.training.evaluation import NextHourEvaluation
from primus_dagster.training.metrics import EvalResult
from primus_dagster.training.result import TrainingResult
from primus_dagster.training.tracking import MlflowTracker, use_tracking_uri

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from jobkit import EXAMPLE_MODELS, make_job, skip_without_torchrec

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}

pytestmark = [
    # SQLAlchemy 2 deprecates a loader strategy MLflow's sqlite store still configures
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated"),
    pytest.mark.filterwarnings("ignore:.*Any type hint is inferred as AnyType:UserWarning"),
]


def test_partitions_start_where_lagged_batch_data_exists_and_batch_deps_are_shifted(tmp_path: Path) -> None:
    env = make_job(tmp_path, hours=0, extra_training="partition: hour\nbatch_lag: 2h")
    job = env["job"]
    assert training_partitions_def(job).get_first_partition_key() == "2026-11-01-02:00"
    deps = {d.asset_key.to_user_string(): d.partition_mapping for d in source_deps(job)}
    assert (deps["imp"].start_offset, deps["imp"].end_offset) == (-2, -2)  # batch: two hours back
    assert (deps["events"].start_offset, deps["events"].end_offset) == (0, 0)  # stream: the same hour
    daily = make_job(tmp_path / "daily", hours=0, extra_training="partition: day\nbatch_lag: 24h")["job"]
    assert training_partitions_def(daily).get_first_partition_key() == "2026-11-02"
    assert {d.asset_key.to_user_string(): d.partition_mapping.start_offset for d in source_deps(daily)}["imp"] == -1


def test_auc_check_passes_within_tolerance_and_fails_past_it(tmp_path: Path) -> None:
    job = make_job(tmp_path, hours=0)["job"]  # auc_tolerance: 0.01 (default)
    assert auc_check(job, 0.70, None).passed
    assert auc_check(job, 0.692, 0.70).passed
    failed = auc_check(job, 0.685, 0.70)
    assert not failed.passed and failed.metadata["drop"].value == pytest.approx(0.015)
    assert not auc_check(job, None, 0.7).passed


def test_a_version_registered_through_an_mlflow_server_links_to_its_page_and_the_registry(tmp_path: Path) -> None:
    """The tracker here is a stand-in for its two calls (an MLflow server's answers are not what is tested:
    tests/devtools/test_demo.py serves one with make dev): the metadata a version gets from them."""

    class ServerTracker:
        tracking_uri = "http://127.0.0.1:5000"

        def register_model(self, model_uri: str, name: str, tags: dict) -> str:
            return "4"

        def model_version_url(self, name: str, version: str) -> str:
            return MlflowTracker.model_version_url(self, name, version)  # type: ignore[arg-type]

    job = make_job(tmp_path, hours=0)["job"]
    version, metadata = register_version(ServerTracker(), job, "models:/m-1", {})  # type: ignore[arg-type]
    name = metadata["registered_model"].value
    assert version == "4" and metadata["model_version_uri"].value == f"models:/{name}/4"
    assert metadata["model_version_url"] == MetadataValue.url(f"http://127.0.0.1:5000/#/models/{name}/versions/4")
    assert metadata["registered_model_url"] == MetadataValue.url(f"http://127.0.0.1:5000/#/models/{name}")


def test_only_a_passed_check_promotes_and_metadata_is_typed(tmp_path: Path) -> None:
    job = make_job(tmp_path, hours=0)["job"]
    assert promotes(auc_check(job, 0.70, None)) and promotes(auc_check(job, 0.697, 0.70))
    assert not promotes(auc_check(job, 0.685, 0.70))  # a regression
    assert not promotes(auc_check(job, None, 0.70))  # no evaluation: not a checked model either
    assert not promotes(AssetCheckResult(check_name="auc_not_regressed", passed=False))
    assert url_or_text("http://mlflow:5000/#/experiments/1/runs/r") == MetadataValue.url(
        "http://mlflow:5000/#/experiments/1/runs/r"
    )
    assert url_or_text("sqlite:////tmp/m.db#/experiments/1/runs/r") == MetadataValue.text(
        "sqlite:////tmp/m.db#/experiments/1/runs/r"
    )
    meta = typed_metadata(
        {"samples": 1200, "samples_per_s": 5.5, "mlflow_run_url": "https://m/#/x", "source_versions": {"imp": 3}}
        | {"model_uri": "models:/m-1", "resumed_from_step": None, "eval_auc": 0.7, "window_start": "2026-11-01"}
    )
    assert meta == {
        "samples": MetadataValue.int(1200),
        "dagster/row_count": MetadataValue.int(1200),
        "samples_per_s": MetadataValue.float(5.5),
        "mlflow_run_url": MetadataValue.url("https://m/#/x"),
        "source_versions": MetadataValue.json({"imp": 3}),
        "model_uri": MetadataValue.text("models:/m-1"),
        "eval_auc": MetadataValue.float(0.7),
        "window_start": MetadataValue.text("2026-11-01"),
    }
    description = training_asset_module.build_training_asset(
        make_job(tmp_path / "lag", hours=0, extra_training="partition: hour\nbatch_lag: 24h")["job"], "job.yaml"
    ).descriptions_by_key
    assert "batch lag 1d" in next(iter(description.values()))  # not "1 day, 0:00:00"


def test_a_model_below_the_popularity_prior_or_chance_fails_the_blocking_check_and_is_not_promoted(
    tmp_path: Path,
) -> None:
    job = make_job(tmp_path, hours=0)["job"]
    prior = BaselineVerdict(0.72, "item_id", {"item_id": 0.72, "user_id": 0.61})
    below = auc_check(job, 0.70, None, prior)  # the first partition: no previous AUC to regress from
    assert not below.passed and not promotes(below) and below.severity == AssetCheckSeverity.ERROR
    assert below.metadata["popularity_feature"].value == "item_id"
    assert below.metadata["popularity_auc"].value == pytest.approx(0.72)
    assert below.metadata["popularity_aucs"].value == {"item_id": 0.72, "user_id": 0.61}
    reason = "below the popularity prior on feature item_id: 0.7000 < 0.7200"
    assert below.metadata["reason"].value == reason == below.description
    # within the tolerance of the previous partition, but below the prior: still not a champion
    assert not promotes(auc_check(job, 0.70, 0.70, prior))
    # no better than chance (0.5 + 0.01), with or without a prior (a model without sparse features has none)
    chance = auc_check(job, 0.505, None)
    assert not promotes(chance) and chance.severity == AssetCheckSeverity.ERROR
    assert chance.metadata["reason"].value.startswith("no better than chance: AUC 0.5050")
    assert not promotes(auc_check(job, 0.51, 0.49, BaselineVerdict(0.50, "item_id")))
    # above the prior: the tolerance decides as before
    above = auc_check(job, 0.73, None, prior)
    assert promotes(above) and above.metadata["popularity_feature"].value == "item_id"
    assert promotes(auc_check(job, 0.725, 0.73, prior)) and not promotes(auc_check(job, 0.721, 0.735, prior))
    assert promotes(auc_check(job, 0.60, None))  # no prior: chance is the only bar
    # baseline_guard: warn -- the check fails with severity WARN (the run goes on), still no champion
    warned_job = make_job(tmp_path / "warn", hours=0, extra_training="baseline_guard: warn")["job"]
    warned = auc_check(warned_job, 0.70, None, prior)
    assert not warned.passed and not promotes(warned) and warned.severity == AssetCheckSeverity.WARN


class _Tracker:
    """What the asset asks of its MLflow tracker once trained, recording the aliases it sets."""

    def __init__(self) -> None:
        self.aliases: list[tuple[str, str, str]] = []

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self.aliases.append((name, alias, version))

    def alias_version(self, name: str, alias: str) -> str | None:
        return None


def _materialise_first_partition(job, tmp_path: Path) -> tuple[DagsterInstance, Any]:
    """The training asset's first partition materialised in process (its training faked by the caller)."""
    resources = {
        "storage": PrimusStorageResource(data_root=str(tmp_path)),
        "mlflow": MlflowResource(),
        "executor_pool": ExecutorPoolResource(data_executors=1),
    }
    instance = DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    result = materialize(
        [build_training_asset(job, tmp_path / "job.yaml")],
        partition_key=training_partitions_def(job).get_first_partition_key(),
        instance=instance,
        resources=resources,
        run_config=QUIET,
        raise_on_error=False,
    )
    return instance, result


@pytest.mark.parametrize(("prior_auc", "promoted"), [(0.72, False), (0.69, True)])
def test_the_asset_never_moves_the_champion_to_a_model_below_the_popularity_prior(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prior_auc: float, promoted: bool
) -> None:
    """The training asset with the training itself faked: a model of AUC 0.70 against a prior of
    ``prior_auc`` on the same rows; below it, the version is registered but ``champion`` does not move."""
    job = make_job(tmp_path, hours=0)["job"]
    tracker = _Tracker()

    def fake_train_window(request, hooks) -> TrainingResult:
        held = TimeWindow(request.window.end, request.window.end + timedelta(hours=1))
        baseline = BaselineVerdict(prior_auc, "item_id", {"item_id": prior_auc}, train_rows=900, eval_rows=300)
        evaluation = NextHourEvaluation(EvalResult(0.70, 0.6, 300, 90, 0.3), "batch", held, baseline)
        return TrainingResult(
            "run-1", "sqlite:///x#/r", "models:/m-1", request.window, {"samples": 900}, evaluation, {}
        )

    monkeypatch.setattr(window_module, "train_window", fake_train_window)
    monkeypatch.setattr(MlflowResource, "tracker", lambda self, job: tracker)
    monkeypatch.setattr(training_asset_module, "register_version", lambda *args: ("7", {}))
    _, result = _materialise_first_partition(job, tmp_path)
    assert result.success == promoted  # a failed blocking check fails the step
    (check,) = result.get_asset_check_evaluations()
    assert check.passed == promoted and check.blocking
    assert check.metadata["popularity_feature"].value == "item_id"
    assert check.metadata["popularity_auc"].value == pytest.approx(prior_auc)
    (event,) = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    assert metadata["champion"] == MetadataValue.bool(promoted)
    assert metadata["popularity_auc"] == MetadataValue.float(prior_auc)
    assert metadata["popularity_feature"] == MetadataValue.text("item_id")
    assert metadata["baseline_verdict"].value.endswith(": ok" if promoted else "0.7000 < 0.7200")
    assert tracker.aliases == ([("train-test", "champion", "7")] if promoted else [])


def test_a_model_without_evaluation_is_not_registered_and_the_asset_asks_for_the_whole_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The training asset with the training faked: a run with no held-out rows after its window (no
    evaluation) is materialised with its MLflow model, but no version is registered (nothing checked
    it); the asset asks the engine for the whole window (``complete_window``)."""
    spec = make_job(tmp_path, hours=0)["job"]
    job = spec.model_copy(update={"owners": ["team:recsys"], "tags": {"domain": "ads"}})
    requests = []

    def fake_train_window(request, hooks) -> TrainingResult:
        requests.append(request)
        return TrainingResult("run-1", "sqlite:///x#/r", "models:/m-1", request.window, {"samples": 900}, None, {})

    def no_registration(*args):
        raise AssertionError("an unevaluated model must not be registered")

    monkeypatch.setattr(window_module, "train_window", fake_train_window)
    monkeypatch.setattr(MlflowResource, "tracker", lambda self, job: _Tracker())
    monkeypatch.setattr(training_asset_module, "register_version", no_registration)
    instance, result = _materialise_first_partition(job, tmp_path)
    assert result.success  # the missing evaluation is a WARN: the partition is trained
    run = instance.get_run_by_id(result.run_id)
    assert run is not None and run.tags["mlflow/run_id"] == "run-1"  # the way from the Dagster run to MLflow
    (request,) = requests
    assert request.complete_window
    asset = build_training_asset(job, tmp_path / "job.yaml")
    assert asset.owners_by_key[asset.key] == ["team:recsys"] and asset.tags_by_key[asset.key]["domain"] == "ads"
    (check,) = result.get_asset_check_evaluations()
    assert not check.passed and check.severity == AssetCheckSeverity.WARN
    assert check.partition == training_partitions_def(job).get_first_partition_key()  # recorded per partition
    (event,) = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    assert metadata["model_uri"] == MetadataValue.text("models:/m-1")
    assert metadata["model_registered"].value.startswith("no evaluation after the window: not registered")
    assert "model_version" not in metadata and "champion" not in metadata


@pytest.mark.integration
def test_two_partitions_materialise_with_metadata_and_the_check_compares_with_the_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "data").mkdir()
    # The model of this tiny world does not learn (AUC ~0.45, below its popularity prior ~0.55-0.6): the
    # guard is waived here to see partitions promoted (it is tested above, and the metadata still names it).
    monkeypatch.setattr(training_asset_module, "verdict", lambda auc, baseline: (True, "waived by the test"))
    # a wide tolerance: the first two partitions pass their check; the third is forced to regress
    training = "partition: hour\nbatch_lag: 1h\nauc_tolerance: 0.5"
    env = make_job(tmp_path / "data", mode="mixed", hours=4, extra_training=training)
    asset = build_training_asset(env["job"], env["job_path"])
    resources = {
        "storage": PrimusStorageResource(data_root=str(env["root"])),
        "mlflow": MlflowResource(),
        "executor_pool": ExecutorPoolResource(data_executors=1),
    }
    instance = DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))  # else a temp dir left behind
    key = AssetKey("train_test_model")
    client = mlflow.MlflowClient(env["job"].tracking.tracking_uri)
    for version, partition in enumerate(("2026-11-01-01:00", "2026-11-01-02:00"), 1):  # partitions train in order
        result = materialize([asset], partition_key=partition, instance=instance, resources=resources, run_config=QUIET)
        assert result.success
        (event,) = result.get_asset_materialization_events()
        meta = {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
        assert meta["samples"] > 0 and meta["mlflow_run_id"] and meta["model_uri"].startswith("models:/")
        assert meta["window_start"].startswith(partition[:10]) and 0.0 <= meta["eval_auc"] <= 1.0
        (check,) = result.get_asset_check_evaluations()
        assert check.asset_key == key and check.passed
        # a version per partition, tagged with what it was trained on and by whom; champion: the checked one
        assert (meta["registered_model"], meta["model_version"], meta["champion"]) == ("train-test", version, True)
        assert meta["model_version_uri"] == f"models:/train-test/{version}"
        registered = client.get_model_version("train-test", str(version))
        assert registered.run_id == meta["mlflow_run_id"] and registered.source == meta["model_uri"]
        assert registered.tags["primus.partition"] == registered.tags["dagster.partition"] == partition
        assert registered.tags["dagster.run_id"] == result.run_id and registered.tags["primus.check"] == "passed"
        assert registered.tags["primus.window"] == f"{meta['window_start']}/{meta['window_end']}"
        assert json.loads(registered.tags["primus.source_versions"]) == meta["source_versions"]
        assert str(client.get_model_version_by_alias("train-test", "champion").version) == str(version)
        if partition.endswith("01:00"):
            first_run = meta["mlflow_run_id"]
            assert "warm_started_from" not in meta  # None: nothing before the first partition
    assert meta["warm_started_from"] == first_run  # continuous training: day 2 goes on from day 1's model
    champion_uri = meta["model_uri"]
    # Typed values, read back through the instance.
    stored = instance.fetch_materializations(key, limit=1).records[0].asset_materialization.metadata
    assert stored["dagster/row_count"] == MetadataValue.int(meta["samples"])
    assert isinstance(stored["samples"], type(MetadataValue.int(0)))
    assert isinstance(stored["samples_per_s"], type(MetadataValue.float(0.0)))
    assert isinstance(stored["source_versions"], type(MetadataValue.json({})))
    assert stored["mlflow_run_url"] == MetadataValue.text(meta["mlflow_run_url"])  # sqlite: no clickable URL
    assert stored["model_version"] == MetadataValue.int(2) and stored["champion"] == MetadataValue.bool(True)
    # The MLflow run leads back to the Dagster run, asset and partition; its experiment opens on models.
    run = client.get_run(meta["mlflow_run_id"])
    assert run.data.tags["dagster.run_id"] == result.run_id and run.data.tags["dagster.asset"] == "train_test_model"
    assert run.data.tags["dagster.partition"] == "2026-11-01-02:00"
    assert (
        run.data.tags["mlflow.source.type"] == "JOB"
        and result.dagster_run.job_name in run.data.tags["mlflow.source.name"]
    )
    assert run.data.tags["mlflow.user"]  # MLflow's User column
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert check.metadata["previous_auc"].value == pytest.approx(
        instance.fetch_materializations(key, limit=2).records[1].asset_materialization.metadata["eval_auc"].value
    )
    # Lineage and the column schema, read back through the instance.
    latest = instance.get_latest_materialization_event(key).asset_materialization
    assert latest.partition == "2026-11-01-02:00"
    columns = {c.name: c for c in latest.metadata["dagster/column_schema"].value.columns}
    assert list(columns)[:4] == ["sample_id", "ts", "label", "dense"] and {"user_id", "item_id"} <= set(columns)
    assert columns["label"].description == "imp: click; events: click"
    assert set(latest.metadata["consumed_partitions"].value) == {"imp", "events"}
    assert latest.metadata["source_versions"].value == meta["source_versions"]
    assert latest.metadata["mlflow_run_id"] == MetadataValue.text(meta["mlflow_run_id"])
    assert latest.metadata["model_version_uri"] == MetadataValue.text("models:/train-test/2")

    # The delayed final evaluation of partition 01:00 (its hour after has complete labels here): a check-only
    # run that loads the partition's registered version and scores it on the batch source's labels.
    job = env["job"]
    defs = Definitions(
        assets=[asset], asset_checks=[build_auc_final_check(job)], jobs=[auc_final_job(job)], resources=resources
    )
    final = defs.resolve_job_def("train_test_auc_final_job").execute_in_process(
        run_config=QUIET, tags={"dagster/partition": "2026-11-01-01:00"}, instance=instance
    )
    (evaluation,) = final.get_asset_check_evaluations()
    assert evaluation.check_name == "auc_final" and evaluation.asset_key == key
    assert (
        evaluation.metadata["model"].value == "models:/train-test/1" and evaluation.metadata["labels"].value == "batch"
    )
    first = (
        instance.fetch_materializations(
            AssetRecordsFilter(asset_key=key, asset_partitions=["2026-11-01-01:00"]), limit=1
        )
        .records[0]
        .asset_materialization.metadata
    )
    auc_final = evaluation.metadata["auc_final"].value
    # the batch hour after was there at materialisation: the same rows and model, so the same AUC
    assert first["eval_labels"].value == "batch" and auc_final == pytest.approx(first["eval_auc"].value, abs=1e-6)
    # the final check judges the model as the training check does: chance and the prior of its training rows
    assert evaluation.metadata["popularity_feature"].value in {"user_id", "item_id", "topic_id"}
    prior = BaselineVerdict(
        evaluation.metadata["popularity_auc"].value, evaluation.metadata["popularity_feature"].value
    )
    assert evaluation.passed == verdict(auc_final, prior)[0] and evaluation.severity == AssetCheckSeverity.WARN
    assert evaluation.metadata["baseline_verdict"].value == verdict(auc_final, prior)[1]
    assert client.get_metric_history(first["mlflow_run_id"].value, "final_auc")[-1].value == pytest.approx(auc_final)
    assert float(client.get_model_version("train-test", "1").tags["primus.final_auc"]) == pytest.approx(
        auc_final, abs=5e-7
    )  # tag: 6 decimals

    # A forced regression: the previous partition "had" an AUC the next one cannot come near.
    monkeypatch.setattr(training_asset_module, "previous_auc", lambda *args: 2.0)
    failed = materialize(
        [asset],
        partition_key="2026-11-01-03:00",
        instance=instance,
        resources=resources,
        run_config=QUIET,
        raise_on_error=False,
    )
    assert not failed.success  # blocking: the failed check fails the step (downstream does not run)
    (check,) = failed.get_asset_check_evaluations()
    assert not check.passed and check.blocking
    (event,) = failed.get_asset_materialization_events()  # materialised and registered all the same
    assert event.materialization.metadata["model_version"] == MetadataValue.int(3)
    assert event.materialization.metadata["champion"] == MetadataValue.bool(False)
    assert client.get_model_version("train-test", "3").tags["primus.check"] == "failed"
    assert str(client.get_model_version_by_alias("train-test", "champion").version) == "2"  # did not move

    # The champion loads by its alias (the package's classes and torch are its requirements).
    with use_tracking_uri(env["job"].tracking.tracking_uri):
        champion = mlflow.pytorch.load_model("models:/train-test@champion")
        same = mlflow.pytorch.load_model(champion_uri)
        signature = mlflow.models.Model.load("models:/train-test@champion").signature
    dense, sparse = torch.randn(4, champion.n_dense), torch.randint(0, 100, (4, champion.n_sparse))
    with torch.no_grad():
        assert torch.allclose(champion(dense, sparse, "batch"), same(dense, sparse, "batch"))
    assert [spec.name for spec in signature.inputs.inputs] == ["dense", "sparse"]


@pytest.mark.parametrize("example", list(EXAMPLE_MODELS))
def test_a_custom_model_materialises_a_partition_and_its_registered_version_scores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example: str
) -> None:
    """A team's own model (``training.model.type: custom``: the example DeepFM, and the TorchRec example
    where torchrec is installed) through the training asset: the partition trains on the real data plane,
    is registered and becomes champion, and the registered version loads back as the team's module and
    scores."""
    skip_without_torchrec(example)
    factory, params, net = EXAMPLE_MODELS[example]
    (tmp_path / "data").mkdir()
    # the tiny world does not learn (see the two-partition test): the popularity guard is waived
    monkeypatch.setattr(training_asset_module, "verdict", lambda auc, baseline: (True, "waived by the test"))
    model = f"{{type: custom, factory: '{factory}', params: {json.dumps(params)}, hash_buckets: 4096}}"
    env = make_job(
        tmp_path / "data", mode="mixed", hours=2, model_block=model, extra_training="partition: hour\nbatch_lag: 1h"
    )
    resources = {
        "storage": PrimusStorageResource(data_root=str(env["root"])),
        "mlflow": MlflowResource(),
        "executor_pool": ExecutorPoolResource(data_executors=1),
    }
    instance = DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    asset = build_training_asset(env["job"], env["job_path"])
    result = materialize(
        [asset], partition_key="2026-11-01-01:00", instance=instance, resources=resources, run_config=QUIET
    )
    assert result.success
    (event,) = result.get_asset_materialization_events()
    meta = {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
    assert meta["samples"] > 0 and 0.0 <= meta["eval_auc"] <= 1.0
    assert (meta["model_version"], meta["champion"]) == (1, True)
    with use_tracking_uri(env["job"].tracking.tracking_uri):
        loaded = mlflow.pytorch.load_model(meta["model_version_uri"]).eval()
    assert type(loaded).__name__ == "CustomModel" and type(loaded.net).__name__ == net
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        scores = torch.sigmoid(
            loaded.predict(
                torch.randn(4, loaded.n_dense, generator=generator),
                torch.randint(0, 2**40, (4, loaded.n_sparse), generator=generator),
            )
        )
    assert scores.shape == (4,) and bool(((scores > 0) & (scores < 1)).all())

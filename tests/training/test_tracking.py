"""MLflow tracking: runs, resume by run key, checkpoints as artifacts, the logged and registered model."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import shutil
import time
from pathlib import Path

import mlflow
import mlflow.pytorch
import numpy as np
import pyarrow as pa
import pytest
import torch

from primus_dagster.training.checkpoint import Checkpoint, checkpoint_name, load_checkpoint, save_checkpoint
from primus_dagster.training.tracking import (
    RUN_KEY_TAG,
    MlflowTracker,
    default_tracking_uri,
    model_requirements,
    model_signature,
    use_tracking_uri,
)

pytestmark = [
    # SQLAlchemy 2 deprecates a loader strategy MLflow's sqlite store still configures
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated"),
    # emitted while mlflow.pyfunc (imported lazily by log_model) builds its own chat schemas
    pytest.mark.filterwarnings("ignore:.*Any type hint is inferred as AnyType:UserWarning"),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One sqlite store for the module (creating its tables takes ~1 s); tests use their own experiments."""
    return tmp_path_factory.mktemp("mlflow")


@pytest.fixture
def uri(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)  # anything MLflow writes relative to the working dir shows up here
    return f"sqlite:///{store / 'mlflow.db'}"


@pytest.fixture
def exp(request: pytest.FixtureRequest) -> str:
    return request.node.name


def status(tracker: MlflowTracker, run_id: str) -> str:
    return tracker.client.get_run(run_id).info.status


def test_default_tracking_uri_and_artifact_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    expected = tmp_path / "home" / "mlflow"
    assert default_tracking_uri() == f"sqlite:///{expected / 'mlflow.db'}"
    assert expected.is_dir()
    tracker = MlflowTracker(None, "primus")
    assert tracker.tracking_uri == default_tracking_uri()
    experiment = tracker.client.get_experiment(tracker.experiment_id)
    assert experiment.artifact_location == str(expected / "artifacts")
    run_id = tracker.start("job", {"lr": 0.001})
    assert Path(tracker.client.get_run(run_id).info.artifact_uri).is_relative_to(expected / "artifacts")
    tracker.finish()


def test_start_log_finish(uri: str, exp: str) -> None:
    tracker = MlflowTracker(uri, exp)
    run_id = tracker.start("job-1", {"lr": 0.001, "mode": "mixed", "weights": {"batch": 1.0}}, tags={"owner": "t"})
    assert (tracker.run_id, tracker.resumed) == (run_id, False)
    assert tracker.run_url == f"{uri}#/experiments/{tracker.experiment_id}/runs/{run_id}"
    tracker.log_metrics({"loss": 0.5, "auc": float("nan")}, step=1)
    tracker.log_metrics({"loss": 0.25}, step=2)
    tracker.set_tags({"phase": "stream", "window": 3})
    assert status(tracker, run_id) == "RUNNING"
    tracker.finish()
    run = tracker.client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "job-1"
    assert run.data.params == {"lr": "0.001", "mode": "mixed", "weights": "{'batch': 1.0}"}
    assert run.data.tags[RUN_KEY_TAG] == "job-1"
    assert (run.data.tags["owner"], run.data.tags["phase"], run.data.tags["window"]) == ("t", "stream", "3")
    assert "auc" not in run.data.metrics  # NaN skipped
    history = tracker.client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.25)]
    with pytest.raises(ValueError, match="status"):
        tracker.finish("DONE")


def test_every_attempt_of_a_key_has_its_own_name_and_a_source(uri: str, exp: str) -> None:
    """A key trained again after it finished gets a new run named ``key #n``; each run carries the user and
    source tags ``mlflow.start_run`` would set (the runs table's User and Source columns)."""
    names = []
    for _ in range(3):
        tracker = MlflowTracker(uri, exp)
        run_id = tracker.start("job-again", {})
        tracker.finish()
        run = tracker.client.get_run(run_id)
        names.append(run.info.run_name)
        assert run.data.tags["mlflow.user"] and run.data.tags["mlflow.source.name"], run.data.tags
    assert names == ["job-again", "job-again #2", "job-again #3"]
    tracker = MlflowTracker(uri, exp)
    run_id = tracker.start("job-again", {}, tags={"mlflow.source.name": "dagster job j", "mlflow.source.type": "JOB"})
    tags = tracker.client.get_run(run_id).data.tags
    assert (tags["mlflow.source.name"], tags["mlflow.source.type"]) == ("dagster job j", "JOB")  # the caller's win


def test_source_inputs_carry_a_schema_and_a_profile(uri: str, exp: str) -> None:
    tracker = MlflowTracker(uri, exp)
    run_id = tracker.start("inputs", {})
    entry = {"type": "kafka", "kind": "stream", "partitions": ["2026-11-01T00:00"], "tasks": 2, "bytes": 0}
    entry["offsets"] = {"clicks:0": [10, 40], "clicks:1": [0, 5]}
    schema = pa.schema(
        [
            pa.field("ts", pa.timestamp("ms", tz="UTC"), nullable=False),
            pa.field("label", pa.float32()),
            pa.field("dense", pa.list_(pa.float32(), 3)),
            pa.field("genres", pa.list_(pa.int64()), nullable=False),
            pa.field("source", pa.dictionary(pa.int32(), pa.string())),
        ]
    )
    assert tracker.log_source_inputs({"clicks": entry}, schemas={"clicks": schema}) == 1
    (item,) = tracker.client.get_run(run_id).inputs.dataset_inputs
    assert json.loads(item.dataset.profile) == {
        "partitions": 1,
        "tasks": 2,
        "bytes": 0,
        "records": 35,
        "incomplete_partitions": 0,
    }
    assert json.loads(item.dataset.schema)["mlflow_colspec"] == [
        {"type": "datetime", "name": "ts", "required": True},
        {"type": "float", "name": "label", "required": False},
        {"type": "array", "items": {"type": "float"}, "name": "dense", "required": False},
        {"type": "array", "items": {"type": "long"}, "name": "genres", "required": True},
        {"type": "string", "name": "source", "required": False},
    ]
    tracker.finish()


def test_methods_need_a_started_run(uri: str, exp: str) -> None:
    tracker = MlflowTracker(uri, exp)
    with pytest.raises(RuntimeError, match="start"):
        tracker.log_metrics({"loss": 1.0}, step=0)
    with pytest.raises(ValueError, match="single quote"):
        tracker.start("it's", {})


@pytest.mark.parametrize("left", ["RUNNING", "KILLED", "FAILED"])
def test_resume_an_unfinished_run(uri: str, exp: str, left: str) -> None:
    first = MlflowTracker(uri, exp)
    run_id = first.start("job-2", {"lr": 0.001, "batch_size": 64})
    first.log_metrics({"loss": 0.5}, step=10)
    if left != "RUNNING":  # RUNNING: the process was killed without finishing the run
        first.finish(left)
    second = MlflowTracker(uri, exp)  # a restarted job
    assert second.start("job-2", {"lr": 0.5, "batch_size": 64, "threads": 2}) == run_id
    assert second.resumed
    run = second.client.get_run(run_id)
    assert run.info.status == "RUNNING"
    assert run.data.params == {"lr": "0.001", "batch_size": "64", "threads": "2"}  # immutable; missing added
    assert run.data.metrics == {"loss": 0.5}
    other = MlflowTracker(uri, exp)
    assert other.start("job-3", {}) != run_id  # another key: another run


def test_finished_run_or_no_resume_starts_a_new_run(uri: str, exp: str) -> None:
    tracker = MlflowTracker(uri, exp)
    finished = tracker.start("job-4", {"lr": 0.001})
    tracker.finish()
    again = MlflowTracker(uri, exp)
    fresh = again.start("job-4", {"lr": 0.002})
    assert fresh != finished and not again.resumed
    assert again.client.get_run(fresh).data.params == {"lr": "0.002"}
    # fresh is RUNNING, but resume=False still starts another run; the newest one is resumed later
    newest = MlflowTracker(uri, exp).start("job-4", {}, resume=False)
    assert newest not in (finished, fresh)
    assert MlflowTracker(uri, exp).start("job-4", {}) == newest


def tiny_checkpoint(step: int) -> Checkpoint:
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    return Checkpoint(
        step=step,
        samples=step * 2,
        model_state=model.state_dict(),
        optimizer_state=optimizer.state_dict(),
        data_snapshot={"barrier_id": step},
        source_versions={"delta": step},
        phase="batch",
        extra={},
    )


def test_checkpoints_as_artifacts(uri: str, exp: str, store: Path, tmp_path: Path) -> None:
    tracker = MlflowTracker(uri, exp)
    tracker.start("job-5", {})
    assert tracker.latest_checkpoint() is None
    for step in (12, 5):  # logged out of order: the highest step wins, not the latest upload
        local = save_checkpoint(tiny_checkpoint(step), tmp_path / "work" / checkpoint_name(step))
        assert tracker.log_checkpoint(local, step) == f"checkpoints/{checkpoint_name(step)}"
    assert tracker.checkpoint_steps() == [5, 12]
    assert (store / "artifacts").is_dir()  # <sqlite db folder>/artifacts

    resumed = MlflowTracker(uri, exp)
    resumed.start("job-5", {})
    local = resumed.latest_checkpoint(tmp_path / "download")
    assert local is not None and local.name == checkpoint_name(12)
    assert local.is_relative_to(tmp_path / "download")
    ckpt = load_checkpoint(local)
    assert (ckpt.step, ckpt.samples, ckpt.data_snapshot) == (12, 24, {"barrier_id": 12})
    temp = resumed.latest_checkpoint()
    assert temp is not None and load_checkpoint(temp).step == 12
    shutil.rmtree(temp.parent)  # the new temp folder is the caller's to remove
    with pytest.raises(FileNotFoundError):
        resumed.log_checkpoint(tmp_path / "nowhere", 13)
    assert not any(Path.cwd().iterdir())  # nothing leaked into the working dir


class TwoInputModel(torch.nn.Module):
    """Like the project's models: forward(dense, sparse, kind)."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = torch.nn.Linear(3, 1)
        self.embed = torch.nn.EmbeddingBag(10, 1, mode="sum")

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor, kind: str) -> torch.Tensor:
        return self.dense(dense) + self.embed(sparse) + (1.0 if kind == "stream" else 0.0)


@pytest.mark.integration
def test_log_model_round_trip(
    uri: str, exp: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    monkeypatch.setattr("mlflow.tracking._tracking_service.utils._tracking_uri", "sqlite:///elsewhere.db")
    tracker = MlflowTracker(uri, exp)
    run_id = tracker.start("job-6", {"lr": 0.001})
    model = TwoInputModel().eval()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        model_uri = tracker.log_model(model, input_example={"dense": [[1.0, 2.0, 3.0]], "kind": "batch"})
    assert time.monotonic() - started < 10
    # pickle is the suite's choice (log_model's docstring): MLflow's warning about it is not printed
    assert not [r for r in caplog.records if "Pickle" in r.getMessage()]
    assert logging.getLogger("mlflow.pytorch").filters == []  # and only during the call
    assert model_uri.startswith("models:/")
    assert mlflow.get_tracking_uri() == "sqlite:///elsewhere.db"  # the global URI was restored
    assert status(tracker, run_id) == "RUNNING"  # logging the model did not end the run
    logged = tracker.client.get_logged_model(model_uri.removeprefix("models:/"))
    assert logged.experiment_id == tracker.experiment_id and logged.source_run_id == run_id

    with use_tracking_uri(tracker.tracking_uri):
        loaded = mlflow.pytorch.load_model(model_uri)
        metadata = mlflow.models.Model.load(model_uri).metadata
    assert metadata == {"primus_input_example": {"dense": [[1.0, 2.0, 3.0]], "kind": "batch"}}
    dense, sparse = torch.randn(4, 3), torch.randint(0, 10, (4, 2))
    with torch.no_grad():
        assert torch.allclose(loaded(dense, sparse, "stream"), model(dense, sparse, "stream"))
    assert not any(Path.cwd().iterdir())  # no ./mlruns of the default experiment
    tracker.finish()


def test_use_tracking_uri_restores_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///from-env.db")
    monkeypatch.setattr("mlflow.tracking._tracking_service.utils._tracking_uri", None)
    inner = f"sqlite:///{tmp_path / 'inner.db'}"
    with use_tracking_uri(inner):
        assert mlflow.get_tracking_uri() == inner
    assert os.environ["MLFLOW_TRACKING_URI"] == "sqlite:///from-env.db"
    assert mlflow.get_tracking_uri() == "sqlite:///from-env.db"


class SizedModel(TwoInputModel):
    """Like the project's models, it knows its input widths (``n_dense`` / ``n_sparse``)."""

    n_dense, n_sparse = 3, 2


@pytest.mark.integration
def test_registered_versions_aliases_signature_and_requirements(uri: str, exp: str) -> None:
    tracker = MlflowTracker(uri, exp)
    run_id = tracker.start("job-7", {})
    name = f"{exp}-model"
    assert tracker.alias_version(name, "champion") is None  # no registered model yet
    model = SizedModel().eval()
    first = tracker.register_model(tracker.log_model(model), name, {"primus.partition": "p1", "samples": 10})
    second_uri = tracker.log_model(model)
    second = tracker.register_model(second_uri, name, {"primus.partition": "p2"})
    assert (first, second) == ("1", "2")  # one registered model, created once
    version = tracker.client.get_model_version(name, second)
    assert version.run_id == run_id and version.tags == {"primus.partition": "p2"}
    assert tracker.client.get_model_version(name, first).tags == {"primus.partition": "p1", "samples": "10"}
    logged = tracker.client.get_logged_model(second_uri.removeprefix("models:/"))
    assert json.loads(logged.tags["mlflow.modelVersions"]) == [{"name": name, "version": 2}]

    tracker.set_alias(name, "champion", first)
    assert tracker.alias_version(name, "champion") == "1" and tracker.alias_version(name, "live") is None
    tracker.set_alias(name, "champion", second)  # an alias moves
    assert tracker.alias_version(name, "champion") == "2"
    assert tracker.model_version_url(name, 2) == f"{uri}#/models/{name}/versions/2"

    with use_tracking_uri(tracker.tracking_uri):
        loaded = mlflow.pytorch.load_model(f"models:/{name}@champion")
        info = mlflow.models.Model.load(f"models:/{name}/{second}")
        requirements = Path(
            mlflow.artifacts.download_artifacts(artifact_uri=f"{logged.artifact_location}/requirements.txt")
        ).read_text()
    dense, sparse = torch.randn(4, 3), torch.randint(0, 10, (4, 2))
    with torch.no_grad():
        assert torch.allclose(loaded(dense, sparse, "batch"), model(dense, sparse, "batch"))
    assert info.signature == model_signature(3, 2)
    assert [(s.name, s.type, s.shape) for s in info.signature.inputs.inputs] == [
        ("dense", np.dtype("float32"), (-1, 3)),
        ("sparse", np.dtype("int64"), (-1, 2)),
    ]
    assert f"primus_dagster=={importlib.metadata.version('primus_dagster')}" in requirements.split()
    assert model_requirements()[0] == "torch" and "torch" in requirements.split()
    tracker.finish()


@pytest.mark.integration
def test_a_model_with_list_features_logs_its_layout_signature_and_loads(uri: str, exp: str) -> None:
    from primus_dagster.data import Jagged
    from primus_dagster.spec.job import ModelSpec, TrainingSpec
    from primus_dagster.training.features import FeatureLayout, fit_dense_stats
    from primus_dagster.training.models import build_model

    training = TrainingSpec(
        mode="batch",
        model=ModelSpec(type="single", hash_buckets=64, embedding_dim=4),
        features={
            "dense": [{"name": "price", "transform": "log1p"}],
            "categorical": [{"name": "u", "buckets": 32, "dim": 2}],
        },
    )
    layout = FeatureLayout.resolve(training, ["price"], ["u"], ["tags"])
    dense = torch.rand(6, 1) * 1000
    from primus_dagster.data import Batch

    stats = fit_dense_stats(
        layout, [Batch.from_tensors(dense, torch.zeros(6, 1, dtype=torch.int64), torch.zeros(6), kind="batch")], 100
    )
    model = build_model(training.model, layout=layout, stats=stats).eval()
    tracker = MlflowTracker(uri, exp)
    tracker.start("job-lists", {})
    model_uri = tracker.log_model(model)
    with use_tracking_uri(tracker.tracking_uri):
        loaded = mlflow.pytorch.load_model(model_uri)
        info = mlflow.models.Model.load(model_uri)
    lists = {"tags": Jagged(torch.tensor([5, 6, 7]), torch.tensor([0, 2, 2, 3, 3, 3, 3]))}
    sparse = torch.arange(6).unsqueeze(1)
    with torch.no_grad():
        assert torch.allclose(loaded.predict(dense, sparse, lists), model.predict(dense, sparse, lists))
    assert loaded.layout == layout and torch.equal(loaded.dense_transform.center, model.dense_transform.center)
    assert [s.name for s in info.signature.inputs.inputs] == ["dense", "sparse", "tags.values", "tags.offsets"]
    tracker.finish()

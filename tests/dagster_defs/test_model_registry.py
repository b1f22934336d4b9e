"""The live model asset and the model registry: each increment is a registered version of the job's
model, tagged with its run key, base, records and Dagster run, and the alias ``live`` (not ``champion``,
which only a checked training partition moves) follows it; its metadata is typed. (The training asset's
versions and ``champion`` are in test_training_asset.py.)"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

import mlflow
import pytest
import torch
from dagster import AssetKey, DagsterInstance, MetadataValue, materialize

from primus_dagster.dagster_defs import ExecutorPoolResource, KafkaResource, MlflowResource, PrimusStorageResource
from primus_dagster.dagster_defs.live_asset import LIVE_ALIAS, build_live_asset
from primus_dagster.dagster_defs.source_assets import build_source_assets
from primus_dagster.dagster_defs.training_asset import CHAMPION_ALIAS
from primus_dagster.devtools.model_load import (
    copy_package_source,
    load_and_score,
    model_requirements_of,
    repo_root,
    venv_python,
)
from primus_dagster.spec.job import ModelSpec
from primus_dagster.training import live as live_module
from primus_dagster.training.live import LiveResult, LiveStart
from primus_dagster.training.models import MTRM, CustomModel, build_model
from primus_dagster.training.tracking import MlflowTracker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from jobkit import EXAMPLE_MODELS, make_job, skip_without_torchrec

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}

pytestmark = [
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated"),
    pytest.mark.filterwarnings("ignore:.*Any type hint is inferred as AnyType:UserWarning"),
]


def test_source_asset_descriptions_write_durations_as_the_spec_does(tmp_path: Path) -> None:
    job = make_job(tmp_path, hours=0)["job"]
    descriptions = [d for asset in build_source_assets(job) for d in asset.descriptions_by_key.values()]
    assert descriptions and all("label delay 0s" in d for d in descriptions)  # not "0:00:00"
    assert not any("0:00:00" in d for d in descriptions)


def test_a_live_increment_without_new_records_records_no_materialisation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live asset with the increment faked to find no new records: the step succeeds, nothing is
    trained or registered, and no materialisation is recorded (the live model is unchanged)."""
    env = make_job(tmp_path, kafka="127.0.0.1:9", topic="registry-idle", hours=0)
    job = env["job"]
    start = LiveStart(None, None, {}, "no trained window yet: from the first offsets")
    monkeypatch.setattr(live_module, "run_live_increment", lambda increment, hooks: LiveResult(start, "k", 0, {}, None))
    resources = {
        "storage": PrimusStorageResource(
            data_root=str(env["root"]), kafka=KafkaResource(bootstrap_servers="127.0.0.1:9")
        ),
        "mlflow": MlflowResource(),
        "executor_pool": ExecutorPoolResource(data_executors=1),
    }
    instance = DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    result = materialize(
        [build_live_asset(job, env["job_path"])], instance=instance, resources=resources, run_config=QUIET
    )
    assert result.success
    assert result.get_asset_materialization_events() == []
    messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any("no new records: nothing trained, no materialisation" in m for m in messages)


@pytest.mark.integration
def test_a_live_increment_is_a_registered_version_under_the_live_alias(tmp_path: Path, kafka_broker) -> None:
    env = make_job(tmp_path, kafka=kafka_broker.bootstrap_servers, topic="registry-live", hours=1, rows_per_hour=600)
    job = env["job"]
    asset = build_live_asset(job, env["job_path"])
    resources = {
        "storage": PrimusStorageResource(
            data_root=str(env["root"]), kafka=KafkaResource(bootstrap_servers=kafka_broker.bootstrap_servers)
        ),
        "mlflow": MlflowResource(),
        "executor_pool": ExecutorPoolResource(data_executors=1),
    }
    instance = DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))  # else a temp dir left behind
    result = materialize([asset], instance=instance, resources=resources, run_config=QUIET)
    assert result.success
    (event,) = result.get_asset_materialization_events()
    assert event.asset_key == AssetKey("train_test_live_model")
    meta = event.materialization.metadata
    assert meta["new_records"].value > 0 and meta["dagster/row_count"] == MetadataValue.int(meta["samples"].value)
    assert meta["model_version"] == MetadataValue.int(1) and meta["registered_model"] == MetadataValue.text(
        "train-test"
    )
    assert isinstance(meta["tail"], type(MetadataValue.json({})))
    assert meta["mlflow_run_url"] == MetadataValue.text(meta["mlflow_run_url"].value)  # sqlite: text, not a url
    run = instance.get_run_by_id(result.run_id)
    assert run is not None and run.tags["mlflow/run_id"] == meta["mlflow_run_id"].value  # Dagster -> MLflow

    tracker = MlflowTracker(job.tracking.tracking_uri, job.tracking.experiment)
    assert tracker.alias_version("train-test", LIVE_ALIAS) == "1"
    assert tracker.alias_version("train-test", CHAMPION_ALIAS) is None  # only a checked partition is a champion
    version = tracker.client.get_model_version("train-test", "1")
    assert version.tags["primus.run_kind"] == "live" and version.tags["dagster.run_id"] == result.run_id
    assert version.tags["primus.live_run_key"] == meta["live_run_key"].value
    assert int(version.tags["primus.new_records"]) == meta["new_records"].value
    assert version.run_id == meta["mlflow_run_id"].value and version.source == meta["model_uri"].value
    client = mlflow.MlflowClient(job.tracking.tracking_uri)
    assert str(client.get_model_version_by_alias("train-test", LIVE_ALIAS).version) == "1"
    # the engine's stage lines reach the Dagster run log (run_log.engine_logs_to), as the training asset's do
    messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any(m.startswith("MLflow: opening the run") for m in messages)
    assert any(m.startswith("phase ") and "data executors up" in m for m in messages)


LOADED_MODELS = {  # what is registered -> the class the fresh venv must load
    "mtrm": (
        ModelSpec(type="mtrm", embedding_dim=8, hash_buckets=512, memory_hidden=[8], adapt_hidden=[8]),
        MTRM,
    ),
    # a team's model (training.model.type: custom): examples/ is not in the wheel, nor on the venv's path
    "custom_deepfm": (
        ModelSpec(
            type="custom", factory=EXAMPLE_MODELS["deepfm"][0], params=EXAMPLE_MODELS["deepfm"][1], hash_buckets=512
        ),
        CustomModel,
    ),
    "custom_torchrec_ebc": (  # where torchrec is installed (.[bench]); skipped otherwise
        ModelSpec(
            type="custom",
            factory=EXAMPLE_MODELS["torchrec_ebc"][0],
            params=EXAMPLE_MODELS["torchrec_ebc"][1],
            hash_buckets=512,
        ),
        CustomModel,
    ),
}


@pytest.mark.integration
@pytest.mark.parametrize("kind", list(LOADED_MODELS))
def test_a_champion_loads_from_its_registry_uri_in_a_fresh_venv_with_the_package_installed(
    tmp_path: Path, kind: str
) -> None:
    """``models:/<name>@champion`` loads, and scores as it did when logged, in a fresh virtualenv whose
    ``primus_dagster`` comes from a wheel built from this checkout, with the working directory in tmp --
    the built-in MTRM, and a team's own models (the example DeepFM through ``type: custom``, and the TorchRec
    example where torchrec is installed), whose code travels inside the logged model: the venv cannot
    import ``examples``.

    What the venv borrows, to need no network install: it is made with ``python -m venv --without-pip``
    and its site-packages gets a ``.pth`` naming this venv's site-packages, for the third-party packages
    only (torch, mlflow and the rest). A path in a ``.pth`` is put on ``sys.path`` without processing the
    ``.pth`` files inside it, so the editable install's finder (``__editable__*.pth``) stays off, and that
    folder holds no ``primus_dagster`` package. The package itself is the wheel of ``pip wheel --no-deps``,
    unpacked into the venv's site-packages (package and dist-info, as pip would put them). The interpreter
    runs isolated (``-I``: no ``PYTHONPATH``, no working directory on ``sys.path``), and it must import
    ``primus_dagster`` from that site-packages. ``primus-dagster-dev check-model-load`` does the same with
    a real ``pip install`` from the index instead."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(uri, "load-test")
    tracker.start("load-test/run", {"job": "load-test"})
    skip_without_torchrec(kind.removeprefix("custom_"))
    spec, cls = LOADED_MODELS[kind]
    model_class = f"{cls.__module__}.{cls.__qualname__}"  # the path the pickle names
    model = build_model(spec, n_dense=3, n_sparse=2, seed=7)
    version = tracker.register_model(tracker.log_model(model), "load-test")
    tracker.set_alias("load-test", CHAMPION_ALIAS, version)
    tracker.finish()

    # The stored environment names this package at its version, beside torch.
    installed = importlib.metadata.version("primus_dagster")
    stored = model_requirements_of(uri, f"models:/load-test@{CHAMPION_ALIAS}", tmp_path / "model-env")
    assert f"primus_dagster=={installed}" in stored["requirements.txt"].split()
    assert "torch" in stored["requirements.txt"].split()
    assert f"primus_dagster=={installed}" in stored["conda.yaml"]

    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)]
    subprocess.run([*build, str(copy_package_source(repo_root(), tmp_path / "src"))], check=True, timeout=120)
    (wheel,) = wheels.glob("primus_dagster-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    (site,) = venv.glob("lib/python*/site-packages")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    borrowed = Path(mlflow.__file__).resolve().parents[1]
    assert (borrowed / "torch").is_dir() and not (borrowed / "primus_dagster").exists()
    (site / "borrowed-third-party.pth").write_text(f"{borrowed}\n")

    work = tmp_path / "elsewhere"
    work.mkdir()
    answer = load_and_score(venv_python(venv), uri, f"models:/load-test@{CHAMPION_ALIAS}", cwd=work, rows=64, seed=3)
    assert Path(answer["primus_dagster_file"]).resolve().is_relative_to(site.resolve())
    assert answer["primus_dagster_version"] == installed
    assert answer["model_class"] == model_class and answer["finite"]

    generator = torch.Generator().manual_seed(3)  # the batch SCORE_SCRIPT scores
    dense = torch.randn(64, 3, generator=generator)
    sparse = torch.randint(0, 2**40, (64, 2), generator=generator)
    with torch.no_grad():
        expected = model.eval().predict(dense, sparse)[:8].tolist()
    assert answer["logits"] == pytest.approx(expected, abs=1e-5)

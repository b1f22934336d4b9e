"""``PrimusJobComponent`` through dg's own CLI (real processes) and in-process, in a minimal dg project.

The project is what ``create-dagster project`` would write, cut to what dg reads (a ``pyproject.toml`` with
``[tool.dg]``, the root module, its ``definitions.py`` and ``defs/``; no network, no venv of its own: dg runs
it with this interpreter). ``dg list components`` lists the type (the entry point of pyproject.toml);
``dg scaffold defs`` writes a ``defs.yaml`` and a starter spec that ``primus-dagster validate`` accepts;
``dg check defs`` loads them; the Definitions loaded in-process hold the source asset and the training
asset, and one source partition written by ``synth`` materialises with every check passed; a spec error
comes out of ``dg check defs`` as the spec's own located line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey, DefaultScheduleStatus, DefaultSensorStatus, Definitions, materialize
from dagster.components import build_defs_for_component, load_from_defs_folder
from locationkit import PRIMUS, REPO

from primus_dagster import PrimusJobComponent
from primus_dagster.dagster_defs.component import STARTER_SPEC_FILE, JobSpecError

pytestmark = [
    pytest.mark.integration,
    # Dagster 1.13 resolving a repository passes its own beta `execution_type` to the checks' AssetsDefinition
    pytest.mark.filterwarnings("ignore:Parameter `execution_type` of function `AssetsDefinition.__init__`"),
]

DG = str(Path(sys.executable).with_name("dg"))
TYPE = "primus_dagster.PrimusJobComponent"
INSTANCE = "ctr_job"  # the scaffolded folder: job name ctr-job, training asset ctr_job_model
HOUR_0 = "2026-11-01-00:00"
TIMEOUT = 120


@dataclass(frozen=True)
class Project:
    root: Path
    module: str  # a name of its own per project: the in-process loads import it

    @property
    def instance(self) -> Path:
        return self.root / self.module / "defs" / INSTANCE


def write_project(root: Path) -> Project:
    """A dg project under ``root`` (telemetry off, a Dagster home of its own)."""
    module = f"primus_component_{uuid.uuid4().hex[:8]}"
    (root / module / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "{module.replace("_", "-")}"\nversion = "0.1.0"\n\n'
        '[tool.dg]\ndirectory_type = "project"\n\n'
        f'[tool.dg.project]\nroot_module = "{module}"\n\n'
        "[tool.dg.cli.telemetry]\nenabled = false\n"
    )
    (root / module / "__init__.py").touch()
    (root / module / "defs" / "__init__.py").touch()
    (root / module / "definitions.py").write_text(
        "from pathlib import Path\n\nimport dagster as dg\n\n\n@dg.definitions\n"
        "def defs() -> dg.Definitions:\n"
        "    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)\n"
    )
    (root / "dagster_home").mkdir()
    (root / "dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    (root / "tmp").mkdir()
    return Project(root, module)


def dg(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    """``dg ARGS`` in the project; its exit code and output."""
    env = {**os.environ, "DAGSTER_HOME": str(project.root / "dagster_home"), "TMPDIR": str(project.root / "tmp")}
    return subprocess.run(
        [DG, *args], cwd=project.root, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


def output(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """The project with ``defs/ctr_job`` scaffolded by ``dg scaffold defs``."""
    project = write_project(tmp_path_factory.mktemp("dg_project"))
    proc = dg(project, "scaffold", "defs", TYPE, INSTANCE)
    assert proc.returncode == 0, output(proc)
    return project


def load_in_process(project: Project, monkeypatch: pytest.MonkeyPatch, data_root: Path) -> Definitions:
    """The project's Definitions through Dagster's public loader, resources on ``data_root``."""
    monkeypatch.syspath_prepend(str(project.root))
    monkeypatch.setenv("PRIMUS_HOME", str(data_root.parent))
    monkeypatch.setenv("PRIMUS_DATA_ROOT", str(data_root))
    return load_from_defs_folder(path_within_project=project.root)


def test_importing_the_package_imports_no_dagster() -> None:
    """The lazy export: ``import primus_dagster`` stays Dagster-free (the engine runs without it)."""
    code = (
        "import sys, primus_dagster\n"
        "assert 'dagster' not in sys.modules, 'dagster imported'\n"
        "assert 'PrimusJobComponent' in dir(primus_dagster)\n"
        "from primus_dagster.dagster_defs import PrimusJobComponent\n"
        "assert primus_dagster.PrimusJobComponent is PrimusJobComponent\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr


def test_dg_lists_the_component(project: Project) -> None:
    proc = dg(project, "list", "components", "--json")
    assert proc.returncode == 0, output(proc)
    listed = {item["key"]: item["summary"] for item in json.loads(proc.stdout)["items"]}
    # not listed: the installed metadata predates pyproject.toml's entry point (`pip install --no-deps -e .`)
    assert TYPE in listed, sorted(listed)
    assert listed[TYPE].startswith("A Primus training job from its job spec")


def test_scaffold_writes_defs_yaml_and_a_valid_starter_spec(project: Project) -> None:
    defs_yaml = yaml.safe_load((project.instance / "defs.yaml").read_text())
    assert defs_yaml == {
        "type": TYPE,
        "attributes": {
            "job_spec": STARTER_SPEC_FILE,
            "sensors": True,
            "sensor_status": "running",
            "schedules": True,
            "schedule_status": "stopped",
        },
    }
    spec = project.instance / STARTER_SPEC_FILE
    proc = subprocess.run([PRIMUS, "validate", str(spec)], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, output(proc)
    assert "job 'ctr-job' is valid" in proc.stdout  # the name from the folder's
    # the starter's source is the reference job's Parquet source, key for key
    starter = yaml.safe_load(spec.read_text())["dataset"]["streams"][0]["sources"]
    reference = yaml.safe_load((REPO / "examples" / "job.yaml").read_text())["dataset"]["streams"][0]["sources"][0]
    assert starter == [reference]


def test_scaffold_in_python_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--format python``: a ``component.py`` beside the spec (``job_spec`` relative to the file's folder), the
    job named by ``--job-name``."""
    project = write_project(tmp_path / "python_format")
    proc = dg(project, "scaffold", "defs", TYPE, INSTANCE, "--format", "python", "--job-name", "py-demo")
    assert proc.returncode == 0, output(proc)
    assert (project.instance / "component.py").is_file() and not (project.instance / "defs.yaml").exists()
    defs = load_in_process(project, monkeypatch, tmp_path / "data")
    assert AssetKey("py_demo_model") in {spec.key for spec in defs.resolve_all_asset_specs()}


def test_dg_check_defs_and_the_loaded_definitions(
    project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    proc = dg(project, "check", "defs")
    assert proc.returncode == 0, output(proc)
    assert "All definitions loaded successfully" in proc.stdout
    defs = load_in_process(project, monkeypatch, tmp_path / "data")
    keys = {spec.key for spec in defs.resolve_all_asset_specs()}
    assert {AssetKey("impressions_parquet"), AssetKey("ctr_job_model")} <= keys
    sensors = {sensor.name: sensor.default_status for sensor in defs.sensors or ()}
    assert sensors == {"ctr_job_batch_sensor": DefaultSensorStatus.RUNNING}
    schedules = {schedule.name: schedule.default_status for schedule in defs.schedules or ()}
    assert schedules == dict.fromkeys(
        ["ctr_job_training_schedule", "ctr_job_auc_final_schedule"], DefaultScheduleStatus.STOPPED
    )


def test_attributes_choose_the_sensors_and_schedules(project: Project) -> None:
    spec = str(project.instance / STARTER_SPEC_FILE)  # absolute: taken as it is
    quiet = build_defs_for_component(PrimusJobComponent(job_spec=spec, sensors=False, schedule_status="running"))
    assert not quiet.sensors
    assert {schedule.default_status for schedule in quiet.schedules or ()} == {DefaultScheduleStatus.RUNNING}
    stopped = build_defs_for_component(PrimusJobComponent(job_spec=spec, sensor_status="stopped", schedules=False))
    assert {sensor.default_status for sensor in stopped.sensors or ()} == {DefaultSensorStatus.STOPPED}
    assert not stopped.schedules
    # steps as the reference location runs them: in the run worker, or each a Kubernetes Job
    assert quiet.executor is not None and quiet.executor.name == "multi_or_in_process_executor"
    k8s = build_defs_for_component(PrimusJobComponent(job_spec=spec, deployment="kubernetes"))
    assert k8s.executor is not None and k8s.executor.name == "k8s"
    with pytest.raises(ValueError, match="deployment: 'cloud': choose one of local, kubernetes"):
        PrimusJobComponent(job_spec=spec, deployment="cloud")
    with pytest.raises(ValueError, match="sensor_status: 'paused': choose running or stopped"):
        PrimusJobComponent(job_spec=spec, sensor_status="paused")
    with pytest.raises(JobSpecError, match=r"missing\.yaml: <file>: cannot read"):
        build_defs_for_component(PrimusJobComponent(job_spec=str(project.root / "missing.yaml")))


def test_a_source_partition_materialises_from_the_component(
    project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data_root = tmp_path / "data"
    spec = project.instance / STARTER_SPEC_FILE
    command = [PRIMUS, "synth", "--spec", str(spec), "--data-root", str(data_root), "--hours", "1"]
    subprocess.run(
        [*command, "--rows-per-hour", "300", "--no-progress"], check=True, capture_output=True, timeout=TIMEOUT
    )
    defs = load_in_process(project, monkeypatch, data_root)
    source = defs.resolve_assets_def("impressions_parquet")  # with the component's resources bound
    result = materialize([source], partition_key=HOUR_0)
    assert result.success
    (event,) = result.get_asset_materialization_events()
    assert event.materialization.metadata["rows"].value > 0
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks and all(checks.values()), checks


def test_a_spec_error_is_its_located_line_in_dg_check_defs(project: Project, tmp_path: Path) -> None:
    broken = write_project(tmp_path / "broken")
    shutil.copytree(project.instance, broken.instance)
    spec = broken.instance / STARTER_SPEC_FILE
    spec.write_text(spec.read_text().replace("granularity: hour", "granularity: fortnight", 1))
    proc = dg(broken, "check", "defs")
    text = output(proc)
    assert proc.returncode != 0, text
    key = re.escape("dataset.streams[0].sources[0].granularity")
    line = rf"^  {re.escape(str(spec))}:\d+: {key}: Input should be 'hour' or 'day' \(got 'fortnight'\)$"
    assert re.search(line, text, re.MULTILINE), text
    # the spec's message, not its validation's: no Python traceback, nothing of pydantic
    assert "Traceback (most recent call last)" not in text and "pydantic" not in text.lower(), text

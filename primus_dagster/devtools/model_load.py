"""Does a registered model load outside this checkout? ``primus-dagster-dev check-model-load``.

A model logged by :class:`~primus_dagster.training.tracking.MlflowTracker` is a pickled
:class:`~primus_dagster.training.models.RecModel`: loading it needs ``torch``, MLflow and this
package at the version its ``requirements.txt`` names. This check does what a user of the registry
does on another machine: a fresh virtualenv (``python -m venv``), ``pip install -c constraints.txt
<the package>``, then, in that venv's interpreter (``-I``: no ``PYTHONPATH``, no user site, no
working directory on ``sys.path``) with its working directory outside the checkout, ``mlflow.pytorch
.load_model("models:/<name>@<alias>")`` against the tracking URI and a scored batch. It prints one
JSON object: the timings, where ``primus_dagster`` was imported from (never the checkout), the model's
requirements and the scores' summary.

The package is installed from a copy of the checkout's ``pyproject.toml``, ``README.md`` and
``primus_dagster/`` in a temp folder, so the build leaves no ``build/`` in the checkout.

Example::

    primus-dagster-dev check-model-load --tracking-uri sqlite:////data/mlflow.db --model ctr --alias champion
    primus-dagster-dev check-model-load --tracking-uri http://mlflow:5000 --model ctr --venv /tmp/ctr-venv
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["ModelLoadError", "check_model_load", "copy_package_source", "load_and_score", "repo_root"]

# Run by the venv's interpreter: load the model by its registry URI and score a seeded random batch.
SCORE_SCRIPT = r"""
import json, sys, time
t0 = time.perf_counter()
import mlflow, mlflow.pytorch, torch
import primus_dagster
tracking_uri, model_uri, rows, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
mlflow.set_tracking_uri(tracking_uri)
t1 = time.perf_counter()
model = mlflow.pytorch.load_model(model_uri)
t2 = time.perf_counter()
model.eval()
g = torch.Generator().manual_seed(seed)
dense = torch.randn(rows, model.n_dense, generator=g)
sparse = torch.randint(0, 2**40, (rows, model.n_sparse), generator=g)
lists = {}
if getattr(model, "list_names", None):  # jagged list features: 0..3 ids per row
    from primus_dagster.data import Jagged
    for name in model.list_names:
        lengths = torch.randint(0, 4, (rows,), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
        lists[name] = Jagged(torch.randint(0, 2**40, (int(offsets[-1]),), generator=g), offsets)
with torch.no_grad():
    logits = model.predict(dense, sparse, lists) if lists else model.predict(dense, sparse)
scores = torch.sigmoid(logits)
from importlib.metadata import version
print(json.dumps({
    "python": sys.executable,
    "primus_dagster_file": primus_dagster.__file__,
    "primus_dagster_version": version("primus_dagster"),
    "torch_version": torch.__version__,
    "mlflow_version": mlflow.__version__,
    "model_class": f"{type(model).__module__}.{type(model).__name__}",
    "rows": rows,
    "logits": [round(float(v), 6) for v in logits[:8]],
    "score_mean": round(float(scores.mean()), 6),
    "finite": bool(torch.isfinite(logits).all()),
    "import_s": round(t1 - t0, 3),
    "load_s": round(t2 - t1, 3),
    "score_s": round(time.perf_counter() - t2, 3),
}))
"""


class ModelLoadError(RuntimeError):
    """The model could not be loaded or scored in the venv (the message has the venv's stderr)."""


def repo_root() -> Path:
    """The checkout this module runs from (the folder holding ``pyproject.toml``)."""
    return Path(__file__).resolve().parents[2]


def copy_package_source(repo: Path, dest: Path) -> Path:
    """Copy what building the package needs (``pyproject.toml``, ``README.md``, ``primus_dagster/``
    without caches) from ``repo`` into ``dest``; ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(repo / name, dest / name)
    shutil.copytree(repo / "primus_dagster", dest / "primus_dagster", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def venv_python(venv: Path) -> Path:
    """The interpreter of the virtualenv ``venv``."""
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def load_and_score(
    python: str | Path, tracking_uri: str, model_uri: str, *, cwd: str | Path, rows: int = 256, seed: int = 0
) -> dict[str, Any]:
    """Load ``model_uri`` (``models:/<name>@<alias>``) from ``tracking_uri`` with ``mlflow.pytorch`` in
    the interpreter ``python`` (isolated mode, working directory ``cwd``) and score a seeded random batch
    of ``rows`` with ``model.predict``; what :data:`SCORE_SCRIPT` prints. :class:`ModelLoadError` with the
    interpreter's stderr when it fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    command = [str(python), "-I", "-c", SCORE_SCRIPT, tracking_uri, model_uri, str(rows), str(seed)]
    done = subprocess.run(command, cwd=str(cwd), env=env, capture_output=True, text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise ModelLoadError(
            f"{python}: loading {model_uri} from {tracking_uri} failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
        )
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def model_requirements_of(tracking_uri: str, model_uri: str, dest: str | Path) -> dict[str, str]:
    """The environment files stored with the registered model ``model_uri`` (``models:/<name>@<alias>``
    or ``models:/<name>/<version>``), downloaded into ``dest``: ``{"requirements.txt": text, "conda.yaml":
    text}``."""
    import mlflow

    name, _, rest = model_uri.removeprefix("models:/").partition("/")
    client = mlflow.MlflowClient(tracking_uri)
    if "@" in name:
        name, alias = name.split("@", 1)
        version = client.get_model_version_by_alias(name, alias)
    else:
        version = client.get_model_version(name, rest)
    model_id = version.model_id or version.source.removeprefix("models:/")  # a logged model's models:/<id>
    location = client.get_logged_model(model_id).artifact_location
    out = {}
    for file in ("requirements.txt", "conda.yaml"):
        path = mlflow.artifacts.download_artifacts(
            artifact_uri=f"{location}/{file}", dst_path=str(dest), tracking_uri=tracking_uri
        )
        out[file] = Path(path).read_text()
    return out


def _run(command: list[str], what: str, cwd: Path) -> None:
    done = subprocess.run(command, cwd=str(cwd), capture_output=True, text=True)
    if done.returncode != 0:
        raise ModelLoadError(f"{what} failed (exit {done.returncode}): {' '.join(command)}\n{done.stderr[-4000:]}")


def check_model_load(
    tracking_uri: str,
    model: str,
    alias: str = "champion",
    venv: str | Path | None = None,
    repo: str | Path | None = None,
) -> dict[str, Any]:
    """Create a fresh virtualenv (``venv``, kept; default a temp folder, removed), ``pip install -c
    constraints.txt`` the package of ``repo`` (default: this checkout) into it, then load
    ``models:/<model>@<alias>`` there and score a batch (module docstring). An existing venv at
    ``venv`` is reused (the package is installed again). The report: timings, the venv's answer
    (:func:`load_and_score`) and the model's stored requirements."""
    repo = Path(repo) if repo is not None else repo_root()
    model_uri = f"models:/{model}@{alias}"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="primus-model-load-") as scratch_name:
        scratch = Path(scratch_name)
        target = Path(venv).absolute() if venv is not None else scratch / "venv"
        python = venv_python(target)
        t0 = time.perf_counter()
        if not python.exists():
            _run([sys.executable, "-m", "venv", str(target)], "creating the venv", scratch)
        venv_s = time.perf_counter() - t0
        source = copy_package_source(repo, scratch / "src")
        t0 = time.perf_counter()
        install = [str(python), "-m", "pip", "install", "-q", "-c", str(repo / "constraints.txt"), str(source)]
        _run(install, f"installing {repo.name} into {target}", scratch)
        install_s = time.perf_counter() - t0
        work = scratch / "cwd"  # outside the checkout
        work.mkdir()
        t0 = time.perf_counter()
        answer = load_and_score(python, tracking_uri, model_uri, cwd=work)
        load_total_s = time.perf_counter() - t0
        if Path(answer["primus_dagster_file"]).resolve().is_relative_to((repo / "primus_dagster").resolve()):
            raise ModelLoadError(f"the venv imported primus_dagster from the checkout: {answer['primus_dagster_file']}")
        stored = model_requirements_of(tracking_uri, model_uri, scratch / "model-env")
    return {
        "check": "model_load",
        "model_uri": model_uri,
        "tracking_uri": tracking_uri,
        "venv": str(target),
        "venv_kept": venv is not None,
        "venv_s": round(venv_s, 1),
        "install_s": round(install_s, 1),
        "load_and_score_s": round(load_total_s, 1),
        "total_s": round(time.perf_counter() - started, 1),
        "requirements": stored["requirements.txt"].split(),
        **answer,
    }


def command(args: argparse.Namespace) -> int:
    """``primus-dagster-dev check-model-load``: print the report as one JSON line; 1 when it fails."""
    try:
        report = check_model_load(args.tracking_uri, args.model, args.alias, args.venv)
    except ModelLoadError as error:
        print(f"check-model-load: {error}", file=sys.stderr)
        return 1
    print(json.dumps(report))
    return 0


def add_parser(sub: Any) -> None:
    """The ``check-model-load`` subcommand."""
    p = sub.add_parser(
        "check-model-load", help="load a registered model in a fresh virtualenv with the package installed"
    )
    p.add_argument("--tracking-uri", required=True, help="the MLflow tracking URI holding the registry")
    p.add_argument("--model", required=True, help="registered model name (the job's name)")
    p.add_argument("--alias", default="champion")
    p.add_argument("--venv", default=None, help="create (or reuse) the venv here and keep it; default: a temp one")
    p.set_defaults(func=command)

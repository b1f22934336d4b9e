"""MTRM over a team's towers (``training.model.memory`` / ``adapt``): the paper's structure -- the memory
tower learns the batch kind, the adapt tower the stream on the detached ``h_aux`` -- with either tower
built by a factory; the spec's rules, the checks naming the tower, the registry carrying its code."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import ValidationError

from primus_dagster.data import Jagged
from primus_dagster.spec import load_job_spec
from primus_dagster.spec.job import ModelSpec, TowerSpec, TrainingSpec
from primus_dagster.training.features import FeatureLayout
from primus_dagster.training.model_api import ModelFactoryError
from primus_dagster.training.models import MTRM, build_model, check_model, custom_model_line
from primus_dagster.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
DEEPFM = f"{REPO / 'examples' / 'models' / 'deepfm.py'}:build"
SMALL = {"embedding_dim": 4, "hash_buckets": 256}

# An adapt tower that reads only the dense columns and h_aux: it records what it was given.
ADAPT_ON_AUX = """
import torch
from torch import nn

class OnAux(nn.Module):
    def __init__(self, context):
        super().__init__()
        assert context.role == "adapt", context.role
        self.seen = {"aux_dim": context.aux_dim}
        self.linear = nn.Linear(context.n_dense + context.aux_dim, 1)

    def forward(self, inputs):
        self.seen.update(kind=inputs.kind, aux_grad=inputs.aux.requires_grad, aux_shape=list(inputs.aux.shape))
        return self.linear(torch.cat([inputs.dense, inputs.aux], dim=1))

def build(context):
    return OnAux(context)
"""


def layout(spec: ModelSpec) -> FeatureLayout:
    training = TrainingSpec(mode="mixed", model=spec)
    return FeatureLayout.resolve(training, ["price", "age"], ["user", "item"], ["genres"], weighted=["genres"])


def rows(n: int = 8) -> tuple[torch.Tensor, torch.Tensor, dict[str, Jagged]]:
    g = torch.Generator().manual_seed(0)
    offsets = torch.arange(0, 2 * n + 1, 2)
    values = torch.randint(0, 2**40, (2 * n,), generator=g)
    lists = {"genres": Jagged(values, offsets, torch.rand(2 * n, generator=g))}
    return torch.randn(n, 2, generator=g), torch.randint(0, 99, (n, 2), generator=g), lists


def tower_file(tmp_path: Path, body: str, name: str = "tower.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return f"{path}:build"


def test_a_team_memory_tower_feeds_the_built_in_adapt_tower_its_state() -> None:
    spec = ModelSpec(type="mtrm", memory=TowerSpec(factory=DEEPFM, params={"fm_dim": 4, "hidden": [8]}), **SMALL)
    model = build_model(spec, layout=layout(spec))
    assert isinstance(model, MTRM) and type(model.memory.net).__name__ == "DeepFM"
    # DeepFM.state: its last hidden layer (8) and 3 feature vectors of fm_dim 4
    assert model.memory.state_dim == 8 + 3 * 4
    dense, sparse, lists = rows()
    trainer = Trainer(model, TrainingSpec(mode="mixed", batch_size=8, model=spec))
    trainer.optimizer.zero_grad()
    model(dense, sparse, "stream", lists).sum().backward()  # the adapt tower learns; h_aux carries no gradient
    assert all(p.grad is None for p in model.memory.parameters())
    assert any(p.grad is not None for p in model.adapt.parameters())
    assert custom_model_line(model).startswith(f"mtrm, memory {DEEPFM}: DeepFM, adapt built in; ")


def test_a_team_adapt_tower_gets_the_detached_memory_state_as_inputs_aux(tmp_path: Path) -> None:
    spec = ModelSpec(type="mtrm", adapt=TowerSpec(factory=tower_file(tmp_path, ADAPT_ON_AUX)), **SMALL)
    model = build_model(spec, layout=layout(spec))
    builtin_state = model.memory.state_dim
    net = model.adapt.net
    assert net.seen == {"aux_dim": builtin_state}
    dense, sparse, lists = rows()
    model(dense, sparse, "stream", lists).sum().backward()
    assert net.seen == {"aux_dim": builtin_state, "kind": "stream", "aux_grad": False, "aux_shape": [8, builtin_state]}
    assert all(p.grad is None for p in model.memory.parameters())
    check_model(spec, layout(spec))  # both kinds, both towers


def test_both_towers_the_teams_train_checkpoint_and_serve(tmp_path: Path) -> None:
    deepfm = TowerSpec(factory=DEEPFM, params={"fm_dim": 4, "hidden": [8]})
    spec = ModelSpec(type="mtrm", memory=deepfm, adapt=deepfm, adapt_batch_weight=0.25, **SMALL)
    model = check_model(spec, layout(spec))
    trainer = Trainer(model, TrainingSpec(mode="mixed", batch_size=8, model=spec))
    from primus_dagster.data import Batch

    dense, sparse, lists = rows()
    for kind in ("batch", "stream"):
        label = (torch.arange(8) % 2).float()
        trainer.train_step(
            Batch.from_tensors(dense, sparse, label, kind=kind, sparse_names=["user", "item"], lists=lists)
        )
    again = build_model(spec, layout=layout(spec), seed=3)
    again.load_state_dict(model.state_dict())
    assert torch.equal(again.predict(dense, sparse, lists), model.predict(dense, sparse, lists))


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"type": "single", "memory": {"factory": "a.b:c"}}, "memory is a tower of type 'mtrm'"),
        ({"type": "custom", "factory": "a.b:c", "adapt": {"factory": "a.b:c"}}, "adapt is a tower of type 'mtrm'"),
        ({"type": "mtrm", "memory": {"factory": "a.b:c"}, "memory_hidden": [8]}, "memory_hidden shapes the built-in"),
        ({"type": "mtrm", "adapt": {"factory": "no colon"}}, "pattern"),
    ],
)
def test_the_spec_keeps_towers_to_mtrm_and_widths_to_built_in_towers(model: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ModelSpec(**model)


def test_a_broken_tower_is_named_with_its_key(tmp_path: Path) -> None:
    broken = tower_file(tmp_path, "from torch import nn\ndef build(context):\n    return nn.Linear(3, 1)\n")
    spec = ModelSpec(type="mtrm", adapt=TowerSpec(factory=broken), **SMALL)
    with pytest.raises(ModelFactoryError, match=r"training\.model\.adapt\.factory .*failed on a batch of 2 rows"):
        check_model(spec, layout(spec))
    raising = tower_file(tmp_path, "def build(context):\n    raise RuntimeError('no GPU budget')\n", "raising.py")
    spec = ModelSpec(type="mtrm", memory=TowerSpec(factory=raising), **SMALL)
    with pytest.raises(ModelFactoryError, match=r"training\.model\.memory\.factory .* raised RuntimeError: no GPU"):
        build_model(spec, layout=layout(spec))


def test_relative_tower_files_are_read_beside_the_spec(tmp_path: Path) -> None:
    (tmp_path / "towers").mkdir()
    (tmp_path / "towers" / "adapt.py").write_text(textwrap.dedent(ADAPT_ON_AUX))
    spec = yaml.safe_load((REPO / "examples" / "job.yaml").read_text())
    spec["training"]["model"] = {"type": "mtrm", "adapt": {"factory": "towers/adapt.py:build"}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    job = load_job_spec(path)
    assert job.training.model.adapt.factory == f"{tmp_path / 'towers' / 'adapt.py'}:build"
    assert job.training.model.factories() == {"adapt": f"{tmp_path / 'towers' / 'adapt.py'}:build"}


LOAD = r"""
import json, sys, mlflow, mlflow.pytorch, torch
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pytorch.load_model(sys.argv[2]).eval()
from primus_dagster.data import Jagged
g = torch.Generator().manual_seed(0)
lists = {"genres": Jagged(torch.randint(0, 9, (4,), generator=g), torch.tensor([0, 1, 2, 3, 4]), torch.ones(4))}
with torch.no_grad():
    scores = torch.sigmoid(model.predict(torch.randn(4, 2, generator=g), torch.randint(0, 9, (4, 2), generator=g), lists))
print(json.dumps({"adapt": type(model.adapt.net).__name__, "scores": scores.tolist()}))
"""


@pytest.mark.integration
def test_the_registered_mtrm_carries_its_tower_code(tmp_path: Path) -> None:
    from primus_dagster.training.tracking import MlflowTracker

    spec = ModelSpec(type="mtrm", adapt=TowerSpec(factory=tower_file(tmp_path, ADAPT_ON_AUX)), **SMALL)
    model = check_model(spec, layout(spec))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(uri, "towers", artifact_location=str(tmp_path / "artifacts"))
    tracker.start("towers-run", params={})
    model_uri = tracker.log_model(model)
    tracker.finish("FINISHED")
    (tmp_path / "tower.py").unlink()  # the team's file is gone: the model carries its code
    done = subprocess.run(
        [sys.executable, "-I", "-c", LOAD, uri, model_uri], capture_output=True, text=True, timeout=300, cwd="/"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["adapt"] == "OnAux" and len(out["scores"]) == 4

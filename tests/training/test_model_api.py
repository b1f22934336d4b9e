"""Bring your own model: the factory reference, the inputs a custom module gets (TorchRec's jagged
layout, ids hashed as the built-ins hash them), the protocol checks and their errors, the loss."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import ValidationError
from torch import nn

from primus_dagster.data import Jagged
from primus_dagster.spec import load_job_spec
from primus_dagster.spec.job import ModelSpec, TrainingSpec
from primus_dagster.training.features import FeatureLayout
from primus_dagster.training.model_api import ModelContext, ModelFactoryError, SparseFeatures, load_factory
from primus_dagster.training.models import (
    CustomModel,
    FeatureEmbeddings,
    FeatureHasher,
    build_model,
    check_model,
    loss_function,
    sparse_tables,
)
from primus_dagster.training.trainer import RecOptimizer

REPO = Path(__file__).resolve().parents[2]
DEEPFM = f"{REPO / 'examples' / 'models' / 'deepfm.py'}:build"


def layout(training: TrainingSpec | None = None) -> FeatureLayout:
    training = training or TrainingSpec(model=ModelSpec(type="single"))
    return FeatureLayout.resolve(training, ["price", "age"], ["user", "item"], ["genres"], weighted=["genres"])


def inputs(rows: int = 4) -> tuple[torch.Tensor, torch.Tensor, dict[str, Jagged]]:
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(rows, 2, generator=g)
    dense[0, 1] = float("nan")  # missing: the model's transform fills it
    sparse = torch.randint(-(2**40), 2**40, (rows, 2), generator=g)
    lengths = torch.tensor([2, 0, 3, 1][:rows])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    values = torch.randint(0, 2**40, (int(offsets[-1]),), generator=g)
    return dense, sparse, {"genres": Jagged(values, offsets, torch.rand(len(values), generator=g))}


def factory_file(tmp_path: Path, body: str, name: str = "team_model.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return f"{path}:build"


def test_the_features_arrive_as_a_keyed_jagged_layout_hashed_like_the_built_in_tables() -> None:
    lay = layout()
    _, sparse, lists = inputs()
    features = FeatureHasher(lay)(sparse, lists)
    assert features.keys() == ["user", "item", "genres"] and features.stride() == 4
    assert features.lengths().tolist() == [1, 1, 1, 1, 1, 1, 1, 1, 2, 0, 3, 1]
    assert features.offsets().tolist()[-1] == len(features.values()) == 8 + 6
    assert features.weights_or_none() is not None and features.weights_or_none()[:8].tolist() == [1.0] * 8
    # the same buckets as the built-in tables' (HashedEmbedding), in [0, buckets)
    table = FeatureEmbeddings(lay, sparse=True).tables["shared"]
    assert torch.equal(torch.stack([features["user"].values, features["item"].values], 1), table.bucket_ids(sparse))
    assert bool((features.values() >= 0).all()) and bool((features.values() < lay.tables["shared"][0]).all())
    with pytest.raises(KeyError, match="no id feature 'nope'; the batch has"):
        features["nope"]


def test_a_custom_model_trains_its_sparse_tables_with_the_lazy_adam_and_reads_transformed_dense() -> None:
    spec = ModelSpec(type="custom", factory=DEEPFM, params={"fm_dim": 8, "hidden": [16]})
    model = check_model(spec, layout())
    assert isinstance(model, CustomModel) and type(model.net).__name__ == "DeepFM"
    assert len(sparse_tables(model)) == 2  # DeepFM's vector and weight EmbeddingBags of the one table
    optimizer = RecOptimizer(model, lr=1e-2)
    assert set(optimizer.parts) == {"dense", "sparse"}
    dense, sparse, lists = inputs()
    before = [p.detach().clone() for p in sparse_tables(model)]
    logits = model(dense, sparse, "batch", lists)
    assert logits.shape == (4,) and bool(torch.isfinite(logits).all())
    loss_function("bce", model)(logits, torch.ones(4)).backward()
    optimizer.step()
    changed = [int((b != p.detach()).any(1).sum()) for b, p in zip(before, sparse_tables(model), strict=True)]
    assert all(0 < rows <= 14 for rows in changed)  # only the rows the batch touched
    assert "net.vectors.shared.weight" in model.state_dict()


def test_the_factory_gets_the_declared_features_and_params(tmp_path: Path) -> None:
    seen: list[ModelContext] = []
    factory = factory_file(
        tmp_path,
        """
        import torch
        from torch import nn
        SEEN = []
        class Linear(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.layer = nn.Linear(n, 1)
            def forward(self, inputs):
                return self.layer(inputs.dense)          # [B, 1]: accepted
        def build(context):
            SEEN.append(context)
            return Linear(context.n_dense)
        """,
    )
    model = check_model(ModelSpec(type="custom", factory=factory, params={"width": 3}), layout())
    seen = sys.modules[type(model.net).__module__].SEEN
    context = seen[0]
    assert context.params == {"width": 3} and context.dense_names == ["price", "age"]
    assert [(f.name, f.kind, f.table, f.pooling, f.weighted) for f in context.id_features] == [
        ("user", "id", "shared", "sum", False),
        ("item", "id", "shared", "sum", False),
        ("genres", "list", "shared", "mean", True),  # the default pooling of a list
    ]
    assert context.tables == {"shared": (100_000, 16)}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("def build(context):\n    return 42\n", "returned int; expected a torch.nn.Module"),
        ("def build(context):\n    raise RuntimeError('no GPU here')\n", "raised RuntimeError: no GPU here"),
        (
            "import torch\nfrom torch import nn\nclass M(nn.Module):\n    def forward(self, inputs):\n"
            "        return torch.zeros(inputs.batch_size, 3)\ndef build(context):\n    return M()\n",
            r"returned \[2, 3\] for a batch of 2 rows; forward\(inputs\) must return float logits",
        ),
        (
            "from torch import nn\nclass M(nn.Module):\n    def forward(self, inputs):\n"
            "        return inputs.sparse['missing'].values\ndef build(context):\n    return M()\n",
            "failed on a batch of 2 rows .*KeyError",
        ),
        ("import no_such_dependency\ndef build(context):\n    pass\n", "importing .* failed: ModuleNotFoundError"),
    ],
)
def test_a_module_that_breaks_the_protocol_is_named_with_what_is_wrong(tmp_path: Path, body: str, message: str) -> None:
    factory = factory_file(tmp_path, body, name=f"m{abs(hash(body))}.py")
    with pytest.raises(ModelFactoryError, match=message) as caught:
        check_model(ModelSpec(type="custom", factory=factory), layout())
    assert factory in str(caught.value) or str(tmp_path) in str(caught.value)


def test_a_factory_that_cannot_be_found_says_where_it_looked() -> None:
    with pytest.raises(ModelFactoryError, match=r"cannot import module 'no_such_pkg\.models'.*PYTHONPATH"):
        load_factory("no_such_pkg.models:build")
    with pytest.raises(ModelFactoryError, match=r"has no 'nothing'.*'build'"):
        load_factory(DEEPFM.replace(":build", ":nothing"))
    with pytest.raises(ModelFactoryError, match=r"no file '/nonexistent/model\.py'"):
        load_factory("/nonexistent/model.py:build")


def test_the_spec_refuses_custom_keys_on_built_in_models_and_built_in_keys_on_custom() -> None:
    with pytest.raises(ValidationError, match="type 'custom' needs factory"):
        ModelSpec(type="custom")
    with pytest.raises(ValidationError, match="factory applies to type 'custom'"):
        ModelSpec(type="single", factory="a.b:c")
    with pytest.raises(ValidationError, match="params applies to type 'custom'"):
        ModelSpec(type="mtrm", params={"x": 1})
    with pytest.raises(ValidationError, match="memory_hidden shapes a built-in tower"):
        ModelSpec(type="custom", factory="a.b:c", memory_hidden=[8])
    with pytest.raises(ValidationError, match="String should match pattern"):
        ModelSpec(type="custom", factory="no_function_named")
    with pytest.raises(ValidationError, match="loss 'model' calls a custom module's own loss"):
        TrainingSpec(loss="model", model=ModelSpec(type="single"))


def test_the_losses(tmp_path: Path) -> None:
    single = build_model(ModelSpec(type="single"), n_dense=1, n_sparse=1)
    logits, labels = torch.tensor([0.0, 2.0]), torch.tensor([1.0, 0.0])
    assert float(loss_function("mse", single)(logits, labels)) == pytest.approx(
        ((0.5 - 1) ** 2 + (torch.sigmoid(torch.tensor(2.0)).item()) ** 2) / 2
    )
    factory = factory_file(
        tmp_path,
        """
        import torch
        from torch import nn
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.zeros(1))
            def forward(self, inputs):
                return inputs.dense.sum(1) * self.w
            def loss(self, logits, labels):
                return (logits - labels).abs().mean()
        def build(context):
            return M()
        """,
    )
    model = check_model(ModelSpec(type="custom", factory=factory), layout(), loss="model")
    assert float(loss_function("model", model)(logits, labels)) == pytest.approx(1.5)
    plain = factory_file(tmp_path, "import torch\nfrom torch import nn\ndef build(context):\n    return Plain()\n"
                         "class Plain(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                         "        self.l = nn.Linear(2, 1)\n    def forward(self, inputs):\n"
                         "        return self.l(inputs.dense)\n", name="plain.py")  # fmt: skip
    with pytest.raises(ModelFactoryError, match="has no loss\\(logits, labels\\) method"):
        check_model(ModelSpec(type="custom", factory=plain), layout(), loss="model")


def test_a_relative_factory_file_is_read_beside_the_spec_and_validate_builds_it(tmp_path: Path) -> None:
    spec = yaml.safe_load((REPO / "examples" / "realistic" / "job.yaml").read_text())
    spec["training"]["model"] = {"type": "custom", "factory": "models/deepfm.py:build", "params": {"fm_dim": 8}}
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "deepfm.py").write_text((REPO / "examples" / "models" / "deepfm.py").read_text())
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert load_job_spec(path).training.model.factory == f"{tmp_path / 'models' / 'deepfm.py'}:build"
    cli = [sys.executable, "-m", "primus_dagster.cli", "validate", str(path)]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
    assert (
        "model: custom, factory" in done.stdout and ": DeepFM," in done.stdout and "6 sparse table(s)" in done.stdout
    )  # 3 tables x (vectors, weights)

    spec["training"]["model"]["params"] = {"fm_dim": 8, "depth": 3}
    path.write_text(yaml.safe_dump(spec))
    done = subprocess.run(cli, capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "raised TypeError: DeepFM.__init__() got an unexpected keyword argument 'depth'" in done.stderr


def test_sparse_tables_are_the_sparse_embeddings_of_any_kind() -> None:
    module = nn.ModuleDict(
        {
            "bag": nn.EmbeddingBag(10, 4, sparse=True),
            "emb": nn.Embedding(10, 4, sparse=True),
            "dense_emb": nn.Embedding(10, 4),
            "linear": nn.Linear(4, 1),
        }
    )
    assert [p.shape for p in sparse_tables(module)] == [torch.Size([10, 4])] * 2
    assert {id(p) for p in sparse_tables(module)} == {id(module["bag"].weight), id(module["emb"].weight)}


def test_sparse_features_to_kjt_where_torchrec_is_installed() -> None:
    pytest.importorskip("torchrec", reason="torchrec is installed with .[bench] only")
    features = SparseFeatures({"a": Jagged(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 3]))}, 2)
    kjt = features.to_kjt()
    assert kjt.keys() == ["a"] and kjt.lengths().tolist() == [2, 1] and kjt.values().tolist() == [1, 2, 3]

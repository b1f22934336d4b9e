"""The compiled kernels (training/kernels.py): the same gradients and Adam updates as the eager path,
the switch a trainer makes after ``compile_after_steps``, the runs that stay eager, and a compile that
fails. The compile itself is real (torch.compile, inductor, the machine's C++ compiler): the first test
to need it builds the kernels once for this process (~20 s of CPU on a machine that never compiled
them, seconds after that)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from primus_dagster.data import Batch, Jagged
from primus_dagster.spec.job import JobSpec, TrainingSpec
from primus_dagster.training import kernels
from primus_dagster.training.features import FeatureLayout
from primus_dagster.training.models import build_model
from primus_dagster.training.row_sparse import row_sparse_bag
from primus_dagster.training.trainer import LazyAdam, Trainer
from tests.bounds import load_scaled

COMPILE_BOUND_S = 300.0  # a first compile on a loaded machine; it ends at the event, not at the bound


@pytest.fixture(scope="module")
def compiled() -> kernels.KernelSet:
    policy = kernels.KernelPolicy.for_trainer("on", 0, device=torch.device("cpu"))
    found = policy.current()
    assert found.name == "compiled", policy.describe()
    return found


def _jagged(n_rows: int, bags: int = 256, max_len: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n_rows)
    lengths = torch.randint(0, max_len + 1, (bags,), generator=g)
    ids = torch.randint(0, n_rows, (int(lengths.sum()),), generator=g)
    return ids, torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)[:-1]])


def _table_gradient(ks: kernels.KernelSet, mode: str, lookup: bool) -> torch.Tensor:
    n_rows = 300  # fewer rows than ids: the presence-mask path, the one the compiled kernel replaces
    ids, offsets = _jagged(n_rows)
    weights = torch.rand(len(ids), generator=torch.Generator().manual_seed(1)) if mode == "weighted" else None
    weight = torch.randn(n_rows, 8, generator=torch.Generator().manual_seed(2)).requires_grad_()
    with kernels.using(ks):
        if lookup:
            out = row_sparse_bag(weight, ids)
        else:
            out = row_sparse_bag(weight, ids, offsets, "sum" if mode == "weighted" else mode, weights)
        upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
        (out * upstream).sum().backward()
    assert weight.grad is not None
    return weight.grad


@pytest.mark.parametrize(("mode", "lookup"), [("sum", False), ("mean", False), ("weighted", False), ("sum", True)])
def test_compiled_row_gradients_are_the_eager_ones(compiled: kernels.KernelSet, mode: str, lookup: bool) -> None:
    eager, fused = _table_gradient(kernels.EAGER, mode, lookup), _table_gradient(compiled, mode, lookup)
    assert torch.equal(fused._indices(), eager._indices())  # the same touched rows, ascending
    torch.testing.assert_close(fused._values(), eager._values(), rtol=1e-5, atol=1e-6)


def test_compiled_adam_steps_are_lazy_adam_s(compiled: kernels.KernelSet) -> None:
    """Five steps of LazyAdam on the same row-sparse gradients: the compiled update stays within float
    rounding of the eager one (itself bit-exact with torch's SparseAdam: test_model_speed_equivalence)."""
    tables = [torch.nn.Parameter(torch.randn(500, 16, generator=torch.Generator().manual_seed(0))) for _ in range(2)]
    optimizers = [LazyAdam([t], lr=1e-2) for t in tables]
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        rows = torch.unique(torch.randint(0, 500, (300,), generator=g))
        values = torch.randn(len(rows), 16, generator=g)
        for table, optimizer, ks in zip(tables, optimizers, (kernels.EAGER, compiled), strict=True):
            table.grad = torch.sparse_coo_tensor(
                rows.unsqueeze(0), values, table.shape, is_coalesced=True, check_invariants=False
            )
            with kernels.using(ks):
                optimizer.step()
    torch.testing.assert_close(tables[1].detach(), tables[0].detach(), rtol=1e-5, atol=1e-6)
    for key in ("exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(optimizers[1].state[tables[1]][key], optimizers[0].state[tables[0]][key])


def _list_batches(n: int, rows: int = 64) -> list[Batch]:
    g = torch.Generator().manual_seed(5)
    out = []
    for _ in range(n):
        lengths = torch.randint(0, 6, (rows,), generator=g)
        values = torch.randint(0, 10**6, (int(lengths.sum()),), generator=g)
        jagged = Jagged(values, torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)]))
        label = (torch.rand(rows, generator=g) < 0.3).float()
        out.append(
            Batch.from_tensors(
                torch.randn(rows, 2, generator=g),
                torch.zeros(rows, 0, dtype=torch.int64),
                label,
                kind="batch",
                lists={"tags": jagged},
            )
        )
    return out


def _list_trainer(**training: object) -> Trainer:
    spec = TrainingSpec.model_validate(
        {
            "mode": "batch",
            "batch_size": 64,
            "model": {"type": "single"},
            **training,
            "features": {"categorical_list": [{"name": "tags", "buckets": 50, "dim": 4, "pooling": "sum"}]},
        }
    )
    layout = FeatureLayout.resolve(spec, ["d0", "d1"], [], ["tags"])
    return Trainer(build_model(spec.model, layout=layout, seed=0), spec)


def test_auto_trains_eagerly_then_switches_after_compile_after_steps(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=kernels.__name__)
    trainer = _list_trainer(compile="auto", compile_after_steps=3)
    batches = _list_batches(12)
    for batch in batches[:3]:
        assert trainer.kernels.current().name == "eager"
        trainer.train_step(batch)
    assert trainer.kernels.describe() in ("eager (compiling)", "compiled")  # started at step 3, in the background
    assert trainer.kernels.wait(load_scaled(COMPILE_BOUND_S)), trainer.kernels.describe()
    for batch in batches[3:]:
        trainer.train_step(batch)
    assert trainer.kernels.describe() == "compiled from step 4"
    assert trainer.stats()["kernels"] == "compiled from step 4"
    assert "kernels: compiled (" in caplog.text and "from step 4 on" in caplog.text
    assert all(p.isfinite().all() for p in trainer.model.parameters())


def test_runs_that_stay_eager_say_why() -> None:
    cpu = torch.device("cpu")
    cases = {
        "data.deterministic runs use the eager kernels": {"device": cpu, "deterministic": True},
        "compiles the CPU kernels only (device cuda)": {"device": torch.device("cuda")},
        "keeps the 2 ranks' replicas on the eager kernels": {"device": cpu, "replicas": 2},
    }
    for reason, where in cases.items():
        policy = kernels.KernelPolicy.for_trainer("auto", 0, **where)  # type: ignore[arg-type]
        policy.after_step(10)
        assert policy.current().name == "eager" and reason in policy.describe()
    off = kernels.KernelPolicy.for_trainer("off", 0, device=cpu)
    off.after_step(10**6)
    assert off.current().name == "eager" and off.describe() == "eager (training.compile off)"
    assert _list_trainer().kernels.describe() == "eager (compiled after 1000 steps)"  # the defaults


def test_compile_on_with_a_deterministic_run_is_a_spec_error() -> None:
    source = {
        "name": "p",
        "type": "parquet",
        "kind": "batch",
        "path": "x",
        "columns": {"ts": "t", "label": "y", "dense": ["a"]},
    }
    job = {
        "name": "j",
        "dataset": {"start": "2026-11-01", "streams": [{"name": "s", "sources": [source]}]},
        "data": {"deterministic": True},
        "training": {"mode": "batch", "model": {"type": "single"}, "compile": "on"},
    }
    with pytest.raises(ValueError, match=r"training\.compile is 'on' and data\.deterministic is true"):
        JobSpec.model_validate(job)
    JobSpec.model_validate({**job, "training": {**job["training"], "compile": "auto"}})  # auto: eager, no error


def test_a_failed_compile_is_said_once_and_training_goes_on_eagerly(tmp_path: Path) -> None:
    """The fault: no C++ compiler (``CXX`` names none, and an empty inductor cache, so nothing compiled
    before can stand in). A trainer with ``compile: on`` warns once and trains on the eager kernels."""
    script = textwrap.dedent(
        f"""
        import logging, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
        from tests.training.test_kernels import _list_batches, _list_trainer
        trainer = _list_trainer(compile="on")
        for batch in _list_batches(3):
            trainer.train_step(batch)
        print("KERNELS", trainer.kernels.describe(), trainer.step)
        """
    )
    env = {**os.environ, "CXX": str(tmp_path / "no-such-c++"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=load_scaled(300)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "KERNELS eager (torch.compile failed: " in proc.stdout and proc.stdout.strip().endswith(" 3")
    warnings = [line for line in proc.stderr.splitlines() if "kernels: torch.compile failed" in line]
    assert len(warnings) == 1 and "training goes on with the eager kernels" in warnings[0]


def test_the_eager_kernels_need_no_compiler() -> None:
    """Outside a trainer's step nothing is compiled: evaluation and serving run the eager path."""
    assert kernels.active() is kernels.EAGER
    weight = torch.randn(30, 4)
    ids, offsets = _jagged(30, bags=8)
    torch.testing.assert_close(row_sparse_bag(weight, ids, offsets), F.embedding_bag(ids, weight, offsets, mode="sum"))

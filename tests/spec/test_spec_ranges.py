"""Specs that parse but could not run: numbers out of range and names Dagster refuses fail at validate time."""

from __future__ import annotations

import keyword
from pathlib import Path

import pytest

from primus_dagster.spec import (
    DAGSTER_RESERVED_NAMES,
    JobSpec,
    SpecError,
    dagster_name_problem,
    load_job_spec,
    parse_job_spec,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "job.yaml"
TEXT = EXAMPLE.read_text()
MODEL = "model: {type: mtrm, embedding_dim: 16, hash_buckets: 100000, memory_hidden: [64, 32], adapt_hidden: [128, 64]}"


def problems(text: str) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_job_spec(text, "job.yaml")
    return {where.split(" (line")[0]: message for where, message in info.value.problems}


def replaced(old: str, new: str) -> str:
    assert old in TEXT, old
    return TEXT.replace(old, new)


BAD = [
    # (id, old text, new text, key path, words in the message)
    (
        "negative layer",
        "memory_hidden: [64, 32]",
        "memory_hidden: [-64, 32]",
        "training.model.memory_hidden[0]",
        ">= 1",
    ),
    ("zero layer", "adapt_hidden: [128, 64]", "adapt_hidden: [128, 0]", "training.model.adapt_hidden[1]", ">= 1"),
    ("huge layer", "adapt_hidden: [128, 64]", "adapt_hidden: [100000000, 64]", "training.model.adapt_hidden[0]", "<="),
    ("zero embedding", "embedding_dim: 16", "embedding_dim: 0", "training.model.embedding_dim", ">= 1"),
    (
        "buckets past 2^31-1",
        "hash_buckets: 100000",
        "hash_buckets: 4294967296",
        "training.model.hash_buckets",
        "2147483647",
    ),
    ("few buckets", "hash_buckets: 100000", "hash_buckets: -5", "training.model.hash_buckets", ">= 16"),
    (
        "table too big",
        "embedding_dim: 16, hash_buckets: 100000",
        "embedding_dim: 4096, hash_buckets: 2000000000",
        "training.model",
        "GiB",
    ),
    ("infinite lr", "learning_rate: 0.002", "learning_rate: .inf", "training.learning_rate", "finite"),
    ("nan lr", "learning_rate: 0.002", "learning_rate: .nan", "training.learning_rate", "finite"),
    ("zero lr", "learning_rate: 0.002", "learning_rate: 0", "training.learning_rate", "greater than 0"),
    ("negative lr", "learning_rate: 0.002", "learning_rate: -0.1", "training.learning_rate", "greater than 0"),
    (
        "removed priority_weights",
        "auc_tolerance: 0.005",
        "priority_weights: {batch: 1.0, stream: 1.0}\n  auc_tolerance: 0.005",
        "training.priority_weights",
        "dataset.streams[].weight",
    ),
    ("nan tolerance", "auc_tolerance: 0.005", "auc_tolerance: .nan", "training.auc_tolerance", "finite"),
    ("zero batch", "batch_size: 1024", "batch_size: 0", "training.batch_size", ">= 1"),
    ("seed past 32 bits", "batch_size: 1024", "batch_size: 1024\n  seed: 4294967296", "training.seed", "<="),
    (
        "inf stream weight",
        "      weight: 1.0                  # prioritization",
        "      weight: .inf #",
        "dataset.streams[0].weight",
        "finite",
    ),
    (
        "zero stream weight",
        "      weight: 1.0                  # prioritization",
        "      weight: 0 #",
        "dataset.streams[0].weight",
        "greater than 0",
    ),
    (
        "nan threshold",
        "failed_task_threshold: 0.05",
        "failed_task_threshold: .nan",
        "data.failed_task_threshold",
        "finite",
    ),
    (
        "inf backup",
        "failed_task_threshold: 0.05",
        "failed_task_threshold: 0.05\n  backup_after: .inf",
        "data.backup_after",
        "finite",
    ),
    (
        "zero replicas cap",
        "max_replicas: 4}",
        "max_replicas: 0}",
        "pools.data.max_replicas",
        ">= 1",
    ),
    (
        "absurd replicas",
        "max_replicas: 4}",
        "max_replicas: 100000000}",
        "pools.data.max_replicas",
        "<=",
    ),
    ("inf cpu", "max_replicas: 4}", "max_replicas: 4, cpu: .inf}", "pools.data.cpu", "finite"),
    ("zero memory", "max_replicas: 4}", "max_replicas: 4, memory: 0Gi}", "pools.data.memory", "more than 0"),
    ("zero records", "min_new_records: 5000", "min_new_records: 0", "automation.min_new_records", ">= 1"),
    (
        "huge batch rows",
        "          success_marker: _SUCCESS",
        "          success_marker: _SUCCESS\n          batch_rows: 99999999999",
        "dataset.streams[0].sources[0].batch_rows",
        "<=",
    ),
    (
        "kafka fetch past int32",
        "topic: ctr-events",
        "topic: ctr-events\n          poll_max_bytes: 4294967296",
        "dataset.streams[1].sources[0].poll_max_bytes",
        "<=",
    ),
    (
        "inf scaling weight",
        "pools:\n",
        "scaling: {horizontal: {metrics: [{name: cpu, weight: .inf}]}}\npools:\n",
        "scaling.horizontal.metrics[0].weight",
        "finite",
    ),
    (
        "inf headroom",
        "pools:\n",
        "scaling: {vertical: {headroom: .inf}}\npools:\n",
        "scaling.vertical.headroom",
        "finite",
    ),
    (
        "nan threshold up",
        "pools:\n",
        "scaling: {horizontal: {scale_up_threshold: .nan}}\npools:\n",
        "scaling.horizontal.scale_up_threshold",
        "finite",
    ),
    (
        "oom factor inf",
        "max_replicas: 4}",
        "max_replicas: 4, oom_memory_factor: .inf}",
        "pools.data.oom_memory_factor",
        "finite",
    ),
]


@pytest.mark.parametrize("what,old,new,path,words", BAD, ids=[b[0] for b in BAD])
def test_out_of_range(what: str, old: str, new: str, path: str, words: str) -> None:
    found = problems(replaced(old, new))
    assert path in found, (what, found)
    message = found[path].replace("greater than or equal to", ">=").replace("less than or equal to", "<=")
    assert words in message, (what, found[path])


def test_every_float_field_is_finite() -> None:
    """Audit: no float of any spec model (or a mapping of floats) takes inf or NaN."""
    checked = []

    def walk(model: type) -> None:
        for name, info in model.model_fields.items():
            annotation = str(info.annotation)
            if "float" in annotation:
                checked.append(f"{model.__name__}.{name}")
            for arg in (*getattr(info.annotation, "__args__", ()), info.annotation):
                if isinstance(arg, type) and hasattr(arg, "model_fields") and arg is not model:
                    walk(arg)
                for inner in getattr(arg, "__args__", ()):
                    if isinstance(inner, type) and hasattr(inner, "model_fields"):
                        walk(inner)
            assert model.model_config.get("allow_inf_nan") is False, model.__name__

    walk(JobSpec)
    assert "TrainingSpec.learning_rate" in checked and "StreamSpec.weight" in checked


# ---- names --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["context", "config", "input", "type", "class", "None", "dict", "output_arg_dict"])
def test_source_names_dagster_refuses(name: str) -> None:
    found = problems(replaced("name: impressions_delta", f"name: {name}"))
    assert "dataset.streams[0].sources[1].name" in found
    assert "Dagster" in found["dataset.streams[0].sources[1].name"]


def test_source_named_like_the_training_asset() -> None:
    found = problems(replaced("name: impressions_delta", "name: ctr_demo_model"))
    assert "training asset" in found["<root>"]


def test_reserved_names_cover_python_keywords() -> None:
    assert set(keyword.kwlist) <= DAGSTER_RESERVED_NAMES
    assert dagster_name_problem("impressions") is None
    assert "keyword" in (dagster_name_problem("lambda") or "")
    assert "letters, digits" in (dagster_name_problem("a-b") or "")


def test_reference_example_still_loads() -> None:
    assert load_job_spec(EXAMPLE).training.model.hash_buckets == 100_000

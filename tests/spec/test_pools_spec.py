"""``pools.backend`` / ``pools.namespace`` / ``pools.image``: the kubernetes keys are live, and rejected where
they could do nothing (``backend: local``), naming the key path."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from primus_dagster.spec import PoolsSpec, SpecError, load_job_spec, parse_job_spec
from tests.speckit import one_source_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "job.yaml"


def with_pools(pools: str) -> str:
    text = EXAMPLE.read_text()
    assert "pools:\n  backend: local\n" in text
    return text.replace("pools:\n  backend: local\n", f"pools:\n{pools}")


def problems(text: str) -> dict[str, str]:
    with pytest.raises(SpecError) as err:
        parse_job_spec(text)
    return {path.split(" (line")[0]: message for path, message in err.value.problems}


def test_local_is_the_default_without_kubernetes_keys() -> None:
    pools = load_job_spec(EXAMPLE).pools
    assert (pools.backend, pools.namespace, pools.image) == ("local", None, None)
    assert PoolsSpec() == PoolsSpec(backend="local")


def test_kubernetes_takes_image_and_namespace() -> None:
    job = parse_job_spec(with_pools("  backend: kubernetes\n  image: registry.example/primus:1.0\n  namespace: ml\n"))
    assert (job.pools.backend, job.pools.image, job.pools.namespace) == (
        "kubernetes",
        "registry.example/primus:1.0",
        "ml",
    )
    # Without a namespace the pods go where the run runs (resolved by the pool).
    assert parse_job_spec(with_pools("  backend: kubernetes\n  image: img:1\n")).pools.namespace is None


def test_kubernetes_requires_an_image() -> None:
    found = problems(with_pools("  backend: kubernetes\n"))
    assert list(found) == ["pools.image"]
    assert "required when pools.backend is kubernetes" in found["pools.image"]


@pytest.mark.parametrize("key,value", [("image", "img:1"), ("namespace", "ml")])
def test_kubernetes_keys_are_rejected_with_the_local_backend(key: str, value: str) -> None:
    found = problems(with_pools(f"  backend: local\n  {key}: {value}\n"))
    assert list(found) == [f"pools.{key}"]
    assert f"only the kubernetes backend uses pools.{key}" in found[f"pools.{key}"]
    # The same without naming the backend: local is the default.
    assert list(problems(with_pools(f"  {key}: {value}\n"))) == [f"pools.{key}"]


@pytest.mark.parametrize(
    "pools,path",
    [
        ("  backend: kubernetes\n  image: img:1\n  namespace: Team_ML\n", "pools.namespace"),
        ("  backend: kubernetes\n  image: img:1\n  namespace: " + "n" * 64 + "\n", "pools.namespace"),
        ("  backend: kubernetes\n  image: 'has space'\n", "pools.image"),
        ("  backend: k8s\n  image: img:1\n", "pools.backend"),
    ],
)
def test_malformed_values_name_their_key(pools: str, path: str) -> None:
    assert path in problems(with_pools(pools))


def test_the_rule_holds_for_models_built_in_code() -> None:
    with pytest.raises(ValidationError, match=r"required when pools\.backend is kubernetes"):
        PoolsSpec(backend="kubernetes")
    with pytest.raises(ValidationError, match=r"only the kubernetes backend uses pools\.image"):
        PoolsSpec(image="img:1")
    pools = PoolsSpec(backend="kubernetes", image="img:1")
    with pytest.raises(ValidationError, match="required"):
        pools.image = None  # assignments are validated too


def in_trainer(pools: str = "", extra: str = "") -> str:
    return one_source_spec("in-trainer", "pools:\n  backend: in_trainer\n" + pools, extra)


def test_in_trainer_takes_the_executor_count_and_task_runners() -> None:
    job = parse_job_spec(in_trainer("  data: {replicas: 3, task_runners: 1}\n"))
    assert (job.pools.backend, job.pools.data.replicas, job.pools.data.task_runners) == ("in_trainer", 3, 1)
    assert parse_job_spec(in_trainer()).pools.data.replicas == 2  # the default pool's count


@pytest.mark.parametrize(
    "pools,extra,path,message",
    [
        (
            "  data: {replicas: 2, max_replicas: 8, memory: 4Gi}\n",
            "",
            "pools",
            "pools.data.max_replicas, pools.data.memory would do nothing",
        ),
        ("  data: {replicas: 0}\n", "", "pools.data", "min_replicas <= replicas"),
        ("  training: {replicas: 2, max_replicas: 2}\n", "", "pools", "serves one trainer"),
        ("  image: img:1\n", "", "pools.image", "only the kubernetes backend"),
        ("", "scaling: {interval: 10s}\n", "scaling", "no executor pool to scale"),
    ],
)
def test_in_trainer_rejects_what_only_a_pool_of_processes_uses(pools: str, extra: str, path: str, message: str) -> None:
    found = problems(in_trainer(pools, extra))
    assert any(message in text for text in found.values()), found
    assert path in found or any(key.startswith(path) for key in found), found


@pytest.mark.parametrize(
    ("data", "runners"),
    [
        ("{replicas: 2}", 1),  # cpu 1 by default: one reading thread
        ("{replicas: 2, cpu: 4}", 4),
        ("{replicas: 2, cpu: 2.5}", 2),  # whole cores
        ("{replicas: 2, cpu: 0.5}", 1),  # at least one
        ("{replicas: 2, cpu: 4, task_runners: 8}", 8),  # written: as written
        ("{replicas: 2, task_runners: 3}", 3),
    ],
)
def test_task_runners_follow_the_executors_cpu_unless_written(data: str, runners: int) -> None:
    """An executor of ``cpu`` cores reads with that many threads by default (more than its cores cost CPU
    per row: 2 executors x 2 runners on 2 cores served at 0.57 of ``tensors_1t``, x 1 runner at 0.62)."""
    job = parse_job_spec(one_source_spec("runners", f"pools: {{data: {data}}}\n"))
    assert job.pools.data.task_runners == runners
    assert PoolsSpec().data.task_runners == 1


def test_a_malformed_cpu_is_named_not_hidden_by_the_runners_default() -> None:
    found = problems(one_source_spec("runners", "pools: {data: {replicas: 2, cpu: lots}}\n"))
    assert "pools.data.cpu" in found


def test_a_training_pool_with_cores_takes_no_runners_of_its_own() -> None:
    """``pools.training.cpu: 2`` is a rank's threads; the data pool's ``task_runners`` default that follows it
    is not a key the spec wrote, so the training pool is not told to remove it -- one that differs from it is."""
    job = parse_job_spec(one_source_spec("ranks", "pools: {training: {replicas: 1, cpu: 2}}\n"))
    assert job.pools.training.cpu == 2
    found = problems(one_source_spec("ranks", "pools: {training: {replicas: 1, task_runners: 3}}\n"))
    assert any("task_runners" in message for message in found.values()), found

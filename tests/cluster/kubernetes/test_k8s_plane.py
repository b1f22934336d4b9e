"""The Kubernetes pool as a ``PooledDataPlane``'s data pool: a real plane (driver served over Flight) whose
pool talks to the FAKE ``CoreV1Api`` of ``fake_core_v1.py``, since no Kubernetes API server runs here.
The plane's driver address, token, trainer count, serving fields and the job's image and namespace reach the
executor pods (their CPU is not measured from here); closing the plane deletes them, the Service and the Secret."""

from __future__ import annotations

from pathlib import Path

from fake_core_v1 import FakeCoreV1Api

from primus_dagster.cluster.kubernetes import kubernetes_pool_factory
from primus_dagster.cluster.pooled_plane import PooledDataPlane
from primus_dagster.spec import load_job_spec

REPO = Path(__file__).resolve().parents[3]
TOKEN = "plane-token-never-in-a-pod-17"


def test_a_plane_runs_its_data_executors_as_pods(tmp_path: Path) -> None:
    job_path = tmp_path / "job.yaml"
    job_path.write_text(
        (REPO / "examples" / "job.yaml")
        .read_text()
        .replace("backend: local", "backend: kubernetes\n  image: registry.example/primus:3\n  namespace: ml")
    )
    job = load_job_spec(job_path)
    api = FakeCoreV1Api()
    factory = kubernetes_pool_factory("run-42", job_spec_path="/app/job.yaml", api=api)
    fields = ("sparse", "label", "dense")
    with PooledDataPlane(job_path, tmp_path, trainers=2, token=TOKEN, pool_factory=factory, fields=fields) as plane:
        pods = api.pods("ml")
        assert len(pods) == job.pools.data.replicas
        for pod in pods:
            container = pod["spec"]["containers"][0]
            assert container["image"] == "registry.example/primus:3"
            env = {e["name"]: e for e in container["env"]}
            assert env["PRIMUS_DRIVER"]["value"] == plane.location
            assert "secretKeyRef" in env["PRIMUS_DATA_TOKEN"]["valueFrom"] and TOKEN not in str(pod)
            args = container["args"]
            assert args[args.index("--trainers") + 1] == "2"
            assert args[args.index("--job-spec") + 1] == "/app/job.yaml"
            assert args[args.index("--data-root") + 1] == str(tmp_path)
            assert args[args.index("--fields") + 1] == "dense,label,sparse"
        assert plane.pool is not None and plane.cpu_seconds() == 0.0
        assert {s.state for s in plane.pool.status()} <= {"starting", "running"}
    api._observe()
    assert api.objects == {}

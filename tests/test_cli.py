"""`primus-dagster` commands that need no broker: validate, spec-schema, partitions, train's verdict (training faked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from primus_dagster.cli import main

REPO = Path(__file__).resolve().parents[1]

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "job.yaml")


def test_validate_ok(capsys) -> None:
    assert main(["validate", EXAMPLE]) == 0
    assert "is valid" in capsys.readouterr().out


def test_validate_bad_spec_exit_2_with_key_path(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(EXAMPLE).read_text().replace("window: 24h", "window: -1h"))
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "dataset.streams[0].window" in err and "-1h" in err


def test_spec_schema_to_file(tmp_path: Path) -> None:
    out = tmp_path / "schema.json"
    assert main(["spec-schema", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["title"] == "primus_dagster JobSpec"


def test_partitions_lists_readiness(tmp_path: Path, capsys) -> None:
    hour = tmp_path / "parquet" / "impressions" / "dt=2026-11-01" / "hour=01"
    hour.mkdir(parents=True)
    pq.write_table(pa.table({"x": [1]}), hour / "part-0.parquet")
    (hour / "_SUCCESS").touch()
    assert (
        main(
            [
                "partitions",
                EXAMPLE,
                "--source",
                "impressions_parquet",
                "--count",
                "3",
                "--data-root",
                str(tmp_path),
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [r["ready"] for r in rows] == [False, True, False]
    assert rows[1]["files"] == 1


def test_unknown_source_is_a_clear_error(capsys) -> None:
    assert main(["partitions", EXAMPLE, "--source", "nope"]) == 2
    assert "no source 'nope'" in capsys.readouterr().err


def test_train_with_sources_it_cannot_read_names_them_and_trains_nothing(tmp_path, capsys) -> None:
    from primus_dagster.cli import main

    code = main(
        [
            "train",
            "examples/job.yaml",
            "--start",
            "2026-11-02",
            "--hours",
            "1",
            "--data-root",
            str(tmp_path),
            "--kafka-bootstrap",
            "127.0.0.1:1",
            "--tracking-uri",
            f"sqlite:///{tmp_path}/mlflow.db",
        ]
    )
    assert code == 1
    err = capsys.readouterr().err  # no broker at 127.0.0.1:1, no Iceberg table under the empty data root
    assert "cannot read source(s) ['events_kafka', 'impressions_delta', 'impressions_iceberg']" in err
    assert "no Kafka broker answers at 127.0.0.1:1" in err and "nothing was trained" in err


def test_train_prints_the_quality_verdict_and_fail_below_baseline_exits_3(monkeypatch, capsys) -> None:
    """``train`` with the training faked (a model of AUC 0.70): the verdict line after training, and
    ``--fail-below-baseline`` turning a model below its popularity prior (or not evaluated) into exit 3."""
    from primus_dagster.cli import BELOW_BASELINE_EXIT
    from primus_dagster.training import tracking, window
    from primus_dagster.training.baseline import BaselineVerdict
    from primus_dagster.training.evaluation import NextHourEvaluation
    from primus_dagster.training.metrics import EvalResult
    from primus_dagster.training.result import TrainingResult

    prior = {"auc": 0.72}

    def fake_train_window(request, hooks) -> TrainingResult:
        baseline = BaselineVerdict(prior["auc"], "item_id", {"item_id": prior["auc"]})
        evaluation = NextHourEvaluation(EvalResult(0.70, 0.6, 300, 90, 0.3), "batch", request.window, baseline)
        if prior["auc"] is None:
            evaluation = None
        return TrainingResult("r", "sqlite:///x#/r", "models:/m-1", request.window, {}, evaluation, {})

    monkeypatch.setattr(window, "train_window", fake_train_window)
    monkeypatch.setattr(tracking, "MlflowTracker", lambda *args, **kwargs: None)
    train = ["train", EXAMPLE, "--hours", "1"]
    assert main(train) == 0  # default: the verdict is printed, the exit code unchanged
    out = capsys.readouterr().out
    below = "quality: AUC 0.7000 vs popularity prior 0.7200 (feature item_id): BELOW BASELINE: below the popularity"
    assert below in out and "baseline_verdict: AUC 0.7000" in out
    assert main([*train, "--fail-below-baseline"]) == BELOW_BASELINE_EXIT == 3
    assert main([*train, "--fail-below-baseline", "--json"]) == 3
    captured = capsys.readouterr()
    assert json.loads(captured.out.splitlines()[-1])["popularity_feature"] == "item_id"  # stdout: JSON only
    assert below in captured.err
    prior["auc"] = 0.69
    assert main([*train, "--fail-below-baseline"]) == 0
    assert "quality: AUC 0.7000 vs popularity prior 0.6900 (feature item_id): ok" in capsys.readouterr().out
    prior["auc"] = None  # not evaluated: no verdict, not ok
    assert main([*train, "--fail-below-baseline"]) == 3 and main(train) == 0
    assert "quality: not evaluated" in capsys.readouterr().out


def unreadable(tmp_path: Path) -> list[str]:
    """The example spec over an empty data root and a port no broker listens on: the Delta table, the
    Iceberg catalog's table and the Kafka broker fail to list; the Parquet hours are only not ready."""
    return ["--data-root", str(tmp_path), "--kafka-bootstrap", "127.0.0.1:1"]


FAILED_SOURCES = ["events_kafka", "impressions_delta", "impressions_iceberg"]


def test_plan_with_failed_listings_names_each_and_exits_1(tmp_path: Path, capsys) -> None:
    plan = ["plan", EXAMPLE, "--start", "2026-11-01", "--hours", "2", *unreadable(tmp_path)]
    assert main(plan) == 1
    captured = capsys.readouterr()
    assert "not ready: 8 partition(s)" in captured.out  # the plan itself is still printed
    lines = captured.err.splitlines()
    header = f"error: 6 partition(s) of source(s) {FAILED_SOURCES} in window [2026-11-01T00:00Z, 2026-11-01T02:00Z)"
    assert lines[0] == header + " failed to list:"
    two = "2 partitions 2026-11-01T00:00Z .. 2026-11-01T01:00Z: listing failed:"
    assert lines[1].startswith(f"  events_kafka {two} KafkaConfigError: source 'events_kafka': no Kafka broker")
    assert lines[2].startswith(f"  impressions_delta {two} DeltaTableNotFoundError: no Delta table at ")
    assert lines[3].startswith(f"  impressions_iceberg {two} IcebergTableNotFoundError: ")
    assert len(lines) == 4 and "impressions_parquet" not in captured.err  # not ready is not a failure

    assert main([*plan, "--json"]) == 1
    captured = capsys.readouterr()
    states = {(p["source"], p["state"]) for p in json.loads(captured.out)["not_ready"]}  # stdout: the JSON only
    assert states == {(s, "error") for s in FAILED_SOURCES} | {("impressions_parquet", "not_ready")}
    assert captured.err.startswith(header)


def test_plan_with_partitions_only_not_ready_exits_0(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "parquet.yaml"
    spec.write_text(
        "name: plan-parquet\ndataset:\n  start: 2026-11-01\n  streams:\n    - name: history\n      sources:\n"
        "        - {name: imp, type: parquet, path: imp, columns: {ts: event_time, dense: [d0]}}\n"
    )
    assert main(["plan", str(spec), "--hours", "3", "--data-root", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "not ready: 3 partition(s)" in captured.out and captured.err == ""


def test_partitions_of_a_source_that_fails_to_list_is_one_error_line_exit_1(tmp_path: Path, capsys) -> None:
    code = main(["partitions", EXAMPLE, "--source", "impressions_delta", "--count", "2", *unreadable(tmp_path)])
    assert code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        "error: listing source 'impressions_delta' in window [2026-11-01T00:00Z, 2026-11-01T02:00Z) failed: "
        "DeltaTableNotFoundError: no Delta table at "
    )
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_validate_data_with_failed_listings_names_them_and_exits_1(tmp_path: Path, capsys) -> None:
    assert main(["validate", EXAMPLE, "--data", "--hours", "1", *unreadable(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: 3 partition(s) of source(s) {FAILED_SOURCES} in window ")
    assert "  impressions_delta 2026-11-01T00:00Z: listing failed: DeltaTableNotFoundError" in err


def test_a_full_disk_is_one_error_line_and_exit_1(capsys, monkeypatch, tmp_path: Path) -> None:
    """``/dev/full`` answers every write with ENOSPC, as a full disk does; the file is not known, so the line
    names the free space of every filesystem a run writes to, the temporary directory's among them."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", "/dev/shm" if Path("/dev/shm").is_dir() else str(tmp_path))
    assert main(["spec-schema", "--out", "/dev/full"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: a write failed (the file is not known): No space left on device; ")
    assert " free on " in err and "(TMPDIR)" in err and err.count("\n") == 1


def test_live_without_any_kafka_is_one_error_line(tmp_path: Path) -> None:
    """No bootstrap servers anywhere (no spec key, no environment, no embedded broker recorded in this
    PRIMUS_HOME): one line naming the source and every way to configure one, exit 1, no traceback."""
    env = {k: v for k, v in os.environ.items() if k != "PRIMUS_KAFKA_BOOTSTRAP_SERVERS"}
    env["PRIMUS_HOME"] = str(tmp_path / "home")
    done = subprocess.run(
        [sys.executable, "-m", "primus_dagster.cli", "live", str(REPO / "examples" / "job.yaml")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "source 'events_kafka': no Kafka bootstrap servers" in error and "PRIMUS_KAFKA_BOOTSTRAP_SERVERS" in error

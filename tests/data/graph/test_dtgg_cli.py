"""`primus-dagster plan`: graph, task counts and not-ready partitions, as text and JSON."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from primus_dagster.cli import main

SPEC = """
name: plan-test
dataset:
  start: 2026-11-01
  streams:
    - name: history
      sources:
        - {name: imp_h, type: parquet, path: imp, columns: &c {ts: event_time, dense: [d0]}}
        - {name: clk_h, type: parquet, path: clk, columns: *c}
      join: {left: imp_h, right: clk_h, key: sample_id, lateness: 15m}
    - name: fresh
      sources:
        - {name: imp_f, type: parquet, path: imp, columns: *c}
data:
  planner_threads: 2
"""


def write(root: Path, rel: str, hour: int, files: int) -> None:
    when = datetime(2026, 11, 1, hour, tzinfo=timezone.utc)
    directory = root / rel / f"dt={when:%Y-%m-%d}" / f"hour={when:%H}"
    directory.mkdir(parents=True)
    for i in range(files):
        (directory / f"part-{i}.parquet").write_bytes(b"x" * 100)
    (directory / "_SUCCESS").touch()


def test_plan_json_and_text(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    for hour in range(3):
        write(tmp_path, "imp", hour, 4)
    for hour in range(2):
        write(tmp_path, "clk", hour, 2)
    args = ["plan", str(spec), "--start", "2026-11-01T00:00", "--hours", "3", "--data-root", str(tmp_path)]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    counts = {(c["stream"], c["source"]): c["tasks"] for c in out["counts"]}
    # each hour's small files are one pack (data.pack_bytes, data.open_cost_bytes at their defaults)
    assert counts == {("history", "imp_h"): 1, ("history", "clk_h"): 0, ("fresh", "imp_f"): 3}
    assert out["stats"]["tasks"] == 4 and out["stats"]["files"] == 16 and out["stats"]["threads"] == 2
    assert out["stats"]["listings"] == 7  # imp x 3 hours (fused) + clk x 4 (hour 3 for the lateness)
    fused = [n for n in out["graph"]["nodes"] if n["op"] == "source" and n["fused"]]
    assert len(fused) == 1 and len(fused[0]["consumers"]) == 2
    assert {(p["source"], p["state"]) for p in out["not_ready"]} == {("imp_h", "waiting"), ("clk_h", "not_ready")}
    assert main([*args, "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert "FUSED" in text and "join:history" in text and "waiting for clk_h" in text and "1 thread(s)" in text


def test_pack_bytes_zero_plans_a_task_per_file(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC.replace("planner_threads: 2", "planner_threads: 2\n  pack_bytes: 0"))
    for hour in range(3):
        write(tmp_path, "imp", hour, 4)
    for hour in range(2):
        write(tmp_path, "clk", hour, 2)
    args = ["plan", str(spec), "--start", "2026-11-01T00:00", "--hours", "3", "--data-root", str(tmp_path), "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    counts = {(c["stream"], c["source"]): c["tasks"] for c in out["counts"]}
    assert counts == {("history", "imp_h"): 4, ("history", "clk_h"): 0, ("fresh", "imp_f"): 12}
    assert out["stats"]["tasks"] == 16

"""A report printed to a pipe keeps a long line whole (an MLflow URI can be copied from ``make demo | tee``)."""

from __future__ import annotations

from rich.table import Table

from primus_dagster.console import PIPE_WIDTH, report_console


def test_a_piped_report_keeps_its_title_and_a_long_uri_on_one_line(capsys) -> None:
    uri = "http://127.0.0.1:5000/#/experiments/1/runs/" + "0123456789abcdef" * 2
    table = Table(title="training asset ctr_demo_model [2026-11-02] in 41.2s, run 5f0c0d1e-8f2b-4b4e-9d0a")
    table.add_column("", no_wrap=True)
    table.add_column("", overflow="fold")
    table.add_row("MLflow run", uri)
    console = report_console()  # pytest's captured stdout is not a terminal
    assert console.width == PIPE_WIDTH
    console.print(table)
    out = capsys.readouterr().out
    assert any(uri in line for line in out.splitlines())
    assert any("run 5f0c0d1e-8f2b-4b4e-9d0a" in line for line in out.splitlines())

"""Job spec text for tests of validation and wiring: one hourly Parquet batch source, never read.

Example::

    text = one_source_spec("abw", before="pools: {training: {replicas: 2}}\\n")
    job = parse_job_spec(text)
"""

from __future__ import annotations

ONE_SOURCE_DATASET = """dataset:
  start: 2026-11-01
  streams:
    - name: s
      window: 1h
      sources:
        - {name: src, type: parquet, kind: batch, path: p, columns: {ts: t, label: y, dense: [d0], sparse: [u]}}
"""


def one_source_spec(name: str, before: str = "", after: str = "") -> str:
    """Job ``name`` with the one-source dataset; ``before`` / ``after``: top-level YAML around it."""
    return f"name: {name}\n{before}{ONE_SOURCE_DATASET}{after}"

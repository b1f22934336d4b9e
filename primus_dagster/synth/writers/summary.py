"""What :func:`~primus_dagster.synth.writers.write_world` wrote: rows, bytes, files and seconds per source.

Example::

    summary = write_world(job, context, world, range(24), progress=False)
    summary.sources["impressions_delta"].rows    # rows written to one source
    summary.as_dict()                            # JSON-ready totals
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SourceStats:
    """What was written to one source, e.g. ``summary.sources["impressions_delta"].rows``."""

    name: str
    type: str
    kind: str
    rows: int = 0
    bytes: int = 0
    files: int = 0
    hours: int = 0
    seconds: float = 0.0


@dataclass
class WriteSummary:
    """Result of :func:`write_world`: per-source stats plus generation time.

    Example::

        summary = write_world(job, context, world, range(24), progress=False)
        print(summary.rows_total, json.dumps(summary.as_dict()))
    """

    sources: dict[str, SourceStats] = field(default_factory=dict)
    hours: int = 0
    world_rows: int = 0
    generate_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def rows_total(self) -> int:
        return sum(s.rows for s in self.sources.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "hours": self.hours,
            "world_rows": self.world_rows,
            "generate_seconds": round(self.generate_seconds, 3),
            "seconds": round(self.seconds, 3),
            "sources": {k: vars(v) for k, v in self.sources.items()},
        }

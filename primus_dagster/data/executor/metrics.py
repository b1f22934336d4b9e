"""Executor metrics for heartbeats (the scaling signals): rates since the last sample and process use.

Example::

    meter = RateMeter()
    meter.sample(rows=1000, batches=10)   # {"rows_per_s": ..., "batches_per_s": ..., "cpu": ..., "rss_bytes": ...}
"""

from __future__ import annotations

import time

import psutil


class RateMeter:
    """Rows/batches per second between two :meth:`sample` calls, plus this process's CPU and RSS.

    ``cpu`` is psutil's process CPU percent / 100 (1.0 = one core busy; more with threads).
    """

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # prime: the first call always answers 0
        self._last = (time.monotonic(), 0, 0)

    def sample(self, rows: int, batches: int) -> dict[str, float]:
        """Rates of the cumulative ``rows``/``batches`` counters since the previous sample."""
        now = time.monotonic()
        then, last_rows, last_batches = self._last
        self._last = (now, rows, batches)
        dt = max(now - then, 1e-6)
        return {
            "rows_per_s": (rows - last_rows) / dt,
            "batches_per_s": (batches - last_batches) / dt,
            "cpu": self._process.cpu_percent(None) / 100.0,
            "rss_bytes": float(self._process.memory_info().rss),
        }

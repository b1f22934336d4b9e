"""Bounds of event waits in tests: the idle machine's figure, scaled up by the load per core above 1.

A loaded machine (a CI beside other jobs) runs everything slower, never differently: a wait on an event
keeps its meaning when its bound grows with the load, and still ends at the event.

Example::

    deadline = time.monotonic() + load_scaled(120)
"""

from __future__ import annotations

import os


def load_scaled(seconds: float, cap: float | None = None) -> float:
    """``seconds`` times the 1-minute load per core when that is above 1 (at most ``cap``, if given)."""
    scaled = seconds * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    return scaled if cap is None else min(cap, scaled)

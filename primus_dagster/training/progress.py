"""A training run's log never goes quiet: stage lines, and a heartbeat while a stage is silent.

Planning a window, starting data executors and waiting for the first batch can each take seconds
with nothing to report. :class:`Heartbeat` logs each stage as it begins (``stage``) and, whenever
no line of the ``primus_dagster`` loggers (nor a progress line, ``touch``) came for ``interval_s``,
one line saying which stage is still running and for how long -- so the CLI's stderr and the Dagster
run log (which forwards these loggers) show a line at least every few seconds.

Example::

    with Heartbeat() as beat:
        beat.stage("planning window %s", window)
        tasks = plan(window)               # quiet for 8 s: two "... (3 s)", "... (6 s)" lines
        beat.stage("training")
"""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType
from typing import Any

__all__ = ["HEARTBEAT_S", "Heartbeat", "progress_line"]

HEARTBEAT_S = 3.0  # the run log's longest silence (plus scheduling): under the 5 s users notice
_PACKAGE_LOGGER = "primus_dagster"

log = logging.getLogger("primus_dagster.training.progress")


class _Touch(logging.Handler):
    """Notes the time of every line the package logs (any thread): the heartbeat stays quiet then."""

    def __init__(self, beat: Heartbeat) -> None:
        super().__init__(logging.INFO)
        self.beat = beat

    def emit(self, record: logging.LogRecord) -> None:
        self.beat.touch()


class Heartbeat:
    """Stage lines and a heartbeat line after ``interval_s`` of silence (see the module docstring).

    ``stage(text, *args)`` logs the text (``%``-formatted like ``logging``) and makes it the current
    stage; ``quiet_stage`` only changes what the heartbeat reports; ``touch`` marks a line written
    elsewhere (a progress line printed or sent to ``context.log``).

    Example::

        with Heartbeat(interval_s=2.0) as beat:
            beat.stage("starting %d data executors", 4)
    """

    def __init__(self, interval_s: float = HEARTBEAT_S, logger: logging.Logger | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self.log = logger or log
        self.current = "starting"
        self.stage_started = self.last_line = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handler = _Touch(self)

    def __enter__(self) -> Heartbeat:
        logging.getLogger(_PACKAGE_LOGGER).addHandler(self._handler)
        self._thread = threading.Thread(target=self._run, name="primus-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        logging.getLogger(_PACKAGE_LOGGER).removeHandler(self._handler)

    def touch(self) -> None:
        self.last_line = time.monotonic()

    def quiet_stage(self, text: str) -> None:
        self.current, self.stage_started = text, time.monotonic()

    def stage(self, text: str, *args: object) -> None:
        self.quiet_stage(text % args if args else text)
        self.log.info("%s", self.current)
        self.touch()

    def _run(self) -> None:
        tick = min(0.25, self.interval_s / 4)
        while not self._stop.wait(tick):
            now = time.monotonic()
            if now - self.last_line >= self.interval_s:
                self.log.info("%s (%.0f s)", self.current, now - self.stage_started)
                self.touch()  # also when the logger drops INFO lines: no busy loop


def progress_line(progress: dict[str, Any]) -> str:
    """One line of a run's progress (what ``TrainingRequest.progress`` receives), for logs and terminals."""
    return (
        f"[{progress['phase']}] step {progress['step']:,}  samples {progress['samples']:,}  "
        f"loss {progress['loss']:.4f}  train-AUC {progress['train_auc']:.4f}  "
        f"{progress['samples_per_s']:,.0f} samples/s"
    )

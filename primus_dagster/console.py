"""The Rich console the command lines print their reports on: :func:`report_console`."""

from __future__ import annotations

from rich.console import Console

#: The width of a report written to a file or a pipe: wide enough that a table's title, its rows and an
#: MLflow URI stay on one line each (Rich's default there is 80 columns, or ``$COLUMNS``).
PIPE_WIDTH = 200


def report_console() -> Console:
    """A console of the terminal's width, or of :data:`PIPE_WIDTH` when the output is not a terminal
    (``make demo | tee demo.log``: lines that can be copied whole).

    Example::

        report_console().print(table)
    """
    console = Console()
    return console if console.is_terminal else Console(width=PIPE_WIDTH)

"""``python -m primus_dagster.training.distributed.dial_back --channel HOST:PORT --rank R``: one trainer rank
that someone else started (a pod, a plain process) dials back to its parent and runs what it is sent.

The channel key comes from ``$PRIMUS_RANK_CHANNEL_KEY`` (in a pod: a Secret reference), never from the
command line, and is dropped from the environment before the work runs. Every wait is bounded by
``--timeout-s`` (connecting, the handshake, the work): exit code 2 with a line naming the channel when
the parent is not there, refuses the key or sends nothing; 3 when the channel ends while the rank runs
(the job process closed it, or is gone); otherwise what the work does (1 with its traceback when it
raises). The protocol: :mod:`~primus_dagster.training.distributed.channel`.

Example::

    PRIMUS_RANK_CHANNEL_KEY=... python -m primus_dagster.training.distributed.dial_back \\
        --channel 10.0.0.5:41234 --rank 1
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from primus_dagster.training.distributed.channel import (
    CHANNEL_ERROR_EXIT,
    CHANNEL_KEY_ENV,
    DIAL_BACK_MODULE,
    ChannelError,
    dial_back,
    serve_dialed,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Dial back, run the work; the exit code (module docstring)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {DIAL_BACK_MODULE}",
        description=f"A trainer rank that dials back to its parent (the channel key in ${CHANNEL_KEY_ENV}).",
    )
    parser.add_argument("--channel", required=True, help="HOST:PORT of the parent's rank channel")
    parser.add_argument("--rank", type=int, required=True, help="this rank's number in its group")
    parser.add_argument(
        "--timeout-s", type=float, default=300.0, help="the bound on reaching the parent and getting the work"
    )
    args = parser.parse_args(argv)
    key = os.environ.pop(CHANNEL_KEY_ENV, "")
    if not key:
        print(f"trainer rank {args.rank}: no channel key: set ${CHANNEL_KEY_ENV}", file=sys.stderr)
        return CHANNEL_ERROR_EXIT
    try:
        conn, work = dial_back(args.channel, args.rank, key, timeout_s=args.timeout_s)
    except (ChannelError, ValueError) as exc:
        print(f"trainer {exc}" if str(exc).startswith("rank ") else str(exc), file=sys.stderr)
        return CHANNEL_ERROR_EXIT
    serve_dialed(conn, args.rank, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())

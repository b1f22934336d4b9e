"""``python -m primus_dagster.data.executor``: run one data executor process (see ``process``)."""

import logging
import os
import sys

from primus_dagster.data.executor.process import main

if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter finalisation: its full garbage collection of everything the executor
    # imported costs a worker a noticeable share of its CPU, and there is nothing left to clean.
    os._exit(code)

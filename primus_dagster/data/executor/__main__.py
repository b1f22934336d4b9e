"""``python -m primus_dagster.data.executor``: run one data executor process (see ``process``)."""

import sys

from primus_dagster.data.executor.process import main

if __name__ == "__main__":
    sys.exit(main())

"""Reference code location: the job it serves, and the assets a user adds beside the job's.

``build_definitions`` (in ``definitions.py``) turns the job into one asset per data source and the
training asset. ``JOB_SPEC_PATH`` is ``$PRIMUS_JOB_SPEC`` (default: ``examples/job.yaml``);
``EXTRA_ASSETS`` holds a user's own assets (reports, exports downstream of the model): none here.

Example::

    PRIMUS_JOB_SPEC=my_job.yaml dagster dev      # the same location serving another job
"""

import os
from pathlib import Path

from dagster import AssetsDefinition

from primus_dagster.spec import load_job_spec

JOB_SPEC_PATH = Path(os.environ.get("PRIMUS_JOB_SPEC") or Path(__file__).resolve().parents[1] / "examples" / "job.yaml")
JOB = load_job_spec(JOB_SPEC_PATH)

EXTRA_ASSETS: list[AssetsDefinition] = []

"""Reference deployment: the assets of the example job (one per data source, and the training asset).

The job spec path comes from ``$PRIMUS_JOB_SPEC`` (default: ``examples/job.yaml``).
"""

import os
from pathlib import Path

from primus_dagster.dagster_defs import build_source_assets, build_training_asset
from primus_dagster.spec import load_job_spec

JOB_SPEC_PATH = Path(os.environ.get("PRIMUS_JOB_SPEC") or Path(__file__).resolve().parents[1] / "examples" / "job.yaml")
JOB = load_job_spec(JOB_SPEC_PATH)

source_assets = [*build_source_assets(JOB), build_training_asset(JOB, JOB_SPEC_PATH)]

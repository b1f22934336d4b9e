"""Links from what the engine records (MLflow runs) back to the Dagster run, asset and partition.

Example::

    TrainingJob(..., tags=dagster_run_tags(context))   # MLflow tags dagster.run_id, dagster.asset, ...
"""

from dagster import AssetExecutionContext


def dagster_run_tags(context: AssetExecutionContext) -> dict[str, str]:
    """MLflow run tags naming the Dagster run, asset and (if any) partition that trained a model."""
    tags = {
        "dagster.run_id": context.run.run_id,
        "dagster.job": context.job_name,
        "dagster.asset": context.asset_key.to_user_string(),
    }
    if context.has_partition_key:
        tags["dagster.partition"] = context.partition_key
    return tags

"""Base class of every spec model: unknown keys are errors, never silently ignored."""

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A pydantic model that forbids unknown keys and validates defaults and assignments."""

    model_config = ConfigDict(extra="forbid", validate_default=True, validate_assignment=True)

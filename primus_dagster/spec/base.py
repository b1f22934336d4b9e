"""Base class of every spec model: unknown keys are errors, never silently ignored."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from primus_dagster.spec.redact import is_secret_key, redact


class StrictModel(BaseModel):
    """A pydantic model that forbids unknown keys and validates defaults and assignments.

    Every float must be finite (``allow_inf_nan=False``: ``.inf`` or ``.nan`` in YAML is an error), a
    validation error never shows the input (``hide_input_in_errors``: it may be a secret; the loader
    adds the offending value itself where it is not), and the repr masks secret values (see
    :mod:`primus_dagster.spec.redact`).
    """

    model_config = ConfigDict(
        extra="forbid",
        validate_default=True,
        validate_assignment=True,
        allow_inf_nan=False,
        hide_input_in_errors=True,
    )

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            if isinstance(value, BaseModel):
                yield name, value  # its own repr redacts
            elif isinstance(name, str) and is_secret_key(name):
                yield name, redact({name: value})[name]
            else:
                yield name, redact(value)

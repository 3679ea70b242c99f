"""The base of every config model: unknown keys are errors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A config section whose typos fail: a misspelt key such as `learning_rate` must not be ignored silently."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

"""What every config section shares: unknown keys are errors, and one form of a duration."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    """A config table: a key it does not define is an error, so a typo is reported."""

    model_config = ConfigDict(extra="forbid")


#: A duration in seconds: finite, above 0, a number as written (no string).
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]

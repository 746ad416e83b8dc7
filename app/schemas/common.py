"""What the API's shapes share: the base of every request body, metric values, the error reply."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    PlainSerializer,
    StringConstraints,
)
from rankboard import wire


def _metric_value(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    return wire.decode_value(value) if isinstance(value, str) else value


# A metric value: a JSON number, or "NaN" / "Infinity" / "-Infinity", which JSON cannot write as numbers.
MetricValue = Annotated[
    float,
    Field(allow_inf_nan=True),
    BeforeValidator(_metric_value),
    PlainSerializer(wire.encode_value, return_type=Any),
]


Step = Annotated[int, Field(ge=0, le=wire.MAX_STEP)]


HostName = Annotated[str, StringConstraints(min_length=1, max_length=wire.MAX_HOST_LENGTH)]


class ErrorOut(BaseModel):
    """A domain error: what cannot be done, and why, in the user's words."""

    detail: str

"""What the API's shapes share: the base of every request body, metric values, the error reply."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StringConstraints,
)
from rankboard import wire


class Body(BaseModel):
    """What every request body shares: an unknown field, a non-finite number where it is not data (NaN or 1e400 as a
    learning rate, a time, a rate) and a value of the wrong JSON type (`true` for an integer, `0` for a boolean, `1.0`
    for a count) are refused with a 422 naming the field, never coerced. A field that takes strings meaning numbers
    (the form's) is parsed with `strict=False`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


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


def one_of(choices: tuple[str, ...]) -> AfterValidator:
    """A check that the value is one of `choices`, naming them when it is not."""

    def check(value: str) -> str:
        if value not in choices:
            raise ValueError(f"choose one of: {', '.join(choices)} (got {value!r})")
        return value

    return AfterValidator(check)

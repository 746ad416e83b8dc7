"""What every request body is checked by: one strict base model, and the check of a choice among names."""

from __future__ import annotations

from pydantic import AfterValidator, BaseModel, ConfigDict


class Body(BaseModel):
    """What every request body shares: an unknown field, a non-finite number where it is not data (NaN or 1e400 as a
    learning rate, a time, a rate) and a value of the wrong JSON type (`true` for an integer, `0` for a boolean, `1.0`
    for a count) are refused with a 422 naming the field, never coerced. A field that takes strings meaning numbers
    (the form's) is parsed with `strict=False`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


def one_of(choices: tuple[str, ...]) -> AfterValidator:
    """A check that the value is one of `choices`, naming them when it is not."""

    def check(value: str) -> str:
        if value not in choices:
            raise ValueError(f"choose one of: {', '.join(choices)} (got {value!r})")
        return value

    return AfterValidator(check)

"""A run's priority: a number, higher first, with three names for the usual ones (low, normal, high)."""

from __future__ import annotations

NAMES = {"low": -100, "normal": 0, "high": 100}
LOWEST, HIGHEST = -1000, 1000
NORMAL = NAMES["normal"]


def parse(value: int | str) -> int:
    """`low`, `normal`, `high` or a whole number from LOWEST to HIGHEST; ValueError saying what is allowed."""
    if isinstance(value, bool):  # a JSON true is an int to Python, and no priority
        raise ValueError("a priority is low, normal, high or a whole number")
    if isinstance(value, str):
        text = value.strip().lower()
        if text in NAMES:
            return NAMES[text]
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{value!r} is no priority: say low, normal, high or a whole number") from None
    if not LOWEST <= value <= HIGHEST:
        raise ValueError(f"a priority is from {LOWEST} to {HIGHEST} (low {NAMES['low']}, high {NAMES['high']})")
    return value


def name(value: int) -> str:
    """How a priority reads: its name where it has one, else its number."""
    return next((word for word, number in NAMES.items() if number == value), str(value))


def refusal(value: int, *, admin: bool, operator_max: int) -> str | None:
    """Why a caller may not give a run this priority (an operator, above the admin's limit); None where they may."""
    if admin or value <= operator_max:
        return None
    return f"an operator may give a priority up to {name(operator_max)}; {name(value)} needs an admin"

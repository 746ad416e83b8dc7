"""A run's option values as the text a person reads and types: the New-run form's fields ("new run like this") and
the compare page's cells. The form's parser (app.web.forms.parse_run_form) reads this text back."""

from __future__ import annotations


def option_text(value: object) -> str:
    """One option's value as the form writes it: a flag as true/false, a mapping as NAME=value lines, a list one
    item a line, none as ""."""
    if isinstance(value, bool):  # what a ticked checkbox posts, and what the form's template checks for
        return "true" if value else "false"
    if isinstance(value, dict):
        return "\n".join(f"{name}={option_text(text)}" for name, text in value.items())
    if isinstance(value, list):
        return "\n".join(option_text(item) for item in value)
    return "" if value is None else str(value)


def as_form_text(run_options: dict[str, object]) -> dict[str, str]:
    """A run's options as the form's strings: the inverse of `parse_run_form`, for "new run from this"."""
    return {name: option_text(value) for name, value in run_options.items()}

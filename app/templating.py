"""Jinja2 for the pages: one template per page, fragments rendered alone from their `{% block %}`s."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi.templating import Jinja2Templates

from app.models import RunStatus

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"


def duration(value: timedelta | float | None) -> str:
    """1h 02m, 3m 07s or 12s: what a person reads at a glance."""
    if value is None:
        return "–"
    seconds = int(value.total_seconds() if isinstance(value, timedelta) else value)
    hours, rest = divmod(max(seconds, 0), 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def timestamp(value: datetime | None) -> str:
    return "–" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def make_templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=TEMPLATES_DIR)  # autoescapes .html templates
    templates.env.filters.update(duration=duration, size=size, timestamp=timestamp)
    templates.env.globals["RunStatus"] = RunStatus
    return templates


def render_block(templates: Jinja2Templates, name: str, block: str, context: dict[str, Any]) -> str:
    """One `{% block %}` of a template, rendered alone: the fragment an htmx swap or an SSE event carries."""
    template = templates.env.get_template(name)
    return "".join(template.blocks[block](template.new_context(context)))

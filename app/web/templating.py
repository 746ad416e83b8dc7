"""Jinja2 for the pages: one template per page, fragments rendered alone from their `{% block %}`s."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from fastapi.templating import Jinja2Templates

from app.core.humanize import duration, metric, size
from app.core.models import RunStatus

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"


def timestamp(value: datetime | None) -> str:
    return "–" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def make_templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=TEMPLATES_DIR)  # autoescapes .html templates
    templates.env.filters.update(duration=duration, metric=metric, size=size, timestamp=timestamp)
    templates.env.globals["RunStatus"] = RunStatus
    return templates


def render_block(templates: Jinja2Templates, name: str, block: str, context: dict[str, Any]) -> str:
    """One `{% block %}` of a template, rendered alone: the fragment an htmx swap or an SSE event carries."""
    template = templates.env.get_template(name)
    return "".join(template.blocks[block](template.new_context(context)))

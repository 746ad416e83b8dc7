"""The runs table's Export: the runs ticked there, as one zip of their points and themselves (app/web/api/export.py)."""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import APIRouter
from fastapi.responses import RedirectResponse

from app.core.errors import FieldInvalid
from app.web.pages.runs_table import FormValues, SelectedRuns

router = APIRouter(include_in_schema=False)


@router.post("/runs/export")
def export_selected(selected: SelectedRuns, values: FormValues) -> RedirectResponse:
    """A GET of the export API, which the browser downloads (a link that can be shared, as Compare's is)."""
    if not selected:
        raise FieldInvalid("run", "run: tick the runs to export")
    output = values.get("format", "parquet")
    if output not in ("parquet", "csv"):
        raise FieldInvalid("format", "format: parquet or csv")
    return RedirectResponse("/api/export?" + urlencode([*(("run", run_id) for run_id in selected),
                                                        ("format", output)]), status_code=303)  # fmt: skip

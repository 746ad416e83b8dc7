"""The pages of the runs table's verbs: tag and note a run, archive it, delete it (after a confirmation that tells
what goes), act on the runs selected in the table, and compare runs."""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.core.errors import FieldInvalid
from app.services import compare, run_deletion, runs, runs_table
from app.web.deps import CallerDep, FoldersDep, SessionDep
from app.web.pages import page
from app.web.params import CompareRuns, RunId

router = APIRouter(include_in_schema=False)
BULK_ACTIONS = ("compare", "tag", "untag", "archive", "unarchive", "delete")
_TAG_SEPARATORS = re.compile(r"[\s,]+")


def _back(values: dict[str, str]) -> str:
    """Where the table was (its own path and query), or the list; never another site."""
    back = values.get("back", "/")
    return back if back.startswith("/") and not back.startswith("//") else "/"


@router.post("/runs/{run_id}/labels")
def label_run(run_id: RunId, db: SessionDep, values: FormValues, caller: CallerDep) -> Response:
    tags = _TAG_SEPARATORS.split(values.get("tags", ""))
    runs_table.label_run(db, run_id=run_id, tags=tags, notes=values.get("notes", ""), archived=None, actor=caller.name)
    return RedirectResponse(f"/runs/{run_id}", status_code=303)


@router.post("/runs/{run_id}/archive")
def archive_run(run_id: RunId, db: SessionDep, values: FormValues, caller: CallerDep) -> Response:
    archived = values.get("archived", "true") == "true"
    runs_table.label_run(db, run_id=run_id, tags=None, notes=None, archived=archived, actor=caller.name)
    return RedirectResponse(f"/runs/{run_id}", status_code=303)


@router.get("/runs/{run_id}/delete", response_class=HTMLResponse)
def delete_page(request: Request, run_id: RunId, db: SessionDep, folders: FoldersDep) -> Response:
    """The confirmation: how many points go, and the size of each of the run's own folders, to tick."""
    deletion = run_deletion.plan(db, run_id=run_id, folders=folders, files=True)
    return page(request, "delete_run.html", {"run": runs.get_run(db, run_id=run_id), "deletion": deletion})


@router.post("/runs/{run_id}/delete")
def delete_run(run_id: RunId, db: SessionDep, folders: FoldersDep, values: FormValues, caller: CallerDep) -> Response:
    files = values.get("files") == "true"
    run_deletion.delete_run(db, run_id=run_id, folders=folders, files=files, actor=caller.name)
    return RedirectResponse("/", status_code=303)


async def posted(request: Request) -> dict[str, str]:
    """The posted form's fields. Not pages.FormValues: an error here is an error page, never the New-run form."""
    return {key: str(value) for key, value in (await request.form()).items()}


FormValues = Annotated[dict[str, str], Depends(posted)]


async def selected_runs(request: Request) -> list[int]:
    """The runs ticked in the table (every `run` field of the posted form)."""
    form = await request.form()
    try:
        return [int(str(value)) for value in form.getlist("run")]
    except ValueError:
        raise FieldInvalid("run", "run: each selected run is a run id") from None


SelectedRuns = Annotated[list[int], Depends(selected_runs)]


@router.post("/runs/bulk")
def bulk(
    db: SessionDep, folders: FoldersDep, selected: SelectedRuns, values: FormValues, caller: CallerDep
) -> Response:
    """Tags, untags, archives, unarchives or deletes the selected runs, then back to the table as it was."""
    action = values.get("action", "")
    if action not in BULK_ACTIONS:
        raise FieldInvalid("action", f"action: one of {', '.join(BULK_ACTIONS)}")
    if action == "compare":  # a GET of its own: the comparison's URL can be shared
        return RedirectResponse("/compare?" + urlencode([("run", run_id) for run_id in selected]), status_code=303)
    if action == "delete":
        if values.get("confirm") != "yes":
            raise FieldInvalid("confirm", f"confirm: tick “I mean it” to delete {len(selected)} runs")
        run_deletion.delete_runs(db, run_ids=selected, folders=folders, actor=caller.name)
    else:
        runs_table.bulk(db, run_ids=selected, action=action, tag=values.get("tag") or None, actor=caller.name)  # type: ignore[arg-type]
    return RedirectResponse(_back(values), status_code=303)


CompareOptions = Annotated[
    Literal["differ", "all"] | None,
    Query(description="The options table: only the rows that differ, or all; default: only those, past 10 rows."),
]


@router.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request, db: SessionDep, run: CompareRuns, options: CompareOptions = None) -> Response:
    """2 to 10 runs: their options side by side, a chart of every metric any of them has, a summary of each."""
    return page(request, "compare.html", {"comparison": compare.compare(db, run_ids=run), "options": options})

"""Export: runs' points and the runs themselves, as Parquet or CSV files, streamed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from app.core.errors import RunNotFound
from app.schemas.export import MEDIA_TYPES, POINT_COLUMNS, RUN_COLUMNS, ExportFormat, ExportTable, documented_file
from app.web.api import documented
from app.web.deps import SessionDep
from app.web.params import INT32_MAX

router = APIRouter(prefix="/api/export", tags=["export"])

ExportRuns = Annotated[
    list[Annotated[int, Query(ge=1, le=INT32_MAX)]],
    Query(min_length=1, max_length=1000, description="The runs, each as `run=<id>`."),
]
FormatParam = Annotated[ExportFormat, Query(alias="format", description="parquet (the default) or csv.")]
_COLUMNS = "; ".join(f"`{name}`: {what}" for name, what in POINT_COLUMNS.items())
_RUN_COLUMNS = "; ".join(f"`{name}`: {what}" for name, what in RUN_COLUMNS.items())


@router.get("", responses={**documented(RunNotFound), **documented_file("runs.<format> and points.<format>, zipped",
                                                                        [MEDIA_TYPES["zip"]])},
            summary="Runs and all their points as one zip: points.parquet and runs.parquet (or .csv)",
            description=f"points: {_COLUMNS}. runs: {_RUN_COLUMNS}.")  # fmt: skip
def export_runs(
    run: ExportRuns, db: SessionDep, request: Request, output: FormatParam = "parquet"
) -> StreamingResponse:
    from app.services import export  # here: pyarrow and numpy load on the first export, not in an idle server

    run_ids = export.checked(db, run_ids=run)
    stream = export.archive(request.app.state.sessions, run_ids=run_ids, form=output)
    return _download(stream, f"rankboard-{_named(run_ids)}.zip", MEDIA_TYPES["zip"])


@router.get("/{table}", responses={**documented(RunNotFound), **documented_file(
                "One table as a file", [MEDIA_TYPES["parquet"], MEDIA_TYPES["csv"]])},
            summary="One table of runs as a file: `points` (every point) or `runs` (each run with its config)",
            description=f"points: {_COLUMNS}. runs: {_RUN_COLUMNS}.")  # fmt: skip
def export_table(
    table: ExportTable, run: ExportRuns, db: SessionDep, request: Request, output: FormatParam = "parquet"
) -> StreamingResponse:
    from app.services import export  # here: pyarrow and numpy load on the first export, not in an idle server

    run_ids = export.checked(db, run_ids=run)
    stream = export.table(request.app.state.sessions, run_ids=run_ids, name=table, form=output)
    return _download(stream, f"rankboard-{_named(run_ids)}-{table}.{output}", MEDIA_TYPES[output])


def _named(run_ids: list[int]) -> str:
    shown = "-".join(map(str, run_ids[:5]))
    return f"runs-{shown}" + (f"-and-{len(run_ids) - 5}-more" if len(run_ids) > 5 else "")


def _download(stream: Iterator[bytes], filename: str, media_type: str) -> StreamingResponse:
    return StreamingResponse(stream, media_type=media_type,
                             headers={"Content-Disposition": f'attachment; filename="{filename}"'})  # fmt: skip

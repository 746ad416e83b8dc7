"""Export: what a download of runs holds, its formats, and how the API documents them.

Two tables, each a file: `points`, one row per stored point of every series of every run asked for, and `runs`,
one row per run with its config. Parquet (typed columns, one row group per read of the store) or CSV (a header,
floats in their shortest exact digits, NaN as `nan`).
"""

from __future__ import annotations

from typing import Any, Literal

ExportFormat = Literal["parquet", "csv"]
ExportTable = Literal["points", "runs"]

# Each table's columns, with what each holds, for the API's description and the tests.
POINT_COLUMNS = {
    "run": "the run's id",
    "key": "the metric's key (loss, gpu/<host>/0/util...)",
    "rank": "the rank that reported it",
    "step": "its step (GPU and host samples: unix seconds)",
    "time": "when it was logged, unix seconds",
    "value": "its value; NaN and infinities as they were logged",
}
RUN_COLUMNS = {
    "run": "the run's id",
    "name": "its name",
    "status": "queued, starting, running, stopping, succeeded, failed, stopped or lost",
    "launcher": "local, slurm or external (launched elsewhere, imported)",
    "created_at": "when it was created (UTC)",
    "started_at": "when it started (UTC)",
    "finished_at": "when it ended (UTC)",
    "step": "the last step it reported",
    "total_steps": "the steps it declared (0: none)",
    "final_loss": "its last loss",
    "world_size": "its ranks, where it said",
    "external_key": "the key a run launched elsewhere, or imported, joins by",
    "tags": "its tags, as a JSON list",
    "notes": "its notes",
    "config": "its config document (options, or what the script or source said), as JSON",
}

MEDIA_TYPES: dict[str, str] = {
    "parquet": "application/vnd.apache.parquet",
    "csv": "text/csv; charset=utf-8",
    "zip": "application/zip",
}


def documented_file(what: str, media_types: list[str]) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI answer of a route that streams a file: its content types, each a binary string."""
    content = {media: {"schema": {"type": "string", "format": "binary"}} for media in media_types}
    return {200: {"description": what, "content": content}}

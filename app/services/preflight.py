"""The preflight check's result (trainer/preflight.py), as the run's rank 0 left it in the run folder: read through
the wire's own reader, answered as the API's `Preflight`."""

from __future__ import annotations

import json

from rankboard import wire
from sqlalchemy.orm import Session

from app.core.folders import RunFolders
from app.core.models import Run
from app.schemas.preflight import Preflight
from app.services import runs

MAX_BYTES = 1_000_000  # a result of thousands of ranks is far less; anything larger was not written by the trainer


def read(run: Run, *, folders: RunFolders) -> Preflight | None:
    """The newest launch's preflight result; None before one (or for a script, which runs none) or if unreadable."""
    path = folders.run_dir(run) / wire.PREFLIGHT_FILE
    try:
        if path.stat().st_size > MAX_BYTES:
            return None
        return Preflight.model_validate(wire.Preflight.from_json(json.loads(path.read_bytes())).to_json())
    except (OSError, ValueError):
        return None


def preflight_of(db: Session, *, run_id: int, folders: RunFolders) -> Preflight | None:
    """`read` for the run with this id; raises RunNotFound."""
    return read(runs.get_run(db, run_id=run_id), folders=folders)

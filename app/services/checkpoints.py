"""A run's checkpoints: listed from their metadata files, inspected safely, deleted on request."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
from rankboard import wire
from sqlalchemy.orm import Session

from app.core.errors import FieldInvalid, NotACheckpoint, PathNotFound, PathOutsideRoot, RunNotActive, RunNotFound
from app.core.folders import RunFolders
from app.core.humanize import size as size_text
from app.core.models import Run
from app.schemas.checkpoints import CheckpointOut, CheckpointRemoval, Deletion, Inspection
from app.schemas.runs import RunCreate
from app.services import storage
from app.store import audit
from app.store import runs as run_store

INSPECT_TIMEOUT_S = 60.0
INSPECT_MAX_RSS = 2 << 30  # bytes; the probe memory-maps tensors, so even a large file needs little


def list_checkpoints(run: Run, *, folders: RunFolders, best_metric: str = "loss") -> list[CheckpointOut]:
    """The run's checkpoints, oldest step first, with the newest and the best by `best_metric` marked.

    Only the small metadata file the trainer writes beside each checkpoint is read, never the checkpoint itself.
    """
    folder = folders.checkpoint_dir(run)
    if not folder.is_dir():
        return []
    prefix = storage.relative_name(folders.shared, folder)  # once: resolving per file costs a realpath
    found = []
    with os.scandir(folder) as entries:
        for entry in entries:
            step = wire.checkpoint_step(entry.name) if entry.name.endswith(".pt") else None
            # Temporary files of a write in progress, and links, are not checkpoints.
            if step is not None and entry.is_file(follow_symlinks=False):
                found.append(_describe(entry, step, f"{prefix}/{entry.name}"))
    found.sort(key=lambda c: c["step"])
    scored = [c for c in found if isinstance(c["metrics"].get(best_metric), float)]
    best = min(scored, key=lambda c: c["metrics"][best_metric], default=None)
    for checkpoint in found:
        checkpoint.update(latest=checkpoint is found[-1], best=checkpoint is best)
    return [CheckpointOut(**c) for c in found]


def get_checkpoint(run: Run, *, name: str, folders: RunFolders, best_metric: str = "loss") -> CheckpointOut:
    """One checkpoint of the run, as listed; raises PathNotFound."""
    found = [c for c in list_checkpoints(run, folders=folders, best_metric=best_metric) if c.name == name]
    if not found:
        raise PathNotFound(f"run {run.id} has no checkpoint {name!r}")
    return found[0]


def _describe(entry: os.DirEntry[str], step: int, path: str) -> dict[str, Any]:
    info = entry.stat(follow_symlinks=False)
    try:
        with open(os.path.join(os.path.dirname(entry.path), wire.sidecar_name(entry.name))) as file:
            sidecar: wire.CheckpointSidecar | None = wire.CheckpointSidecar.from_json(json.load(file))
    except (FileNotFoundError, ValueError):
        # Its metadata is still being written, or was lost: the complete .pt is still a checkpoint one can load.
        sidecar = None
    return {"name": entry.name, "path": path, "size": info.st_size, "step": step,
            "modified": datetime.fromtimestamp(info.st_mtime, timezone.utc),
            "epoch": sidecar.epoch if sidecar else None, "metrics": sidecar.metrics if sidecar else {},
            "reason": sidecar.reason if sidecar else None}  # fmt: skip


def checked_init_from(root: Path, init_from: str) -> str:
    """The checkpoint a new run starts from, as a normalized path in the shared folder; FieldInvalid if unusable."""
    try:
        path = storage.existing(root, init_from, field="init_from")
    except (PathOutsideRoot, PathNotFound) as error:
        raise FieldInvalid("init_from", error.message) from None
    if not path.is_file() or path.suffix != ".pt":
        raise FieldInvalid("init_from", f"{init_from!r} is not a checkpoint file (step-*.pt)")
    return storage.relative_name(root, path)


def projected_size(db: Session, spec: RunCreate, *, folders: RunFolders) -> tuple[int, int, str] | None:
    """(bytes per checkpoint, how many the run keeps, where the size comes from), or None with nothing to go by."""
    if spec.script:
        return None  # a script writes what it wants, where it wants
    by_epoch = math.ceil(spec.epochs / spec.checkpoint_every) if spec.checkpoint_unit == "epoch" else None
    kept = spec.keep_last + spec.keep_best or by_epoch
    if kept is None:
        return None  # every N steps, with no limit: the server does not know a workload's steps per epoch
    if spec.init_from:
        return (folders.shared / spec.init_from).stat().st_size, kept, "the checkpoint it starts from"
    for run in run_store.recent_runs(db, workload=spec.workload, limit=20):
        size = _newest_size(folders.checkpoint_dir(run))
        if size is not None:
            return size, kept, f"run {run.id}'s newest checkpoint"
    return None


def newest_checkpoint(folder: Path) -> str | None:
    """The name of the folder's highest-step checkpoint, found by name alone (no metadata read)."""
    if not folder.is_dir():
        return None
    with os.scandir(folder) as entries:
        named = [(wire.checkpoint_step(e.name), e.name) for e in entries if e.name.endswith(".pt")]
    steps = [(step, name) for step, name in named if step is not None]
    return max(steps)[1] if steps else None


def _newest_size(folder: Path) -> int | None:
    name = newest_checkpoint(folder)
    return (folder / name).stat(follow_symlinks=False).st_size if name else None


def check_disk_room(db: Session, spec: RunCreate, *, folders: RunFolders) -> None:
    """FieldInvalid when the run's checkpoints are projected not to fit, unless it was allowed."""
    projection = projected_size(db, spec, folders=folders)
    free = storage.disk_usage(folders.shared).free
    if projection is None or spec.allow_low_disk or projection[0] * projection[1] <= free:
        return
    each, kept, source = projection
    raise FieldInvalid(
        "allow_low_disk",
        f"its {kept} checkpoints are projected at {size_text(each * kept)} ({size_text(each)} each, from {source}), "
        f"but the shared disk has {size_text(free)} free: keep fewer (keep last), checkpoint less often, free space, "
        "or allow starting anyway",
    )


def removals(run: Run, *, folders: RunFolders) -> list[CheckpointRemoval]:
    """What the retention policy deleted, from the log the trainer keeps beside the checkpoints."""
    log = folders.checkpoint_dir(run) / wire.RETENTION_LOG
    found = []
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            found.append(CheckpointRemoval.model_validate_json(line))
        except ValueError:
            continue  # a line cut short by a crash
    return found


def delete_checkpoints(run: Run, *, names: list[str] | None, dry_run: bool, folders: RunFolders) -> Deletion:
    """Deletes the named checkpoints (all when `names` is None) with their metadata; `dry_run` only tells the cost."""
    checkpoints = {c.name: c for c in list_checkpoints(run, folders=folders)}
    chosen = list(checkpoints) if names is None else names
    for name in chosen:
        if name not in checkpoints:
            raise PathNotFound(f"run {run.id} has no checkpoint {name!r}")
        if checkpoints[name].latest and not run.status.is_final:
            raise RunNotActive(f"{name} is the newest checkpoint of run {run.id}, which is still going")
    freed = sum(checkpoints[name].size for name in chosen)
    if not dry_run:
        folder = folders.checkpoint_dir(run)
        for name in chosen:
            (folder / name).unlink(missing_ok=True)
            (folder / wire.sidecar_name(name)).unlink(missing_ok=True)
    return Deletion(files=chosen, freed=freed, deleted=not dry_run)


def delete_run_checkpoints(
    db: Session, *, run_id: int, names: list[str] | None, dry_run: bool, folders: RunFolders, actor: str
) -> tuple[Run, Deletion]:
    """`delete_checkpoints` of a run by its id, and in its audit trail who deleted which (a dry run deletes none)."""
    with db.begin():
        run = run_store.get_run(db, run_id)
        if run is None:
            raise RunNotFound(run_id)
        deletion = delete_checkpoints(run, names=names, dry_run=dry_run, folders=folders)
        if deletion.deleted and deletion.files:
            audit.record(db, actor=actor, action="deleted checkpoints", run_id=run_id, detail=", ".join(deletion.files))
    return run, deletion


def inspect(root: Path, relative: str) -> Inspection:
    """Keys, tensors and parameter count of a checkpoint, loaded safely in a child bounded in time and memory."""
    path = storage.existing(root, relative)
    if not path.is_file():
        raise NotACheckpoint(f"{relative!r} is a folder, not a checkpoint file")
    probe = [sys.executable, "-m", "app.services.checkpoint_probe", str(path)]
    child = subprocess.Popen(probe, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    started = time.monotonic()
    while True:
        try:
            out, _ = child.communicate(timeout=0.1)
            break
        except subprocess.TimeoutExpired:
            _within_bounds(child, started, relative)
    report = json.loads(out) if child.returncode == 0 else {"error": f"the loader failed (exit {child.returncode})"}
    if "error" in report:
        raise NotACheckpoint(f"{relative}: {report['error']}")
    return Inspection(path=relative, size=path.stat().st_size, **report)


def _within_bounds(child: subprocess.Popen[bytes], started: float, relative: str) -> None:
    """Kills the probe and says why, when it runs too long or takes too much memory."""
    if time.monotonic() - started > INSPECT_TIMEOUT_S:
        reason = f"loading took longer than {INSPECT_TIMEOUT_S:.0f} s"
    elif _rss(child.pid) > INSPECT_MAX_RSS:
        reason = f"loading needed more than {INSPECT_MAX_RSS >> 30} GiB of memory"
    else:
        return
    child.kill()
    child.communicate()
    raise NotACheckpoint(f"{relative}: {reason}; not inspected")


def _rss(pid: int) -> int:
    """The process's resident memory in bytes; 0 once it is gone."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0

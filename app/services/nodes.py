"""What a run's nodes and ranks say about themselves on their batches: GPU inventories, and the ranks' heartbeats as
read back (ingest writes them: app.services.metrics)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.core.errors import RunNotFound
from app.core.models import Run
from app.schemas.health import RankOut
from app.schemas.metrics import NodeIn
from app.store import ranks as rank_store
from app.store import runs as run_store


def record(db: Session, *, run: Run, node: NodeIn) -> None:
    """Keeps a node's inventory in `run.gpus` (one entry per host); inside ingest's transaction."""
    # Two nodes' batches may land at once: lock the row, or one node's inventory would overwrite the other's.
    run_store.reread_locked(db, run, "gpus")
    run.gpus = merge_node(run.gpus, node.model_dump())


def ranks(db: Session, *, run_id: int) -> list[RankOut]:
    """The run's ranks by number, each with its last heartbeat; raises RunNotFound."""
    if run_store.get_run(db, run_id) is None:
        raise RunNotFound(run_id)
    return [RankOut.model_validate(row) for row in rank_store.rank_rows(db, run_id=run_id)]


def merge_node(nodes: list[dict[str, object]] | None, node: dict[str, object]) -> list[dict[str, object]]:
    """The run's nodes with `node` in place of the one of the same host, sorted by host."""
    others = [known for known in nodes or [] if known.get("host") != node["host"]]
    return sorted([*others, node], key=lambda known: str(known.get("host")))

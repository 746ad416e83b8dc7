"""What the ranks' own reports say went wrong, and where: the first non-finite loss (trainer/watch.py reports it as
points under wire.NONFINITE_*_KEY), read back for the run page and the API in the same words as the trainer's log."""

from __future__ import annotations

import math

from sqlalchemy.orm import Session, object_session

from app.models import Run
from app.schemas import FindingsOut, NonFiniteOut
from app.services import runs
from app.store import metrics as metric_store
from trainer import wire

MAX_RANKS_NAMED = 64


def run_findings(db: Session, *, run_id: int) -> FindingsOut:
    """The findings of the run with this id; raises RunNotFound."""
    return findings(db, run=runs.get_run(db, run_id=run_id))


def findings(db: Session, *, run: Run) -> FindingsOut:
    """Everything found about the run's ranks so far."""
    return FindingsOut(nonfinite=nonfinite(db, run=run))


def loaded_run_findings(run: Run) -> FindingsOut:
    """`findings` for a run still attached to the session that loaded it (a page's)."""
    db = object_session(run)
    return FindingsOut(nonfinite=None) if db is None else findings(db, run=run)


def nonfinite(db: Session, *, run: Run) -> NonFiniteOut | None:
    """Where the loss (or the gradient norm) first became NaN or infinite, and on which ranks; None while finite."""
    losses = _first_step(db, run=run, key=wire.NONFINITE_LOSS_KEY)
    norms = _first_step(db, run=run, key=wire.NONFINITE_GRAD_NORM_KEY)
    if not losses and not norms:
        return None
    norm_step = norms[0].step if norms else None
    norm = _word(norms[0].value) if norms else ""
    if not losses:
        sentence = f"gradient norm became {norm} at step {norm_step:,} (the loss still finite)"
        return NonFiniteOut(step=None, ranks=[], grad_norm_step=norm_step, sentence=sentence)
    step, ranks = losses[0].step, [point.rank for point in losses]
    sentence = wire.nonfinite_sentence(step, ranks, _word(losses[0].value), norm_step, norm)
    return NonFiniteOut(step=step, ranks=ranks, grad_norm_step=norm_step, sentence=sentence)


def _first_step(db: Session, *, run: Run, key: str) -> list[metric_store.StoredPoint]:
    points = metric_store.points_in_range(
        db, run_id=run.id, key=key, start_step=0, start_rank=0, end_step=None, limit=MAX_RANKS_NAMED
    )
    return [point for point in points if point.step == points[0].step]


def _word(value: float | None) -> str:
    return wire.number_word(math.nan if value is None else value)  # the store keeps NaN as NULL

"""What the communication share reads: each rank's recent per-step timings."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.store import chunks
from app.store.metrics import SERIES


def recent_means(db: Session, *, run_id: int, keys: Sequence[str], steps: int) -> dict[tuple[str, int], float]:
    """{(key, rank): mean} of each series over its last `steps` steps (from its newest point back), NaN left out."""
    import numpy as np  # on first use, not at the server's start (app.store.chunks)

    series = db.execute(select(SERIES.c.id, SERIES.c.key).where(SERIES.c.run_id == run_id, SERIES.c.key.in_(keys)))
    means = {}
    for series_id, key in series.all():
        newest = chunks.newest(db, series_id=series_id)
        if not len(newest):
            continue
        top = int(newest.steps[-1])
        points = chunks.read(db, series_id=series_id, first=top - steps + 1, last=top)
        for rank in np.unique(points.ranks).tolist():
            values = points.values[(points.ranks == rank) & ~np.isnan(points.values)]
            if len(values):
                means[(key, rank)] = float(values.mean())
    return means

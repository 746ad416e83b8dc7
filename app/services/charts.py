"""Charts: one series of one run, downsampled to what a chart of a given width can show."""

from __future__ import annotations

import itertools
import operator

from sqlalchemy.orm import Session

from app.core.errors import FieldInvalid, SeriesNotFound
from app.schemas.metrics import ChartOut, ChartRankOut
from app.services import runs
from app.store import charts as chart_store
from app.store import chunks
from app.store import metrics as metric_store
from app.store.charts import Bucket


def chart(
    db: Session,
    *,
    run_id: int,
    key: str,
    start_step: int | None,
    end_step: int | None,
    width: int,
    rank: int | None,
) -> ChartOut:
    """Min, max, last value and its time per bucket and rank over [start_step, end_step], by default the series'
    whole range.

    At most `width` buckets per rank, and one per step when the range has no more steps than that, so zooming in
    ends at the raw points. The default start is the series' first step, not 0: GPU series count steps in unix
    seconds, and from 0 all of their points would fall in the last bucket. See app.store.charts.plan for the layout.
    """
    if start_step is not None and end_step is not None and end_step < start_step:
        raise FieldInvalid("end_step", f"end_step ({end_step}) must not be before start_step ({start_step})")
    with db.begin():
        runs.get_run(db, run_id=run_id)
        series_id = metric_store.find_series(db, run_id=run_id, key=key)
        if series_id is None:
            raise SeriesNotFound(run_id, key, metric_store.series_keys(db, run_id=run_id))
        first, last = chunks.step_range(db, series_id=series_id) or (0, 0)
        if start_step is None:
            start_step = first if end_step is None else min(first, end_step)
        # A range past the last point is a chart with nothing in it yet, not a mistake.
        end_step = max(start_step, last) if end_step is None else end_step
        plan = chart_store.plan(start_step=start_step, end_step=end_step, width=width)
        buckets = chart_store.buckets(db, series_id=series_id, chart=plan, rank=rank)
    return ChartOut(
        key=key, start_step=start_step, end_step=end_step, bucket_steps=plan.bucket_steps, ranks=_by_rank(buckets)
    )


def _by_rank(buckets: list[Bucket]) -> dict[str, ChartRankOut]:
    """The buckets, which come by rank then step, as one model per rank (a model per bucket cost 4 ms a chart)."""
    ranks: dict[str, ChartRankOut] = {}
    for rank, group in itertools.groupby(buckets, key=operator.attrgetter("rank")):
        rows = list(group)
        ranks[str(rank)] = ChartRankOut(
            step=[b.step for b in rows],
            min=[b.min for b in rows],
            max=[b.max for b in rows],
            last=[b.last for b in rows],
            time=[b.time for b in rows],
        )
    return ranks

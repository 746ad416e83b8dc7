"""Charts: one series of one run, downsampled to what a chart of a given width can show."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.core.errors import FieldInvalid, SeriesNotFound
from app.schemas.metrics import ChartOut, ChartRankOut
from app.services import runs
from app.store import charts as chart_store
from app.store import metrics as metric_store
from app.store.charts import Buckets


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
        found = chart_store.chart_series(db, run_id=run_id, key=key)
        if found is None:
            runs.get_run(db, run_id=run_id)
            raise SeriesNotFound(run_id, key, metric_store.series_keys(db, run_id=run_id))
        series_id, (first, last) = found[0], found[1] or (0, 0)
        if start_step is None:
            start_step = first if end_step is None else min(first, end_step)
        # A range past the last point is a chart with nothing in it yet, not a mistake.
        end_step = max(start_step, last) if end_step is None else end_step
        plan = chart_store.plan(start_step=start_step, end_step=end_step, width=width)
        buckets = chart_store.buckets(db, series_id=series_id, chart=plan, rank=rank, last_step=last)
    # Built without validation: the values come from the store, and checking each of a chart's 5,000 numbers again
    # took longer than reading them. FastAPI writes it with the model's serializer (MetricValue's "NaN" included).
    return ChartOut.model_construct(key=key, start_step=start_step, end_step=end_step,
                                    bucket_steps=plan.bucket_steps, ranks=_by_rank(buckets))  # fmt: skip


def _by_rank(buckets: Buckets) -> dict[str, ChartRankOut]:
    """The buckets, which come by rank then step, as one model per rank."""
    return {
        str(rank): ChartRankOut.model_construct(
            step=part.steps.tolist(),
            min=part.mins.tolist(),
            max=part.maxs.tolist(),
            last=part.lasts.tolist(),
            time=part.times.tolist(),
        )
        for rank, part in buckets.by_rank()
    }

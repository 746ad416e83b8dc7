"""What a URL may carry: every number and name a route takes, with its bounds, declared once for every route.

Past these bounds a value would fail deep inside instead (SQLite refuses integers beyond 64 bits with an
OverflowError; PostgreSQL's INTEGER columns hold 32 bits; a file name is at most 255 bytes): here it is a 422 that
names the parameter, and the OpenAPI document shows each bound. Paths into the shared folder are bounded once more
where they are resolved (app.services.storage), since a body field can name one too.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Header, Path, Query
from pydantic import StringConstraints
from rankboard import wire

from app.services.logs import LAUNCHER
from app.services.storage import NAME_MAX, PATH_MAX

INT32_MAX = 2**31 - 1  # an INTEGER column on PostgreSQL: run ids
INT64_MAX = 2**63 - 1  # a BIGINT (metric point ids), and what SQLite, LIMIT and OFFSET take

RunId = Annotated[int, Path(ge=1, le=INT32_MAX, description="The run's id.")]
FromRun = Annotated[int | None, Query(ge=1, le=INT32_MAX, description="The run whose options fill the form.")]

Offset = Annotated[int, Query(ge=0, le=INT64_MAX, description="How many to skip.")]
RunsLimit = Annotated[int, Query(ge=1, le=500, description="How many to list.")]
PageNumber = Annotated[int, Query(ge=1, le=INT32_MAX, description="The page of the list, from 1.")]

StartStep = Annotated[int, Query(ge=0, le=wire.MAX_STEP, description="The first step; the last page's next_step.")]
StartRank = Annotated[
    int, Query(ge=0, le=wire.MAX_RANK, description="The first rank of start_step; the last page's next_rank.")
]
EndStep = Annotated[int | None, Query(ge=0, le=wire.MAX_STEP, description="The last step; default: the last.")]
ChartStart = Annotated[int | None, Query(ge=0, le=wire.MAX_STEP, description="Default: the series' first step.")]
ChartEnd = Annotated[int | None, Query(ge=0, le=wire.MAX_STEP, description="Default: the series' last step.")]
SeriesLimit = Annotated[int, Query(ge=1, le=100_000, description="Points on a page.")]
Width = Annotated[int, Query(ge=1, le=4000, description="The chart's width in pixels.")]
RankFilter = Annotated[int | None, Query(ge=0, le=wire.MAX_RANK, description="Default: every rank.")]
MetricKey = Annotated[str, Path(min_length=1, max_length=wire.MAX_KEY_LENGTH, description="The metric, e.g. loss.")]
MetricKeyQuery = Annotated[
    str, Query(min_length=1, max_length=wire.MAX_KEY_LENGTH, description="The metric, e.g. loss.")
]

# Point ids are a BIGINT: the live page's cursor, given as `after` or, on a reconnect, as the SSE Last-Event-ID.
After = Annotated[int, Query(ge=0, le=INT64_MAX, description="The page's newest point id when it loaded.")]
LastEventId = Annotated[int | None, Header(ge=0, le=INT64_MAX, description="The last point id received.")]
StreamParts = Annotated[
    Literal["all", "points", "fragments"],
    Query(description="What the stream sends: points and fragments, or only one of them (the run page opens one "
                      "stream of each: its points' stream follows the charts it has built)."),
]  # fmt: skip
Watch = Annotated[
    list[Annotated[str, StringConstraints(max_length=wire.MAX_KEY_LENGTH)]] | None,
    Query(max_length=2000, description="Send only these keys' points, and of the others only their names (`others`: "
                                       "a page sees a new key, or news of a chart it has not built); `watch=` alone "
                                       "follows none. Default: every key's points."),
]  # fmt: skip

CheckpointName = Annotated[str, Path(min_length=1, max_length=NAME_MAX, description="A file name: step-*.pt.")]
CheckpointNames = Annotated[
    list[Annotated[str, StringConstraints(max_length=NAME_MAX)]] | None,
    Query(max_length=10_000, description="Checkpoint file names; none means all."),
]
SharedPath = Annotated[str, Query(max_length=PATH_MAX, description="Relative to the shared folder, '/'-separated.")]
InitFrom = Annotated[str, Query(max_length=1000, description="A checkpoint in the shared folder to start from.")]

RANK_PATTERN = rf"^({LAUNCHER}|[0-9]{{1,6}})$"
LogRank = Annotated[str, Path(pattern=RANK_PATTERN, description="A rank number, or `launcher` for torchrun's own.")]
LogStream = Annotated[Literal["stdout", "stderr"], Path(description="Which of the rank's outputs.")]
LogRankQuery = Annotated[str, Query(pattern=RANK_PATTERN, description="A rank number, or `launcher`.")]
LogStreamQuery = Annotated[Literal["stdout", "stderr"], Query(description="Which of the rank's outputs.")]
LogLines = Annotated[int, Query(ge=1, le=5000, description="How many of the last lines.")]
OutputLines = Annotated[int, Query(ge=1, le=1000, description="How many of the last lines of each.")]
LogFilter = Annotated[str, Query(max_length=200, description="Case-insensitive substring.")]

UserName = Annotated[str, Path(min_length=1, max_length=64, description="A user's name.")]
LimitUser = Annotated[
    str,
    Path(
        pattern=r"^(\*|[A-Za-z0-9][A-Za-z0-9._@-]{0,63})$",
        description="A user's name; `*`: every user without a limit of their own.",
    ),
]
GroupName = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", description="A group's name.")]
TokenId = Annotated[int, Path(ge=1, le=INT32_MAX, description="An API token's id, from the list of tokens.")]
NextPage = Annotated[str, Query(max_length=2000, description="Where to go after logging in: a path of this server.")]

# The runs table's view (app.store.runs_table_query): each a string the table's URL carries as the user typed it.
Search = Annotated[
    str,
    Query(
        max_length=500,
        description="Words each found in a run's name, tags, status, workload, script, launcher or creator (any case).",
    ),
]
Filter = Annotated[
    str,
    Query(
        max_length=2000,
        description="Conditions joined by `;` or `and`: `lr < 1e-3; val_loss.min < 0.5` (a metric's last, min or max).",
    ),
]
Sort = Annotated[str, Query(max_length=300, description="A field or metric.last|min|max; `-` first: descending.")]
Columns = Annotated[str, Query(max_length=3000, description="Extra columns, comma-separated: fields and metric.stat.")]
ArchivedView = Annotated[
    Literal["hide", "only", "all"], Query(description="Archived runs: hidden (default), only them, or all.")
]
CompareRuns = Annotated[list[Annotated[int, Query(ge=1, le=INT32_MAX)]], Query(description="2 to 10 run ids.")]

"""Every GET the server answers (pages, htmx fragments, SSE streams, the API), walked with a run in each state a
user meets and with stores of 0, 1 and 1,000 runs. The routes come from the app's own router table, so a new route is
walked without anyone remembering to add it: it needs only a way to fill its parameters (FILL) and what a user expects
from it (EXPECT), and the walk fails saying so until it has them. Fragments are asked for with the headers the pages
send (HX-Request and the HX-Target of the element htmx swaps, or the header static/run.js sets); of a stream, the
first event is read and the connection closed, as a page that moves on does."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from markupsafe import escape
from rankboard import wire

from app.core.models import RunStatus
from app.core.settings import Settings
from app.main import create_app
from tests.run_states import (
    ELSEWHERE,
    SCRIPT,
    STATES,
    UNSTARTED,
    WAITING,
    Seeded,
    bulk_runs,
    seed_states,
    supervisor_has_seen,
)

HISTORY = 1000
BAD_FILTER = "loss <"  # a condition without its value: said at the box, not an error page
PAGE_SIZE = 25  # app.web.pages.runs.PAGE_SIZE, as the user counts rows
HX = {"HX-Request": "true"}


@dataclass
class Store:
    """A server with a store of runs: the seeded ones by state, and every run's (id, name, status), newest first."""

    name: str
    client: TestClient
    seeded: dict[str, Seeded]
    runs: list[tuple[int, str, RunStatus]] = field(default_factory=list)

    @property
    def checkpoint_path(self) -> str | None:
        return next((run.checkpoint_path for run in self.seeded.values() if run.checkpoint_path), None)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Store]]:
    """Three servers: no run; one running run; the runs of every state after 1,000 older ones."""
    with ExitStack() as stack:
        made = {}
        for name, states, history in (("empty", (), 0), ("one", ("running",), 0), ("many", tuple(STATES), HISTORY)):
            root = tmp_path_factory.mktemp(name)
            settings = Settings(data_dir=root / "data", shared_dir=root / "shared", supervise_interval_s=3600, slots=2)
            client = stack.enter_context(TestClient(create_app(settings)))
            app: Any = client.app
            bulk_runs(app.state.sessions, history)
            seeded = seed_states(client, app.state.sessions, settings.shared, states=states) if states else {}
            app.state.supervisor.tick()  # records the restart and the stall, as the supervisor does
            assert not states or supervisor_has_seen(client, seeded)
            listed = client.get("/api/runs", params={"limit": 500}).json()["items"]
            store = Store(name, client, seeded)
            offset = 0
            while listed:
                store.runs += [(run["id"], run["name"], RunStatus(run["status"])) for run in listed]
                offset += len(listed)
                listed = client.get("/api/runs", params={"limit": 500, "offset": offset}).json()["items"]
            made[name] = store
        yield made


# --- the router table -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    path: str  # the path format: /api/runs/{run_id}/metrics/{key}
    params: tuple[str, ...]  # path parameters, then required query parameters


def required_query(dependant: Dependant) -> list[str]:
    own = [param.alias for param in dependant.query_params if param.field_info.is_required()]
    return own + [name for sub in dependant.dependencies for name in required_query(sub)]


def get_routes(app: FastAPI) -> list[Route]:
    """Every GET route of the app (its static files are checked through the pages that link them)."""
    found = []
    for route in iter_route_contexts(app.routes):
        if "GET" not in (route.methods or ()) or route.path_format is None:
            continue
        dependant = getattr(route, "dependant", None)
        query = required_query(dependant) if dependant is not None else []
        found.append(Route(route.path_format, (*route.param_convertors, *query)))
    return found


# --- how to fill each parameter, and what a user expects from each route -----------------------------------------

# By parameter name: the value for a run of the store (None: this store or run has none, so the walk asks for what
# the pages would link once there is one, and expects a 404 naming it). A route with `run_id` is walked once per run.
Fill = Callable[[Store, Seeded | None], str | None]
FILL: dict[str, Fill] = {
    "run_id": lambda store, run: str(run.id) if run else None,
    "key": lambda store, run: "rank/step_ms" if run and run.state not in UNSTARTED else None,
    "name": lambda store, run: run.checkpoint if run else None,
    "rank": lambda store, run: "1" if run and run.has_logs else None,
    "stream": lambda store, run: "stderr" if run and run.has_logs else None,
    "path": lambda store, run: store.checkpoint_path,
    # /compare's runs: the walk's variants name 2 to 10 of them; with fewer in the store, a 422 saying how many.
    "run": lambda store, run: str(store.runs[0][0]) if len(store.runs) >= 2 else None,
    "table": lambda store, run: "points",  # /api/export/{table}: `runs` is the zip's other half
}
MISSING = {"key": "rank/step_ms", "name": wire.checkpoint_name(40), "rank": "1", "stream": "stderr",
           "path": "checkpoints/run-1/step-00000040.pt", "run": "1"}  # fmt: skip


@dataclass
class Answer:
    """One request of the walk and what came back (`event`: a stream's first event and its data)."""

    store: Store
    run: Seeded | None
    query: dict[str, str]
    response: httpx.Response
    missing: bool  # a parameter named something the run or store lacks
    event: tuple[str, str] | None = None

    @property
    def text(self) -> str:
        return self.response.text

    def json(self) -> Any:
        return json.loads(self.text)

    @property
    def seeded(self) -> Seeded:
        assert self.run is not None
        return self.run


def shows_run(answer: Answer) -> None:
    """A page or fragment about a run: its name, its status, and what happened to it last."""
    run = answer.seeded
    assert answer.response.headers["content-type"].startswith("text/html")
    assert str(escape(run.name)) in answer.text and f">{run.status.value}</span>" in answer.text
    assert str(escape(run.says)) in answer.text, f"{run.state}: {run.says!r} not on the page"


def run_page(answer: Answer) -> None:
    run = answer.seeded
    if answer.query.get("_target") == "charts":  # static/run.js asks for the charts alone when a new key arrives
        assert answer.text.lstrip().startswith('<section id="charts"') and "<html" not in answer.text
        assert ('id="loss-box"' in answer.text) == (run.state not in UNSTARTED)
        return
    shows_run(answer)
    assert f'sse-connect="/runs/{run.id}/stream?parts=fragments"' in answer.text  # status, files, forensics
    assert f'data-stream="/runs/{run.id}/stream?parts=points&amp;after=' in answer.text  # the charts' points
    # One logs panel, fetched once the page is up (none of a run launched elsewhere: its output is where it ran);
    # no second copy of each rank's output.
    assert (f'hx-get="/runs/{run.id}/logs"' in answer.text) == (run.state != ELSEWHERE)
    assert 'id="rank-output"' not in answer.text and "Output of each rank" not in answer.text
    if run.state not in UNSTARTED:
        assert 'id="step-time-box"' in answer.text and 'id="gpu-util-box"' in answer.text
    fits_the_run(answer)
    in_order(answer)
    if run.has_logs and run.state not in UNSTARTED:
        assert f"<code>{run.checkpoint}</code>" in answer.text
    if run.state == ELSEWHERE:  # what its job said of itself, and where its output is
        assert "<code>torchrun:walk-job</code>, 2 ranks" in answer.text and "<code>llama-7b</code>" in answer.text
        assert "its output is where its job runs" in answer.text
    if run.state == "not progressing":  # told once, live, in the box (not again, frozen, in the reason line)
        assert 'id="health"' in answer.text and "Not progressing" in answer.text
        assert '<p class="reason">not progressing' not in answer.text
    # An ETA only while it trains and moves (and declared a total); no time counted while it waits to be launched.
    assert ("<dt>ETA</dt><dd>–</dd>" in answer.text) != (run.state in ("running", "restarted", ELSEWHERE, SCRIPT))
    assert ("<dt>Elapsed</dt><dd>–</dd>" in answer.text) == (run.status == RunStatus.queued)
    if run.status.is_final:
        assert 'id="final-loss">0.0500<' in answer.text
    if run.state in ("stopped", "failed", "lost"):
        assert "Resume from step 40" in answer.text
    # The explanation sits with the logs, far down: a failed or lost run links to it from its status.
    assert ('<a href="#explain">What went wrong</a>' in answer.text) == (run.state in ("failed", "lost"))
    assert 'id="run-alerts"' not in answer.text  # no alert was sent: no Alerts section, no empty table
    dump_on_page(answer)
    assert 'id="goodput"' in answer.text and "<strong>Goodput " in answer.text  # from the moment it is queued
    # None of the walk's runs sent a goodput ledger: once launched, their time is not itemized and has no figure.
    assert ("<strong>Goodput not itemized</strong>" in answer.text) == (run.state not in WAITING)
    if run.live:
        assert ("Stopping…</button>" if run.status == RunStatus.stopping else "Stop</button>") in answer.text


def in_order(answer: Answer) -> None:
    """The page in the order a user reads it: status and progress, charts, checkpoints, logs, forensic panels."""
    text = answer.text
    parts = ['id="run-status"', 'id="progress"' if "<progress" in text else 'id="step"', 'id="charts"',
             'id="run-files"', 'id="logs"', 'id="run-forensics"']  # fmt: skip
    at = [text.index(part) for part in parts]
    assert at == sorted(at), (answer.seeded.state, parts)


def fits_the_run(answer: Answer) -> None:
    """The header shows what the run declared and reports, and offers what applies to its kind."""
    run, text = answer.seeded, answer.text
    if run.state == SCRIPT:  # it logs steps, a step a second; it declared no epoch, total or rate
        assert '<dd id="step">40</dd>' in text and '<dt>Steps/s</dt><dd id="throughput">1</dd>' in text
        assert "<progress" not in text and 'id="epoch"' not in text and "<dt>ETA</dt>" not in text
    elif run.state == ELSEWHERE:  # it reported its epoch, its total and its samples a second, through progress
        assert '<dd id="epoch">2</dd>' in text and '<dd id="step">40 of 100 (40.0%)</dd>' in text
        assert '<progress id="progress" max="100" value="40">' in text and "<dt>Samples/s</dt>" in text
    elif run.state not in UNSTARTED:
        progress = "100 of 100 (100.0%)" if run.state == "succeeded" else "40 of 100 (40.0%)"
        assert f'<dd id="step">{progress}</dd>' in text and '<dd id="epoch">' in text
    else:  # the built-in trainer holds the places of what it will declare
        assert '<dd id="step">0 of ?</dd>' in text and '<dd id="epoch">0 of 5</dd>' in text
    sweeps = run.state not in (SCRIPT, ELSEWHERE, "queued in Slurm")  # a built-in workload, on this host
    assert ("Scaling sweep</button>" in text) == sweeps
    # "New run like this" starts what the server started; of a run launched elsewhere, it says why it cannot.
    assert ('id="clone"' in text) == (run.state != ELSEWHERE)
    assert ("launched elsewhere, and Rankboard does not know its command" in text) == (run.state == ELSEWHERE)


def logs_panel(answer: Answer) -> None:
    run = answer.seeded
    assert "<html" not in answer.text and 'id="log-lines"' in answer.text and ">rank 1</option>" in answer.text
    if run.state == "failed":  # opened on the log of the rank that failed, where the error is
        assert "What went wrong" in answer.text and "loss is NaN at step 40" in answer.text
        assert '<option value="1" selected>rank 1</option>' in answer.text
        assert '<option value="stderr" selected>stderr</option>' in answer.text


def first_event(*expected: str) -> Callable[[Answer], None]:
    def check(answer: Answer) -> None:
        assert answer.response.headers["content-type"].startswith("text/event-stream")
        assert answer.event is not None and answer.event[0] in expected, (answer.seeded.state, answer.event)

    return check


def run_stream(answer: Answer) -> None:
    first_event("points", "status")(answer)
    assert answer.event is not None
    kind, data = answer.event
    if answer.seeded.state in UNSTARTED:
        assert kind == "status" and str(escape(answer.seeded.name)) in data
    else:
        assert kind == "points" and json.loads(data)["series"]["loss"]["steps"][-1] == 40


def log_stream(answer: Answer) -> None:
    if not answer.seeded.has_logs:  # nothing started it here, or not yet
        assert answer.response.headers["content-type"].startswith("text/event-stream") and answer.event is None
        return
    first_event("reset")(answer)
    assert answer.event is not None
    lines = json.loads(answer.event[1])["lines"]
    if answer.seeded.state == "failed":
        assert lines[-1] == "ValueError: loss is NaN at step 40"
    elif answer.seeded.state == "starting":
        assert lines == []  # its files exist, still empty
    else:
        assert lines == ["rank 1 warning: the data loader is slow"]


def not_found(what: str) -> Callable[[Answer], None]:
    """A 404 naming what is missing, for a run or store that has none of it."""

    def check(answer: Answer) -> None:
        assert answer.response.status_code == 404, (answer.response.status_code, answer.text[:300])
        assert what in answer.text, answer.text[:300]

    return check


def runs_list(answer: Answer) -> None:
    """The table of the store's runs: the ones of this page (and status), or what to do when there is none."""
    if answer.query.get("filter") == BAD_FILTER:  # said at its box, as typed; the table shows the runs without it
        assert answer.response.status_code == 422 and "<h1>Runs" in answer.text
        assert 'id="e-filter"' in answer.text and "has no value after &lt;" in answer.text
        assert 'value="loss &lt;"' in answer.text and 'aria-invalid="true"' in answer.text
        rows = re.findall(r'<td><a href="/runs/(\d+)">', answer.text)
        assert [int(row) for row in rows] == [run[0] for run in answer.store.runs[:PAGE_SIZE]]
        return
    if "filter" in answer.query:  # tests/app/test_runs_table.py checks what a view finds; here, that it shows
        assert answer.response.status_code == 200
        if not answer.store.seeded:
            assert "No run matches" in answer.text
            return
        some = "walk failed" if "failed" in answer.store.seeded else "walk running"
        assert some in answer.text and "walk queued" not in answer.text  # a run without a loss matches nothing
        assert all(f">{column}" in answer.text for column in answer.query["columns"].split(","))
        return
    status = answer.query.get("status")
    matching = [run for run in answer.store.runs if status is None or run[2].value == status]
    page = int(answer.query.get("page_number", "1"))
    shown = matching[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
    rows = re.findall(r'<td><a href="/runs/(\d+)">', answer.text)
    assert [int(row) for row in rows] == [run[0] for run in shown]
    for run_id, name, run_status in shown:
        row = answer.text.partition(f'<a href="/runs/{run_id}">')[2].partition("</tr>")[0]
        assert row.startswith(f"{escape(name)}</a>") and f"status-{run_status.value}" in row
        duration = re.findall(r'<td class="col-duration">(.*?)</td>', row)[0]
        assert (duration == "–") == (run_status == RunStatus.queued), (name, duration)  # waiting: no time counts
        stalled = name == "walk not progressing"  # the list says which live run stopped moving
        assert ('class="status status-stalled"' in row) == stalled, (name, row)
    if answer.query.get("_target") == "runs-table":
        assert answer.text.lstrip().startswith('<div id="runs-table"') and "<html" not in answer.text
    if not answer.store.runs and not status:
        assert "No runs yet" in answer.text and "Start the demo run" in answer.text
    elif not matching:
        assert f"No {status} runs" in answer.text
    if len(matching) > PAGE_SIZE:
        pages = -(-len(matching) // PAGE_SIZE)
        assert f"Page {page} of {pages} ({len(matching)} runs)" in answer.text


def compare_page(answer: Answer) -> None:
    """Each run's name, the options side by side, a chart for each metric any of them has."""
    if answer.missing:
        assert answer.response.status_code == 422 and "compare 2 to 10 different runs" in answer.text
        return
    compared = [int(run_id) for run_id in answer.query["run"]]
    names = {run_id: name for run_id, name, _status in answer.store.runs}
    assert all(str(escape(names[run_id])) in answer.text for run_id in compared)
    assert 'id="compare-options"' in answer.text and "<th>lr</th>" in answer.text
    started = [run for run in answer.store.seeded.values() if run.id in compared and run.state not in UNSTARTED]
    assert ("data-chart=" in answer.text) == bool(started), answer.text[-2000:]


def compare_api(answer: Answer) -> None:
    """The compare page's content as JSON: the runs in the order asked for, their options, every metric any has."""
    if answer.missing:
        assert answer.response.status_code == 422 and "compare 2 to 10 different runs" in answer.text
        return
    body = answer.json()
    assert [run["id"] for run in body["runs"]] == [int(run_id) for run_id in answer.query["run"]]
    assert all(len(row["values"]) == len(body["runs"]) for row in body["options"])
    assert all(len(metric["last"]) == len(body["runs"]) for metric in body["metrics"])


def export_files(answer: Answer) -> None:
    """The runs asked for as a zip of both tables, or one table as a file; a run the store lacks is a 404."""
    asked = answer.query["run"] if isinstance(answer.query["run"], list) else [answer.query["run"]]
    if not {int(run_id) for run_id in asked} <= {run[0] for run in answer.store.runs}:
        assert answer.response.status_code == 404 and f"run {asked[0]}" in answer.text.lower()
        return
    body, zipped = answer.response.content, answer.response.headers["content-type"] == "application/zip"
    table = b'"run"' if answer.query.get("format") == "csv" else b"PAR1"  # a CSV's header, or Parquet's magic
    assert body.startswith(b"PK" if zipped else table), body[:20]


def delete_page(answer: Answer) -> None:
    run = answer.seeded
    assert str(escape(run.name)) in answer.text
    if run.status.is_final:
        assert "metric points" in answer.text and f"Delete run {run.id}</button>" in answer.text
        assert ('id="delete-files"' in answer.text) == (run.state not in WAITING)  # its folders, with their size
    else:
        assert "stop it before deleting it" in answer.text


def new_run_form(answer: Answer) -> None:
    assert "Start run" in answer.text and 'name="epochs"' in answer.text
    if "from_run" in answer.query:
        assert f'value="{escape(answer.seeded.name)}' in answer.text  # its options, its name first
    if "init_from" in answer.query:
        assert f'value="{answer.query["init_from"]}"' in answer.text


def api_run(answer: Answer) -> None:
    body = answer.json()
    assert (body["id"], body["name"], body["status"]) == (answer.seeded.id, answer.seeded.name,
                                                          answer.seeded.status.value)  # fmt: skip
    assert any(answer.seeded.says in event["reason"] for event in body["events"])


# The running run's ranks were dumped (tests/run_states.py); the stalled run's dump was asked for by the supervisor
# and nothing answered it; no other run has one.
RUNNING_VERDICT = ("rank 1 never reached all_reduce #6 that rank 0 waits in; rank 1's stack: data.py:88 in "
                   "__next__.")  # fmt: skip


def dumps(answer: Answer) -> None:
    latest = answer.json()["latest"]
    if answer.seeded.state == "running":
        assert latest["verdict"] == RUNNING_VERDICT and latest["culprits"] == [1] and latest["missing"] == []
    elif answer.seeded.state == "not progressing":
        assert latest["ranks"] == [] and latest["missing"] == [0, 1] and "No rank has answered" in latest["verdict"]
    else:
        assert latest is None


DIVERGED = "rank 1's parameters differ from the other ranks' at step 40 (first seen; replicas diverged)"
NONFINITE = "loss became NaN at step 40 on rank 1 first (grad norm inf one step earlier)"


STRAGGLER = "rank 1 on node-a is slow in data wait: 15 ms a step against the others' 1 ms, since step 1 (still)"


def findings(answer: Answer) -> None:
    found = answer.json()
    if answer.seeded.state == "failed":
        assert found["nonfinite"] == {"step": 40, "ranks": [1], "grad_norm_step": 39, "sentence": NONFINITE}
    else:
        assert found["nonfinite"] is None
    diverged = {"step": 40, "ranks": [1], "sentence": DIVERGED} if answer.seeded.state == "stopped" else None
    assert found["divergence"] == diverged
    stragglers = [] if answer.seeded.state in UNSTARTED else [STRAGGLER]
    assert [straggler["sentence"] for straggler in found["stragglers"]] == stragglers


def dump_on_page(answer: Answer) -> None:
    """The run page's "Which rank, and why": its button while the run lives, the newest dump's verdict."""
    run = answer.seeded
    assert ('id="dump-button"' in answer.text) == (run.status.value in ("starting", "running", "stopping"))
    # "Which rank, and why" only with something to say (here: a straggler, a dump, a failure); a run that has not
    # started has none, and shows only its quiet Dump button once it is live.
    assert ('id="dump"' in answer.text) == (run.state not in UNSTARTED)
    assert ('<a href="#dump">Which rank, and why</a>' in answer.text) == (run.state not in UNSTARTED)
    desync = run.state in ("failed", "lost", "stopped", "not progressing")  # ended badly or hung: re-run to name it
    assert ('id="desync-button"' in answer.text) == desync
    if run.state == "running":
        assert str(escape(RUNNING_VERDICT)) in answer.text and 'data-culprits="1"' in answer.text
        assert "<code>data.py:88 in __next__</code>" in answer.text
    elif run.state == "not progressing":
        assert "No rank has answered yet" in answer.text and "waiting for rank 0, 1" in answer.text
    assert ("Loss became NaN at step 40 on rank 1 first" in answer.text) == (run.state == "failed")
    assert (str(escape(STRAGGLER)) in answer.text) == (run.state not in UNSTARTED)
    assert ("Rank 1&#39;s parameters differ from the other ranks&#39; at step 40" in answer.text) == (
        run.state == "stopped"
    )


def api_health(answer: Answer) -> None:
    state = answer.json()["state"]
    assert state == ("not_progressing" if answer.seeded.state == "not progressing" else "ok")
    slow = answer.seeded.status == RunStatus.running and answer.seeded.state not in UNSTARTED
    assert [s["sentence"] for s in answer.json()["stragglers"]] == ([STRAGGLER] if slow else [])


def api_goodput(answer: Answer) -> None:
    """Every state has a whole (its wall time so far x processes) that its parts add up to; nothing started: queue."""
    body = answer.json()
    assert sum(part["seconds"] for part in body["parts"]) == pytest.approx(body["total_s"], rel=1e-6, abs=1e-6)
    names = {part["name"] for part in body["parts"]}
    if answer.seeded.state in WAITING:
        assert names <= {"training", "queue"} and body["goodput"] in (0.0, None)
    else:  # the walk's runs report no ledger (a user's script would not): their held time is not itemized
        assert "unitemized" in names and not body["itemized"]


def goodput_summary(answer: Answer) -> None:
    body = answer.json()
    prefix = answer.query.get("name_prefix", "")
    matching = min(500, sum(1 for run in answer.store.runs if run[1].startswith(prefix)))
    if "since_hours" in answer.query:  # the bulk runs of the many store were made long ago; the seeded ones now
        assert len(answer.store.seeded) <= body["runs"] <= matching
    else:
        assert body["runs"] == matching
    assert sum(part["seconds"] for part in body["parts"]) == pytest.approx(body["total_s"], rel=1e-6, abs=1e-6)


def metric_keys(answer: Answer) -> None:
    keys = answer.json()
    if answer.seeded.state in UNSTARTED:
        assert keys == []
    else:
        assert {"loss", "val_loss", "rank/step_ms", "gpu/node-a/1/util"} <= set(keys)


def series(answer: Answer) -> None:
    if answer.missing:
        not_found("has no metric 'rank/step_ms'")(answer)
    else:
        assert [(p["step"], p["rank"]) for p in answer.json()["points"][:2]] == [(1, 0), (1, 1)]


def chart(answer: Answer) -> None:
    if answer.missing:
        not_found("rank/step_ms")(answer)
    else:
        assert answer.response.status_code == 200 and answer.json()["key"] == "rank/step_ms"


def checkpoints(answer: Answer) -> None:
    names = [c["name"] for c in answer.json()]
    assert names == ([answer.seeded.checkpoint] if answer.seeded.checkpoint else [])


def one_checkpoint(answer: Answer) -> None:
    if answer.missing:
        not_found("step-00000040.pt")(answer)
    else:
        body = answer.json()
        assert (body["name"], body["step"], body["metrics"]["loss"]) == (answer.seeded.checkpoint, 40, 0.05)


def rank_output(answer: Answer) -> None:
    outputs = {(o["rank"], o["stream"]): o["lines"] for o in answer.json()}
    if answer.seeded.state in UNSTARTED or not answer.seeded.has_logs:
        assert all(lines == [] for lines in outputs.values())
    else:
        assert outputs[(1, "stdout")][-1] == "[rank 1] step 40 loss 0.0500"


def ranks(answer: Answer) -> None:
    beats = [(r["rank"], r["step"]) for r in answer.json()]
    assert beats == ([] if answer.seeded.state in UNSTARTED else [(0, 40), (1, 39)])


def log_files(answer: Answer) -> None:
    files = [(f["rank"], f["stream"]) for f in answer.json()]
    every = [(0, "stdout"), (0, "stderr"), (1, "stdout"), (1, "stderr"), (None, "stdout")]
    assert files == (every if answer.seeded.has_logs else [])


def log_tail(answer: Answer) -> None:
    if answer.missing:
        not_found("rank 1")(answer)
    else:
        assert answer.json()["stream"] == "stderr" and answer.json()["rank"] == 1


def log_download(answer: Answer) -> None:
    if answer.missing:
        not_found("rank 1")(answer)
    else:
        assert answer.response.headers["content-disposition"].endswith('-1-stderr.log"')


def diagnoses(answer: Answer) -> None:
    kinds = [d["kind"] for d in answer.json()]
    assert kinds == (["exception"] if answer.seeded.state == "failed" else [])


def checkpoint_file(check: Callable[[Answer], None]) -> Callable[[Answer], None]:
    def on_store(answer: Answer) -> None:
        if answer.missing:
            not_found("step-00000040.pt")(answer)
        else:
            assert answer.response.status_code == 200
            check(answer)

    return on_store


def inspect_page(answer: Answer) -> None:
    assert "model.weight" in answer.text and "15 model parameters" in answer.text


def inspect_api(answer: Answer) -> None:
    assert answer.json()["parameters"] == 15


def download(answer: Answer) -> None:
    assert answer.response.content[:2] == b"PK"  # what torch.save writes: a zip archive


def files_page(answer: Answer) -> None:
    assert "Shared storage" in answer.text
    if answer.store.seeded:
        newest = max(run.id for run in answer.store.seeded.values() if run.checkpoint)  # one with files of its own
        folders = ["checkpoints", "logs"] if "path" not in answer.query else [f"run-{newest}"]
        assert all(f">{folder}/</a>" in answer.text for folder in folders), folders


def host_page(answer: Answer) -> None:
    assert 'id="system"' in answer.text and "Memory" in answer.text
    if answer.query.get("_target") == "host-now":
        assert "<html" not in answer.text and not answer.text.lstrip().startswith('<div id="host-now"')
    else:
        assert 'hx-get="/host" hx-trigger="every 2s"' in answer.text


def queue_api(answer: Answer) -> None:
    """Every queued run of the store, once: this host's numbered in the queue's order, Slurm's apart."""
    shown = answer.json()
    queued = sorted(run_id for run_id, _name, status in answer.store.runs if status == RunStatus.queued)
    here = [entry["id"] for entry in shown["queued"]]
    assert sorted(here + [entry["id"] for entry in shown["elsewhere"]]) == queued
    assert [entry["position"] for entry in shown["queued"]] == list(range(1, len(here) + 1))


def queue_page(answer: Answer) -> None:
    """The queue's table, each queued run in it; the part that polls itself alone when htmx asks for it."""
    queued = [run_id for run_id, _name, status in answer.store.runs if status == RunStatus.queued]
    assert all(f'id="queued-{run_id}"' in answer.text or f'id="elsewhere-{run_id}"' in answer.text
               for run_id in queued)  # fmt: skip
    if answer.query.get("_target") == "queue-now":
        assert "<html" not in answer.text and 'id="capacity"' in answer.text
    else:
        assert "<h1>Queue</h1>" in answer.text and 'hx-get="/queue" hx-trigger="every 3s"' in answer.text


def api_cost(answer: Answer) -> None:
    """A run's cost: its parts add up to what it held; a run never launched held nothing."""
    body = answer.json()
    held = body["device_hours"]
    assert sum(part["device_hours"] for part in body["parts"]) == pytest.approx(held, rel=1e-6, abs=1e-9)
    if answer.seeded.state in WAITING:
        assert body["attempts"] == [] and body["device_hours"] == 0


def usage_api(answer: Answer) -> None:
    """Usage: by user or launcher each run is in one row, so the rows add up to the total; as CSV, the same table."""
    if answer.response.status_code == 422:  # a grouping there is none of, named
        assert answer.json()["detail"][0]["loc"] == ["query", "by"]
        return
    if answer.query.get("format") == "csv":
        assert answer.response.headers["content-type"].startswith("text/csv")
        assert answer.text.startswith("group,runs,gpu_hours") and answer.text.splitlines()[-1].startswith("(all),")
        return
    body = answer.json()
    assert body["total"]["runs"] <= len(answer.store.runs)
    if body["by"] != "tag":
        assert sum(row["runs"] for row in body["rows"]) == body["total"]["runs"]
        hours = sum(row["gpu_hours"] + row["cpu_hours"] for row in body["rows"])
        assert hours == pytest.approx(body["total"]["gpu_hours"] + body["total"]["cpu_hours"])


def usage_page(answer: Answer) -> None:
    assert "<h1>Usage</h1>" in answer.text
    held = answer.store.name != "empty"  # every store but the empty one holds a launched run
    assert ('id="usage-table"' in answer.text) == held and ("No run held" in answer.text) != held


def holds(predicate: Callable[[Answer], bool]) -> Callable[[Answer], None]:
    def check(answer: Answer) -> None:
        assert predicate(answer), answer.text[:300]

    return check


EXPECT: dict[str, Callable[[Answer], None]] = {
    "/": runs_list,
    "/runs/new": new_run_form,
    "/runs/{run_id}": run_page,
    "/runs/{run_id}/delete": delete_page,
    "/compare": compare_page,
    "/api/compare": compare_api,
    "/runs/{run_id}/logs": logs_panel,
    "/runs/{run_id}/stream": run_stream,
    "/runs/{run_id}/logs/stream": log_stream,
    "/host": host_page,
    "/files": files_page,
    "/files/inspect": checkpoint_file(inspect_page),
    "/api/health": holds(lambda answer: answer.json()["status"] == "ok"),
    "/api/host": holds(lambda answer: "cpu_percent" in answer.json()),
    "/api/runs": holds(
        lambda answer: [r["id"] for r in answer.json()["items"]] == [r[0] for r in answer.store.runs[:50]]
    ),
    "/api/runs/{run_id}": api_run,
    "/api/runs/{run_id}/health": api_health,
    "/api/runs/{run_id}/ranks": ranks,
    "/api/runs/{run_id}/dumps": dumps,
    "/api/runs/{run_id}/findings": findings,
    "/api/runs/{run_id}/goodput": api_goodput,
    "/api/goodput": goodput_summary,
    # The walk's runs report step times but no communication timings (as a user's script would not).
    "/api/runs/{run_id}/comm": holds(lambda answer: answer.json() is None),
    "/api/runs/{run_id}/preflight": holds(lambda answer: answer.json() is None),  # no trainer ran: no preflight
    "/api/runs/{run_id}/mfu": holds(lambda answer: answer.json() is None),  # nor reported model FLOPs
    "/api/runs/{run_id}/sweep": holds(lambda answer: answer.json() == {"run_id": answer.seeded.id, "rows": []}),
    "/api/runs/{run_id}/metrics": metric_keys,
    "/api/runs/{run_id}/metrics/{key}": series,
    "/api/runs/{run_id}/chart": chart,
    "/api/runs/{run_id}/checkpoints": checkpoints,
    "/api/runs/{run_id}/checkpoints/removed": holds(lambda answer: answer.json() == []),
    "/api/runs/{run_id}/checkpoints/{name}": one_checkpoint,
    "/api/runs/{run_id}/output": rank_output,
    "/api/runs/{run_id}/logs": log_files,
    "/api/runs/{run_id}/logs/{rank}/{stream}": log_tail,
    "/api/runs/{run_id}/logs/{rank}/{stream}/download": log_download,
    "/api/runs/{run_id}/diagnoses": diagnoses,
    "/api/files": holds(lambda answer: isinstance(answer.json()["entries"], list)),
    "/api/files/download": checkpoint_file(download),
    "/api/files/inspect": checkpoint_file(inspect_api),
    "/openapi.json": holds(lambda answer: "/api/runs/{run_id}" in answer.json()["paths"]),
    "/docs": holds(lambda answer: "/static/docs.js" in answer.text and 'data-openapi="/openapi.json"' in answer.text),
    # With authentication off (no user): everyone is the local user; the login page leads to the dashboard.
    "/login": holds(lambda answer: answer.response.url.path == "/" and "<h1>Runs" in answer.text),
    "/users": holds(lambda answer: "<h1>Users</h1>" in answer.text and "Add a user" in answer.text),
    "/tokens": holds(lambda answer: "No tokens yet." in answer.text and "Make a token" in answer.text),
    "/api/me": holds(lambda answer: answer.json() == {"name": "local", "role": "admin", "via": "local"}),
    "/api/users": holds(lambda answer: answer.json() == []),
    "/api/tokens": holds(lambda answer: answer.json() == []),
    # No webhook configured in the walk: the rules say so, and nothing was sent (tests/app/test_alerts.py sends).
    "/alerts": holds(lambda answer: "<h1>Alerts</h1>" in answer.text and "No webhooks configured" in answer.text),
    "/api/alerts": holds(lambda answer: answer.json()["webhooks"] == [] and answer.json()["deliveries"] == []),
    "/api/runs/{run_id}/alerts": holds(lambda answer: answer.json() == []),
    "/api/export": export_files,
    "/api/export/{table}": export_files,
    "/queue": queue_page,
    "/api/queue": queue_api,
    # No limit set in the walk: the admins' page and the API say so (tests/app/test_queue.py sets them).
    "/queue/limits": holds(lambda answer: "No user has a limit." in answer.text and "No group yet." in answer.text),
    "/api/queue/limits": holds(lambda answer: answer.json()["users"] == [] and answer.json()["groups"] == []),
    "/api/runs/{run_id}/cost": api_cost,
    "/api/usage": usage_api,
    "/usage": usage_page,
}

# Besides a plain GET, what the pages ask each route for: query parameters, and the fragment's target (`_target`,
# sent as HX-Target; with HX-Request too where htmx sends it, not where static/run.js fetches it itself), and the
# status a variant that asks for something wrong gets (`_status`; 200 otherwise).
Variant = dict[str, str]
VARIANTS: dict[str, Callable[[Store, Seeded | None], list[Variant]]] = {
    "/": lambda store, run: [
        {},
        {"_target": "runs-table", "_hx": "1"},
        {"page_number": "2"},
        {"page_number": "41"},
        {"_target": "runs-table", "_hx": "1", "page_number": "2"},
        *({"status": s.value} for s in RunStatus),
        {"status": "running", "_target": "runs-table", "_hx": "1"},
        {"q": "walk", "filter": "loss.min < 1; epochs >= 1", "sort": "-loss.last", "columns": "lr,loss.min"},
        {"q": "walk", "filter": "loss.min < 1", "columns": "seed", "_target": "runs-table", "_hx": "1"},
        {"filter": BAD_FILTER, "_status": "422"},
    ],
    "/compare": lambda store, run: VARIANTS["/api/compare"](store, run),
    "/api/compare": lambda store, run: (
        [{"run": [str(r.id) for r in store.seeded.values()][:10]}, {"run": [str(r[0]) for r in store.runs[:2]]}]
        if len(store.runs) >= 2
        else [{}]
    ),
    "/api/export": lambda store, run: [
        {**one, **form} for one in VARIANTS["/api/compare"](store, run) if one for form in ({}, {"format": "csv"})
    ],
    "/api/export/{table}": lambda store, run: VARIANTS["/api/export"](store, run),
    "/runs/{run_id}": lambda store, run: [{}, {"_target": "charts"}],
    "/api/goodput": lambda store, run: [{}, {"since_hours": "24"}, {"name_prefix": "zz-none"}],
    "/runs/{run_id}/logs": lambda store, run: [{"_target": "logs", "_hx": "1"}],
    "/runs/{run_id}/logs/stream": lambda store, run: [{"rank": "1", "stream": "stderr", "filter": ""}],
    "/host": lambda store, run: [{}, {"_target": "host-now", "_hx": "1"}],
    "/queue": lambda store, run: [{}, {"_target": "queue-now", "_hx": "1"}],
    "/api/usage": lambda store, run: [
        {},
        {"by": "tag"},
        {"by": "launcher", "format": "csv"},
        {"by": "nobody", "_status": "422"},
    ],
    "/usage": lambda store, run: [{}, {"by": "tag", "from": "2026-01-01"}],
    "/runs/new": lambda store, run: (
        [{}]
        + [
            {"from_run": str(r.id), **({"init_from": r.checkpoint_path} if r.checkpoint_path else {})}
            for r in store.seeded.values()
        ]
    ),
    "/files": lambda store, run: [{}, {"path": "checkpoints"}, {"path": "logs"}] if store.seeded else [{}],
}


# Streams with nothing to say yet, whose first event would never come: the log of a run that has written none (the
# page says "Waiting for rank 1 · stderr…"). Of these, the walk checks the answer's headers and closes it.
QUIET: dict[str, Callable[[Seeded | None], bool]] = {
    "/runs/{run_id}/logs/stream": lambda run: run is not None and not run.has_logs,
}


def walk(store: Store, route: Route, run: Seeded | None) -> list[Answer]:
    """Every variant of one route for one run (or the store), each answer checked against EXPECT."""
    values = {param: FILL[param](store, run) for param in route.params}
    missing = any(value is None for value in values.values())
    filled = {param: value if value is not None else MISSING[param] for param, value in values.items()}
    url = route.path.format(**filled)
    query_params = {param: filled[param] for param in route.params if "{" + param + "}" not in route.path}
    answers = []
    for variant in VARIANTS.get(route.path, lambda store, run: [{}])(store, run):
        query = {**query_params, **variant}
        sent = {k: v for k, v in query.items() if not k.startswith("_")}
        headers = {**(HX if "_hx" in query else {}), **({"HX-Target": query["_target"]} if "_target" in query else {})}
        with store.client.stream("GET", url, params=sent, headers=headers) as response:
            event = None
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                response.read()
            elif not QUIET.get(route.path, lambda run: False)(run):
                event = read_first_event(response)
        about = next((r for r in store.seeded.values() if str(r.id) == query.get("from_run")), run)
        answer = Answer(store, about, query, response, missing, event)
        where = f"GET {url}?{sent} {headers} ({store.name} store{f', {run.state} run' if run else ''})"
        if not missing:  # a variant that asks for what is wrong says what it gets (`_status`)
            expected = int(query.get("_status", "200"))
            assert response.status_code == expected, f"{where}: {response.status_code} {response.text[:500]}"
        try:
            EXPECT[route.path](answer)
        except AssertionError as error:
            raise AssertionError(f"{where}: {str(error)[:800]}") from None
        answers.append(answer)
    return answers


def read_first_event(response: httpx.Response) -> tuple[str, str]:
    """The first message of an event stream: its event name and its data."""
    kind, data = "", []
    for line in response.iter_lines():
        if not line:
            return kind, "\n".join(data)
        name, _, value = line.partition(": ")
        if name == "event":
            kind = value
        elif name == "data":
            data.append(value)
    raise AssertionError("the stream ended before its first event")


# --- the walks --------------------------------------------------------------------------------------------------


def test_every_route_has_a_way_to_fill_it_and_an_expectation(stores: dict[str, Store]) -> None:
    routes = get_routes(stores["empty"].client.app)  # type: ignore[arg-type]
    assert {"/", "/docs", "/runs/{run_id}", "/runs/{run_id}/stream", "/api/runs/{run_id}/metrics/{key}"} <= {
        route.path for route in routes
    }  # pages, FastAPI's own routes, streams and included routers: the table is read whole
    for route in routes:
        for param in route.params:
            assert param in FILL, f"add how to fill {param} for {route.path} to FILL in {__file__}"
        assert route.path in EXPECT, f"add what a user expects from {route.path} to EXPECT in {__file__}"
    assert set(VARIANTS) <= {route.path for route in routes}, "a variant for a route that is gone"


def run_routes(store: Store) -> list[Route]:
    return [route for route in get_routes(store.client.app) if "run_id" in route.params]  # type: ignore[arg-type]


@pytest.mark.parametrize("state", list(STATES))
def test_every_run_route_in_every_state(stores: dict[str, Store], state: str) -> None:
    store = stores["many"]
    for route in run_routes(store):
        walk(store, route, store.seeded[state])


@pytest.mark.parametrize("name", ["empty", "one", "many"])
def test_every_other_route_with_0_1_and_1000_runs(stores: dict[str, Store], name: str) -> None:
    store = stores[name]
    routes = [route for route in get_routes(store.client.app) if "run_id" not in route.params]  # type: ignore[arg-type]
    for route in routes:
        walk(store, route, None)


def test_every_asset_a_page_links_is_served(stores: dict[str, Store]) -> None:
    store = stores["many"]
    pages = ["/", "/runs/new", "/host", "/files", f"/runs/{store.seeded['running'].id}", "/docs"]
    for page in pages:  # a cluster often has no internet: nothing may come from another host
        links = re.findall(r'(?:src|href)="([^"]+)"', store.client.get(page).text)
        assert [link for link in links if "//" in link] == [], page
    assets = {
        link for page in pages for link in re.findall(r'(?:src|href)="(/static/[^"]+)"', store.client.get(page).text)
    }
    assert "/static/run.js" in assets and "/static/logs.js" in assets
    for asset in sorted(assets):
        assert store.client.get(asset).status_code == 200, asset
    for module in re.findall(r'from "\./([^"]+)"', store.client.get("/static/run.js").text):
        assert store.client.get(f"/static/{module}").status_code == 200, module

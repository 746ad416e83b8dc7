"""The compare page and its API, read as a user reads them: the options side by side (only those that differ, on a
long table), a summary of each run, and a chart of every metric any run has, in the run page's sections, saying which
runs lack it. (The charts drawn in a browser: tests/e2e/test_compare_browser.py.)"""

from __future__ import annotations

import html
import json
import os
import re
from html.parser import HTMLParser
from typing import Any

from fastapi.testclient import TestClient
from rankboard import wire

from app.auth.passwords import sha256 as hash_token
from app.core.models import Run, RunStatus
from app.launcher import processes

TOKEN = "compare-t0ken"


def _reporting_run(client: TestClient, options: dict[str, Any], series: dict[str, list[float]], ranks: int = 1) -> int:
    """A running run that has reported `series` (each value at steps 1, 2, ...) from each of `ranks` ranks."""
    run_id = int(client.post("/api/runs", json=options).json()["id"])
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.status, run.token_hash = RunStatus.running, hash_token(TOKEN)
        run.pid, run.pid_start_ticks = os.getpid(), processes.start_ticks(os.getpid())
    points = tuple(wire.Point(key, step, value + rank, rank, 0.0) for key, values in series.items()
                   for step, value in enumerate(values, start=1) for rank in range(ranks))  # fmt: skip
    answer = client.post(f"/api/runs/{run_id}/metrics", json=wire.Batch(points).to_json(),
                         headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert answer.status_code == 200, answer.text
    return run_id


class ComparePage(HTMLParser):
    """What the compare page shows: its chart sections in order (id, heading), each chart (its keys, its section,
    the sentences under its title), and the options table's rows, class and toggle."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.sections: list[tuple[str, str]] = []
        self.charts: dict[str, dict[str, Any]] = {}  # title -> {keys, section, lacking}
        self.option_rows: list[tuple[str, bool]] = []  # (name, differs)
        self.options_class = ""
        self.toggle_checked: bool | None = None
        self._text: list[str] | None = None
        self._into = ""
        self._chart: dict[str, Any] | None = None
        self._row: tuple[bool] | None = None
        self._in_options = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {name: value or "" for name, value in attrs}
        if tag == "details" and "data-section-id" in a:
            self.sections.append((a["data-section-id"], ""))
            self._start("section")
        elif tag == "figure" and "data-chart" in a:
            self._chart = {"keys": json.loads(a["data-keys"]), "section": a["data-section"], "lacking": [],
                           "spec": json.loads(a["data-chart"])}  # fmt: skip
        elif tag == "h4" and self._chart is not None:
            self._start("title")
        elif tag == "span" and "chart-lacking" in a.get("class", "") and self._chart is not None:
            self._start("lacking")
        elif tag == "input" and a.get("id") == "only-differing":
            self.toggle_checked = "checked" in a
        elif tag == "table" and a.get("id") == "compare-options":
            self.options_class, self._in_options = a.get("class", ""), True
        elif tag == "tr" and self._in_options:
            self._row = ("differs" in a.get("class", ""),)
        elif tag == "th" and self._row is not None:
            self._start("option")

    def _start(self, into: str) -> None:
        self._into, self._text = into, []

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        text = "".join(self._text or []).strip()
        if tag == "h3" and self._into == "section":
            self.sections[-1] = (self.sections[-1][0], text)
        elif tag == "h4" and self._into == "title" and self._chart is not None:
            self.charts[text] = self._chart
        elif tag == "span" and self._into == "lacking" and self._chart is not None:
            self._chart["lacking"].append(text)
        elif tag == "th" and self._into == "option" and self._row is not None:
            self.option_rows.append((text, self._row[0]))
            self._row = None
        elif tag == "figure":
            self._chart = None
        elif tag == "table":
            self._in_options = False
        if tag in ("h3", "h4", "span", "th"):
            self._into, self._text = "", None


def test_compare_shows_options_side_by_side_and_a_chart_per_metric_any_run_has(client: TestClient) -> None:
    first = _reporting_run(client, {"name": "cmp-a", "lr": 0.001, "seed": 1}, {"loss": [1.0, 0.5], "val_loss": [0.9]})
    second = _reporting_run(client, {"name": "cmp-b", "lr": 0.003, "seed": 1, "optimizer": "sgd"},
                            {"loss": [2.0, 0.25, 0.75], "accuracy": [0.5]})  # fmt: skip
    page = client.get("/compare", params={"run": [first, second], "options": "all"})
    assert page.status_code == 200
    options = {name: bool(mark) for mark, name in re.findall(r'<tr( class="differs")?><th>(\w+)</th>', page.text)}
    assert options["lr"] and options["optimizer"] and options["name"] and not options["seed"]
    assert not options["epochs"]
    shown = ComparePage(page.text)
    assert list(shown.charts) == ["Loss", "accuracy"]  # the run page's loss chart (loss and val_loss), then the rest
    assert shown.charts["Loss"]["lacking"] == [f"#{second} cmp-b has no val_loss"]
    assert shown.charts["accuracy"]["lacking"] == [f"Not reported by #{first} cmp-a"]
    assert shown.charts["accuracy"]["spec"]["absent"] == {str(first): ["accuracy"]}  # its line is not asked for
    assert f'"id": {first}' in html.unescape(page.text) and f"#{second} cmp-b" in page.text
    summary = page.text.partition('id="compare-summary"')[2].partition("</table>")[0]
    assert "0.5 <small>(0.5 … 1)</small>" in summary and "0.75 <small>(0.25 … 2)</small>" in summary
    for wrong, status in (([first], 422), ([first] * 2, 422), ([first, 999_999], 404), (list(range(1, 12)), 422)):
        assert client.get("/compare", params={"run": wrong}).status_code == status, wrong


def test_the_compare_api_answers_what_the_page_shows(client: TestClient) -> None:
    first = _reporting_run(client, {"name": "cmp-a", "lr": 0.001, "seed": 1}, {"loss": [1.0, 0.5], "val_loss": [0.9]})
    second = _reporting_run(client, {"name": "cmp-b", "lr": 0.003, "seed": 1, "optimizer": "sgd"},
                            {"loss": [2.0, 0.25, 0.75], "accuracy": [0.5]})  # fmt: skip
    answer = client.get("/api/compare", params={"run": [first, second]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [(run["id"], run["name"], run["status"], run["step"]) for run in body["runs"]] == [
        (first, "cmp-a", "running", 2), (second, "cmp-b", "running", 3)
    ]  # fmt: skip
    options = {row["name"]: row for row in body["options"]}
    assert options["lr"] == {"name": "lr", "values": ["0.001", "0.003"], "differs": True}
    assert options["optimizer"]["differs"] and not options["seed"]["differs"]
    assert not any(name.startswith("slurm_") for name in options)  # two local runs: no Slurm option to compare
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, second).launcher = "slurm"
    slurm = client.get("/api/compare", params={"run": [first, second]}).json()["options"]
    assert "slurm_partition" in {row["name"] for row in slurm}  # one went through Slurm: its options are shown
    assert body["metrics"] == [
        {"key": "loss", "last": [0.5, 0.75], "min": [0.5, 0.25], "max": [1.0, 2.0]},
        {"key": "val_loss", "last": [0.9, None], "min": [0.9, None], "max": [0.9, None]},
        {"key": "accuracy", "last": [None, 0.5], "min": [None, 0.5], "max": [None, 0.5]},
    ]  # every key either run has, in the charts' order; null where a run has none
    for wrong, status in (([first], 422), ([first, 999_999], 404)):
        assert client.get("/api/compare", params={"run": wrong}).status_code == status, wrong


def test_two_runs_with_different_keys_get_every_key_charted_in_the_run_pages_sections(client: TestClient) -> None:
    first = _reporting_run(client, {"name": "wide"}, {"loss": [3.0, 2.0], "train/acc": [0.1, 0.2], "lr": [0.1],
                                                      "gpu/node-a/0/util": [50.0]}, ranks=2)  # fmt: skip
    second = _reporting_run(client, {"name": "other"}, {"loss": [4.0], "eval/acc": [0.3], "train/acc": [0.4],
                                                        "gpu/node-b/0/util": [70.0], "ünï/x": [1.0]})  # fmt: skip
    queued = int(client.post("/api/runs", json={"name": "queued"}).json()["id"])  # no metric yet
    page = client.get("/compare", params={"run": [first, second, queued]}).text
    shown = ComparePage(page)

    assert [title for _id, title in shown.sections] == ["Metrics", "eval", "train", "ünï", "GPUs"]
    keys = [key for chart in shown.charts.values() for key in chart["keys"]]
    union = ["loss", "lr", "train/acc", "eval/acc", "ünï/x", "gpu/node-a/0/util", "gpu/node-b/0/util"]
    assert sorted(keys) == sorted(union)  # each key any run has, in exactly one chart
    assert {title: chart["section"] for title, chart in shown.charts.items()} == {
        "Loss": "", "Learning rate": "", "eval/acc": "eval", "train/acc": "train", "ünï/x": "ünï",
        "GPU utilization": "gpu",
    }  # fmt: skip
    assert {title: chart["lacking"] for title, chart in shown.charts.items() if chart["lacking"]} == {
        "Learning rate": [f"Not reported by #{second} other"],
        "eval/acc": [f"Not reported by #{first} wide"],
        "ünï/x": [f"Not reported by #{first} wide"],
    }  # one GPU per run, on other hosts: the GPU chart draws both and names no one; the queued run is said once:
    assert f"No metric yet from #{queued} queued: it is on none of the charts." in page
    summary = page.partition('id="compare-summary"')[2].partition("</table>")[0]
    rows = re.findall(r"<tr><th>([^<]+) <small>last", summary)
    assert rows == ["loss", "lr", "eval/acc", "train/acc", "ünï/x"]  # the GPUs' fields only on their charts
    assert "and 2 more metrics: each has its chart below" in summary
    gpu = shown.charts["GPU utilization"]["spec"]
    assert gpu["absent"] == {str(first): ["gpu/node-b/0/util"], str(second): ["gpu/node-a/0/util"],
                             str(queued): ["gpu/node-a/0/util", "gpu/node-b/0/util"]}  # fmt: skip
    assert all(re.fullmatch(r"[a-z0-9-]+", section_id) for section_id, _title in shown.sections)  # DOM-safe


def test_a_long_options_table_shows_only_the_options_that_differ_unless_asked_for_all(client: TestClient) -> None:
    first = _reporting_run(client, {"name": "a", "lr": 0.001}, {"loss": [1.0]})
    second = _reporting_run(client, {"name": "b", "lr": 0.002}, {"loss": [1.0]})
    runs = {"run": [first, second]}

    default = ComparePage(client.get("/compare", params=runs).text)
    assert len(default.option_rows) > 10  # every option of the form, the Slurm ones included
    assert default.toggle_checked and "only-differing" in default.options_class.split()
    assert {name for name, differs in default.option_rows if differs} == {"name", "lr"}  # highlighted, as ever
    everything = ComparePage(client.get("/compare", params={**runs, "options": "all"}).text)
    assert everything.toggle_checked is False and "only-differing" not in everything.options_class.split()
    assert everything.option_rows == default.option_rows  # the rows are all there: the class hides the others
    assert ComparePage(client.get("/compare", params={**runs, "options": "differ"}).text).toggle_checked
    assert client.get("/compare", params={**runs, "options": "some"}).status_code == 422

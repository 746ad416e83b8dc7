"""The runs table: search, conditions, sort and columns checked against a brute-force computation over a few hundred
generated runs whose metrics went in through the real ingest endpoint; tags and notes; the view's URL; clone; the
migration that adds the summaries to an existing database."""

from __future__ import annotations

import html
import math
import os
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from alembic.command import downgrade
from fastapi.testclient import TestClient
from markupsafe import escape
from rankboard import wire
from sqlalchemy import insert, inspect, text

from app.auth.passwords import sha256 as hash_token
from app.core.db import alembic_config, make_engine, upgrade
from app.core.models import Run, RunStatus
from app.core.settings import Settings
from app.launcher import processes
from app.main import create_app
from app.schemas.runs import RunCreate

TOKEN = "table-t0ken"
RUNS = 240
KEYS = ("loss", "val_loss", "rank/step_ms")


@dataclass
class Generated:
    """One generated run as the brute force sees it: its options and each metric's points (rank, step, value)."""

    id: int
    name: str
    status: str
    lr: float
    batch_size: int
    optimizer: str
    tags: list[str]
    points: dict[str, list[tuple[int, int, float]]]

    def stat(self, key: str, stat: str) -> float | None:
        points = self.points.get(key)
        if not points:
            return None
        finite = [value for _rank, _step, value in points if not math.isnan(value)]
        if stat == "last":
            top = max(step for _rank, step, _value in points)
            value = min((rank, value) for rank, step, value in points if step == top)[1]
            return None if math.isnan(value) else value
        if not finite:
            return None
        return min(finite) if stat == "min" else max(finite)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, list[Generated]]]:
    """A server holding RUNS runs of random options, tags and metrics (NaN among them; some without val_loss)."""
    root = tmp_path_factory.mktemp("table")
    settings = Settings(data_dir=root / "data", shared_dir=root / "shared", supervise_interval_s=3600, slots=2)
    rng = random.Random(15)
    with TestClient(create_app(settings)) as client:
        sessions = client.app.state.sessions  # type: ignore[attr-defined]
        spec = RunCreate()
        me = os.getpid()  # the live runs' process: a supervisor's tick finds them alive (as tests/run_states.py does)
        rows = [{**spec.columns(), "name": f"{rng.choice(['resnet', 'gpt', 'Bert_x'])}-{i}",
                 "config": spec.config() | {"lr": rng.choice([1e-4, 3e-4, 1e-3, 3e-3]),
                                            "batch_size": rng.choice([16, 32, 64]),
                                            "optimizer": rng.choice(["adamw", "sgd"])},
                 "status": RunStatus.running, "status_reason": "", "token_hash": hash_token(TOKEN),
                 "pid": me, "pid_start_ticks": processes.start_ticks(me)}
                for i in range(RUNS)]  # fmt: skip
        with sessions() as db, db.begin():
            db.execute(insert(Run), rows)
        made = []
        for listed in client.get("/api/runs", params={"limit": 500}).json()["items"]:
            made.append(_generate(client, rng, listed))
        with sessions() as db, db.begin():
            db.execute(text("UPDATE runs SET status = 'succeeded' WHERE id % 3 = 0"))
        for run in made:
            run.status = "succeeded" if run.id % 3 == 0 else "running"
        yield client, made


def _generate(client: TestClient, rng: random.Random, listed: dict[str, Any]) -> Generated:
    points: dict[str, list[tuple[int, int, float]]] = {}
    for key in KEYS:
        if key == "val_loss" and rng.random() < 0.3:
            continue  # a run that never validated
        ranks = 2 if key == "rank/step_ms" else 1
        steps = rng.randint(1, 40)
        points[key] = [(rank, step, math.nan if rng.random() < 0.03 else rng.uniform(0, 2))
                       for step in range(1, steps + 1) for rank in range(ranks)]  # fmt: skip
    batch = wire.Batch(tuple(wire.Point(key, step, value, rank, 1.7e9 + step) for key, found in points.items()
                             for rank, step, value in found))  # fmt: skip
    answer = client.post(f"/api/runs/{listed['id']}/metrics", json=batch.to_json(),
                         headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert answer.status_code == 200, answer.text
    tags = rng.sample(["baseline", "sweep-7", "best", "ablation"], rng.randint(0, 2))
    if tags:
        assert client.patch(f"/api/runs/{listed['id']}", json={"tags": tags}).status_code == 200
    return Generated(listed["id"], listed["name"], "running", listed["lr"], listed["batch_size"], listed["optimizer"],
                     tags, points)  # fmt: skip


def listed_ids(client: TestClient, **params: str) -> list[int]:
    answer = client.get("/api/runs", params={**params, "limit": 500})
    assert answer.status_code == 200, answer.text
    return [run["id"] for run in answer.json()["items"]]


def brute(made: list[Generated], keep: Callable[[Generated], bool], key: Callable[[Generated], Any], *,
          desc: bool) -> list[int]:  # fmt: skip
    """The ids a view must list: those kept, by the sort value (runs without one last), ties newest first."""
    kept = [run for run in made if keep(run)]
    having = sorted((run for run in kept if key(run) is not None), key=lambda run: -run.id)
    having.sort(key=key, reverse=desc)  # stable: ties stay newest first either way
    return [run.id for run in having + [run for run in kept if key(run) is None]]


CASES: list[tuple[dict[str, str], Callable[[Generated], bool], Callable[[Generated], Any], bool]] = [
    ({"filter": "lr < 1e-3", "sort": "-val_loss.min"},
     lambda r: r.lr < 1e-3 and True, lambda r: r.stat("val_loss", "min"), True),
    ({"filter": "val_loss.min < 0.5", "sort": "lr"},
     lambda r: (r.stat("val_loss", "min") or math.inf) < 0.5, lambda r: r.lr, False),
    ({"filter": "loss.last >= 1; batch_size = 32 and optimizer = sgd", "sort": "loss.max"},
     lambda r: (r.stat("loss", "last") or -1) >= 1 and r.batch_size == 32 and r.optimizer == "sgd",
     lambda r: r.stat("loss", "max"), False),
    ({"filter": "rank/step_ms.max > 1.5", "sort": "-rank/step_ms.last"},
     lambda r: (r.stat("rank/step_ms", "max") or 0) > 1.5, lambda r: r.stat("rank/step_ms", "last"), True),
    ({"q": "BERT_", "sort": "name"}, lambda r: "bert_" in r.name.lower(), lambda r: r.name, False),
    ({"q": "best succeeded"}, lambda r: "best" in r.tags and r.status == "succeeded", lambda r: r.id, True),
    ({"q": "sweep-7", "filter": "val_loss.last != 0.5", "sort": "-val_loss"},
     lambda r: "sweep-7" in r.tags and r.stat("val_loss", "last") is not None,
     lambda r: r.stat("val_loss", "last"), True),
    ({"sort": "-val_loss.last"}, lambda r: True, lambda r: r.stat("val_loss", "last"), True),
]  # fmt: skip


@pytest.mark.parametrize("case", range(len(CASES)))
def test_filter_search_and_sort_find_what_a_brute_force_finds(
    table: tuple[TestClient, list[Generated]], case: int
) -> None:
    client, made = table
    params, keep, key, desc = CASES[case]
    expected = brute(made, keep, key, desc=desc)
    assert expected, "a case that finds nothing checks little"
    assert listed_ids(client, **params) == expected
    # Paged: the same order, page after page, and the total counts every match.
    first = client.get("/api/runs", params={**params, "limit": 7, "offset": 7}).json()
    assert [run["id"] for run in first["items"]] == expected[7:14] and first["total"] == len(expected)


def test_metric_columns_show_each_runs_last_min_and_max(table: tuple[TestClient, list[Generated]]) -> None:
    client, made = table
    body = client.get(
        "/api/runs", params={"columns": "lr,loss.last,val_loss.min,rank/step_ms.max", "limit": 500}
    ).json()
    assert body["columns"] == ["lr", "loss.last", "val_loss.min", "rank/step_ms.max"]
    for run in made:
        row = body["values"][str(run.id)]
        expected = [run.lr, run.stat("loss", "last"), run.stat("val_loss", "min"), run.stat("rank/step_ms", "max")]
        assert [row[c] for c in body["columns"]] == pytest.approx(expected), run.id


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"filter": "lr <"}, "no value after <"),
        ({"filter": "lr ~ 3"}, "is not `name op value`"),
        ({"filter": "val_loss.min < small"}, "val_loss.min is a number; 'small' is not"),
        ({"filter": "batch_size > 1e"}, "batch_size is a number"),
        ({"filter": "sync_batchnorm = maybe"}, "sync_batchnorm is true or false"),
        ({"filter": "; ".join(["lr < 1"] * 21)}, "at most 20 conditions"),
        ({"sort": "-"}, ""),
        ({"sort": "-nosuchthing"}, "'nosuchthing' is no field of a run, and no run has a metric of that name"),
        ({"sort": "val_los.min"}, "'val_los' is no field of a run, and no run has a metric of that name"),
        ({"filter": "val_los < 1"}, "'val_los' is no field of a run, and no run has a metric of that name"),
        ({"columns": "lr,val_los.max"}, "'val_los' is no field of a run, and no run has a metric of that name"),
    ],
)
def test_a_bad_condition_is_a_422_naming_it(table: tuple[TestClient, list[Generated]], params: dict[str, str],
                                            says: str) -> None:  # fmt: skip
    client, _made = table
    answer = client.get("/api/runs", params=params)
    if params.get("sort") == "-":  # "-" alone is the default order, descending by id
        assert answer.status_code == 200
        return
    assert answer.status_code == 422 and says in answer.json()["detail"][0]["msg"], answer.text
    assert answer.json()["detail"][0]["loc"] == ["query", next(iter(params))]
    page = client.get("/", params=params)  # the page says it too, as a page
    assert page.status_code == 422 and str(escape(says)) in page.text


def test_an_injection_in_a_condition_is_only_a_value(table: tuple[TestClient, list[Generated]]) -> None:
    client, made = table
    assert listed_ids(client, filter="name = x' OR '1'='1") == []
    assert client.get("/api/runs", params={"filter": "lr < 1; DROP TABLE runs"}).status_code == 422
    assert len(listed_ids(client)) == len(made)


def test_the_view_is_in_the_url_and_comes_back_the_same(table: tuple[TestClient, list[Generated]]) -> None:
    """What the page links (its poll, its pages, its bulk form's way back) is the same view: the same runs."""
    client, _made = table
    view = {"q": "best", "filter": "lr <= 0.001; val_loss.min < 1.5", "sort": "-val_loss.min", "columns": "lr,loss.min"}
    page = client.get("/", params=view).text
    poll = re.search(r'<div id="runs-table" hx-get="([^"]+)"', page)
    back = re.search(r'name="back" value="([^"]+)"', page)
    assert poll and back
    for link in (poll.group(1), back.group(1)):
        params = dict(parse_qsl(urlsplit(html.unescape(link)).query))
        params.pop("page_number")
        assert listed_ids(client, **params) == listed_ids(client, **view)
        assert params["filter"] == "lr <= 0.001; val_loss.min < 1.5" and params["sort"] == "-val_loss.min"
    assert 'value="lr &lt;= 0.001; val_loss.min &lt; 1.5"' in page  # the form shows it as typed


def test_tags_and_notes_are_kept_shown_and_searchable(table: tuple[TestClient, list[Generated]]) -> None:
    client, made = table
    run = made[5]
    answer = client.patch(f"/api/runs/{run.id}", json={"tags": ["keeper", "lr-sweep", "keeper"], "notes": "why it won"})
    assert answer.status_code == 200 and answer.json()["tags"] == ["keeper", "lr-sweep"]
    assert answer.json()["notes"] == "why it won"
    assert listed_ids(client, q="KEEPER") == [run.id]
    page = client.get(f"/runs/{run.id}").text
    assert ">keeper</a>" in page and "why it won" in page
    assert ">lr-sweep</a>" in client.get("/", params={"q": "keeper"}).text
    bad = client.patch(f"/api/runs/{run.id}", json={"tags": ["no spaces"]})
    assert bad.status_code == 422 and "'no spaces' is not a tag" in bad.text
    # The page's own form: tags separated by spaces or commas.
    posted = client.post(f"/runs/{run.id}/labels", data={"tags": "a, b c", "notes": ""}, follow_redirects=False)
    assert posted.status_code == 303 and client.get(f"/api/runs/{run.id}").json()["tags"] == ["a", "b", "c"]
    client.patch(f"/api/runs/{run.id}", json={"tags": run.tags, "notes": ""})


def test_archived_runs_leave_the_default_list_and_come_back(table: tuple[TestClient, list[Generated]]) -> None:
    client, made = table
    chosen = [made[1].id, made[2].id]
    assert client.post("/api/runs/bulk", json={"runs": chosen, "action": "archive"}).json()["done"] == chosen
    try:
        assert not set(chosen) & set(listed_ids(client))
        assert sorted(listed_ids(client, archived="only")) == sorted(chosen)
        assert len(listed_ids(client, archived="all")) == len(made)
    finally:
        client.post("/api/runs/bulk", json={"runs": chosen, "action": "unarchive"})
    assert set(chosen) <= set(listed_ids(client))


def test_bulk_tag_from_the_table_goes_back_to_the_same_view(table: tuple[TestClient, list[Generated]]) -> None:
    client, made = table
    chosen = [str(made[3].id), str(made[4].id)]
    back = "/?q=resnet&sort=name"
    answer = client.post("/runs/bulk", data={"run": chosen, "action": "tag", "tag": "picked", "back": back},
                         follow_redirects=False)  # fmt: skip
    assert answer.status_code == 303 and answer.headers["location"] == back
    assert sorted(listed_ids(client, q="picked")) == sorted(int(c) for c in chosen)
    client.post("/api/runs/bulk", json={"runs": [int(c) for c in chosen], "action": "untag", "tag": "picked"})
    assert listed_ids(client, q="picked") == []
    compare = client.post("/runs/bulk", data={"run": chosen, "action": "compare"}, follow_redirects=False)
    assert compare.headers["location"] == f"/compare?run={chosen[0]}&run={chosen[1]}"
    refused = client.post("/runs/bulk", data={"run": chosen, "action": "delete"})
    assert refused.status_code == 422 and "I mean it" in refused.text


def test_clone_fills_the_form_with_every_option_of_the_run(client: TestClient) -> None:
    """ "New run like this": every field of the form carries the run's value, none its default."""
    changed = {"name": "cloned one", "workload": "cnn", "nproc_per_node": 1, "epochs": 7, "batch_size": 17,
               "lr": 0.0042, "checkpoint_every": 3, "seed": 99, "keep_last": 2, "keep_best": 1,
               "best_metric": "epoch_loss",
               "init_from": "checkpoints/run-9/step-00000010.pt", "init_optimizer": True, "optimizer": "sgd",
               "lr_schedule": "cosine", "warmup_steps": 5, "weight_decay": 0.01, "grad_clip": 1.5, "grad_accum": 2,
               "precision": "bf16", "sync_batchnorm": True, "find_unused_parameters": True, "bucket_cap_mb": 50,
               "gradient_as_bucket_view": True, "val_every": 4, "checkpoint_unit": "step", "max_restarts": 2,
               "pg_timeout_s": 120, "nccl_env": {"NCCL_DEBUG": "INFO"}, "script": "train/mine.py",
               "script_args": ["--x", "1"], "launcher": "slurm", "slurm_nodes": 2, "slurm_gpus_per_node": 4,
               "slurm_cpus_per_task": 8, "slurm_time_limit": "1:00:00", "slurm_partition": "gpu",
               "slurm_account": "lab", "slurm_qos": "high", "slurm_constraint": "a100", "slurm_requeue": True,
               "slurm_max_requeues": 3, "stop_on_nonfinite": True, "fingerprint_every": 7,
               "desync_checks": True, "preflight": "refuse", "priority": 100, "preemptible": False}  # fmt: skip
    options = set(RunCreate.model_fields) - {"allow_low_disk"}
    assert set(changed) == options, f"a new option: give it a value here too: {options ^ set(changed)}"
    defaults = RunCreate().model_dump()
    assert all(changed[name] != defaults[name] for name in changed)
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = Run(**changed, status=RunStatus.succeeded, status_reason="")
        db.add(run)
        db.flush()
        run_id = run.id
    page = client.get(f"/runs/{run_id}").text
    assert f'href="/runs/new?from_run={run_id}"' in page and "New run like this" in page
    form = FormFields()
    form.feed(client.get("/runs/new", params={"from_run": run_id}).text)
    assert {name: form.values.get(name) for name in changed} == {name: _as_text(v) for name, v in changed.items()}


class FormFields(HTMLParser):
    """What a browser would post from a form: each field's value (a checkbox: "true" when ticked, else "false")."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self.select: str | None = None
        self.textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        name = found.get("name") or ""
        if tag == "input" and found.get("type") == "checkbox":
            self.values[name] = "true" if "checked" in found else "false"
        elif tag == "input":
            self.values[name] = found.get("value") or ""
        elif tag == "select":
            self.select = name
            self.values[name] = ""
        elif tag == "option" and self.select and "selected" in found:
            self.values[self.select] = found.get("value") or ""
        elif tag == "textarea":
            self.textarea = name
            self.values[name] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self.select = None
        elif tag == "textarea":
            self.textarea = None

    def handle_data(self, data: str) -> None:
        if self.textarea:
            self.values[self.textarea] += data


def _as_text(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "\n".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list):
        return "\n".join(value)
    return str(value)


def test_an_existing_database_gets_its_summaries_when_it_upgrades(tmp_path: Path) -> None:
    """A store from before 0011 with points in it: after the upgrade, its runs sort and filter by those metrics."""
    settings = Settings(data_dir=tmp_path / "data", shared_dir=tmp_path / "shared", supervise_interval_s=3600)
    with TestClient(create_app(settings)) as client:
        for losses in ([1.0 / step for step in range(1, 200)], [0.5, 0.25]):
            run_id = int(client.post("/api/runs", json={"name": "old"}).json()["id"])
            with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
                run = db.get(Run, run_id)
                run.status, run.token_hash = RunStatus.running, hash_token(TOKEN)
                run.pid, run.pid_start_ticks = os.getpid(), processes.start_ticks(os.getpid())
            points = tuple(wire.Point("loss", step, loss, 0, 0.0) for step, loss in enumerate(losses, start=1))
            client.post(f"/api/runs/{run_id}/metrics", json=wire.Batch(points).to_json(),
                        headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    downgrade(alembic_config(settings.sqlalchemy_url), "0010")  # as the store was before this migration
    engine = make_engine(settings.sqlalchemy_url)
    with engine.connect() as connection:
        assert "metric_summaries" not in inspect(connection).get_table_names()
    engine.dispose()
    upgrade(settings.sqlalchemy_url)
    with TestClient(create_app(settings)) as client:
        body = client.get("/api/runs", params={"columns": "loss.last,loss.min,loss.max", "sort": "loss.min"}).json()
        assert [run["id"] for run in body["items"]] == [1, 2], body["values"]
        assert body["values"]["1"] == pytest.approx({"loss.last": 1 / 199, "loss.min": 1 / 199, "loss.max": 1.0})
        assert body["values"]["2"] == pytest.approx({"loss.last": 0.25, "loss.min": 0.25, "loss.max": 0.5})


def test_every_kind_of_run_filters_and_sorts_on_its_config_keys(client: TestClient) -> None:
    assert_config_keys_filter_and_sort(client)


def assert_config_keys_filter_and_sort(client: TestClient) -> None:
    """Built-in runs, a run of a script, and runs launched elsewhere, each filtered, sorted and shown by the keys of
    its own config document: a number is compared as a number, a text as text, a flag as a flag, in SQL; no run
    shows, or matches on, a value it never had. (Also on PostgreSQL: tests/app/test_postgres.py.)"""
    shared = client.app.state.settings.shared  # type: ignore[attr-defined]
    shared.mkdir(parents=True, exist_ok=True)
    (shared / "train.py").write_text("print('hi')")
    small, big = (client.post("/api/runs", json={"name": "built-in", "lr": lr}).json()["id"] for lr in (3e-4, 3e-3))
    script = client.post("/api/runs", json={"script": "train.py", "script_args": ["--lr", "1e-5"]}).json()["id"]
    reported = [{"lr": 5e-4, "arch": "resnet", "optim": {"lr": 0.01}, "amp": True, "layers": 24},
                {"lr": "auto", "arch": "vit", "layers": 12}, {"amp": False, "arch": "3"}]  # fmt: skip
    ext = [_joined(client, f"job-{i}", config) for i, config in enumerate(reported)]

    def found(**params: str) -> list[int]:
        return listed_ids(client, **params)

    assert found(filter="lr < 1e-3") == [ext[0], small]  # a script's reported lr, not "auto", not a script's argument
    assert found(filter="epochs = 10") == [big, small]  # the runs that had the option, none of the others
    assert found(filter="config.arch = resnet") == [ext[0]] and found(filter='config.arch = "3"') == [ext[2]]
    assert found(filter="config.optim.lr < 0.1") == [ext[0]]
    assert found(filter="config.amp = true") == [ext[0]] and found(filter="config.amp = false") == [ext[2]]
    assert found(sort="config.layers") == [ext[1], ext[0], ext[2], script, big, small]  # then the runs without it
    assert found(sort="-lr") == [big, ext[0], small, ext[2], ext[1], script]
    body = client.get("/api/runs", params={"columns": "lr,config.arch,config.optim", "limit": 10}).json()
    assert body["values"][str(ext[0])] == {"lr": 5e-4, "config.arch": "resnet", "config.optim": '{"lr": 0.01}'}
    assert body["values"][str(script)] == {"lr": None, "config.arch": None, "config.optim": None}
    refused = client.get("/api/runs", params={"filter": "config.nope > 1"})
    assert refused.status_code == 422 and "no run's config has 'nope'" in refused.text
    hinted = client.get("/api/runs", params={"sort": "arch"})
    assert hinted.status_code == 422 and "runs' config has it: config.arch" in hinted.text
    page = client.get("/", params={"filter": "config.arch = resnet; lr < 0.001", "columns": "config.arch"}).text
    assert 'value="config.arch = resnet; lr &lt; 0.001"' in page and f'href="/runs/{ext[0]}"' in page


def _joined(client: TestClient, key: str, config: dict[str, Any]) -> int:
    body = {"key": key, "name": key, "config": config, "rank": 0, "world_size": 1, "local_world_size": 1, "host": "h"}
    answer = client.post("/api/runs/external", json=body)
    assert answer.status_code == 200, answer.text
    return int(answer.json()["run_id"])

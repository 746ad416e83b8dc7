"""The run page's charts: one per kind of metric the run has, none for what it lacks, and a live stream that starts
after what the charts already read instead of replaying the whole backlog. Its view (app/services/run_page.py): what
the GPUs bought, as the API tells it, and a view read once that renders with the database gone."""

from __future__ import annotations

import html
import json
import re
import time
from datetime import UTC, datetime

from fastapi.testclient import TestClient
from rankboard import wire

from app.auth.passwords import sha256 as hash_token
from app.core.models import Run, RunStatus
from app.core.settings import Settings
from app.services.run_page import run_page_view
from app.web.pages.runs import view_context
from app.web.templating import render_block
from tests.app.conftest import TOKEN, move_run, post, running_run
from tests.app.test_external import join
from tests.app.test_stream import events
from tests.chart_sections import ChartSections


def points(*keys: str, steps: range = range(1, 4), rank: int = 0) -> list[dict[str, object]]:
    return [wire.Point(key, step, float(step), rank, 1.7e9).to_json() for key in keys for step in steps]


def charts(page: str) -> dict[str, dict[str, object]]:
    """Each chart on the page by id, with the layout the page's script draws it from."""
    found = re.findall(r"<figure class=\"chart-box\" id=\"([\w-]+)-box\" data-chart='([^']*)'", page)
    return {chart_id: json.loads(spec.replace("&#34;", '"')) for chart_id, spec in found}


def labels(chart: dict[str, object]) -> list[str]:
    return [series["label"] for series in chart["series"]]  # type: ignore[attr-defined,index]


def test_the_page_shows_a_chart_for_each_kind_of_metric_the_run_has(client: TestClient, run_id: int) -> None:
    gpu = [f"gpu/{host}/{i}/{field}" for host in ("node-a", "node-b") for i in (0, 1) for field in wire.GPU_FIELDS]
    body = {"points": points("loss", "val_loss", "samples_per_s", *gpu) + points("rank/step_ms", rank=1)}
    assert post(client, run_id, body).status_code == 200

    shown = charts(client.get(f"/runs/{run_id}").text)
    gpu_charts = ["gpu-util", "gpu-memory", "gpu-power", "gpu-temp", "gpu-sm-clock", "gpu-run-mem", "gpu-energy",
                  "gpu-sm-active", "gpu-tensor-active", "gpu-dram-bw", "gpu-xid", "gpu-throttle", "gpu-ecc-volatile",
                  "gpu-ecc-aggregate", "gpu-remapped-rows", "gpu-remap-state", "gpu-retired-pending",
                  "gpu-pcie-replay"]  # fmt: skip
    assert list(shown)[:21] == ["loss", "throughput", "step-time", *gpu_charts]  # every GPU field it samples ...
    nvlink = [shown[chart]["title"] for chart in list(shown)[21:]]  # ... NVLink's counters each in a chart of its own
    assert nvlink == ["GPU nvlink crc data", "GPU nvlink crc flit", "GPU nvlink ecc data", "GPU nvlink recovery",
                      "GPU nvlink replay"]  # fmt: skip
    assert labels(shown["gpu-ecc-volatile"])[:2] == ["node-a GPU 0", "node-a GPU 0 double-bit"]
    assert labels(shown["loss"]) == ["train loss", "validation loss"]
    assert labels(shown["throughput"]) == ["samples/s"]  # no tokens/s: this run does not report it
    assert labels(shown["gpu-util"]) == ["node-a GPU 0", "node-a GPU 1", "node-b GPU 0", "node-b GPU 1"]
    assert "node-b GPU 1 mem total" in labels(shown["gpu-memory"])
    assert "node-a GPU 0 power limit" in labels(shown["gpu-power"])
    assert shown["gpu-util"]["time"] is True and shown["loss"]["time"] is False  # GPU samples are at unix seconds
    created = client.get(f"/api/runs/{run_id}").json()["created_at"]
    created_s = datetime.fromisoformat(created.replace("Z", "+00:00")).replace(tzinfo=UTC).timestamp()
    assert shown["gpu-util"]["start"] == int(created_s)  # the run's start, not 1970


ODD_KEYS = ["loss", "val_loss", "lr", "grad_norm", "val_accuracy", "a/b/c", "a/b/d", "a/loss", "train/acc",
            "train/loss", "val/acc", "val/loss", "损失", "ünï/x", "train/ünï", "my metric", "odd<&>'\"key",
            "rank/step_ms", "rank/allreduce_ms", "gpu/node-a/0/util", "gpu/node-a/0/mem_used",
            "gpu/node-a/0/mem_total", "sys/node-b/cpu_percent", "goodput/abcd1234.0/step", "forensics/divergence",
            *(f"many/k{i:03d}" for i in range(200))]  # fmt: skip
PER_RANK = ["loss", "train/loss", "rank/step_ms", "goodput/abcd1234.0/step"]
DASHBOARD_SECTIONS = ["rank", "gpu", "sys", "goodput", "forensics"]


def ingest_odd_keys(client: TestClient, run_id: int) -> None:
    """Three steps of every odd key (four ranks of the per-rank ones) through the ingest API, in batches."""
    body = [wire.Point(key, step, float(step), rank, 1.7e9 + step).to_json()
            for key in ODD_KEYS for rank in (range(4) if key in PER_RANK else [0]) for step in (1, 2, 3)]  # fmt: skip
    for start in range(0, len(body), 1000):
        assert post(client, run_id, {"points": body[start : start + 1000]}).status_code == 200


def expected_section(key: str) -> str:
    return key.split("/", 1)[0] if "/" in key else ""


def test_every_key_has_exactly_one_chart_in_the_section_its_prefix_names(client: TestClient, run_id: int) -> None:
    ingest_odd_keys(client, run_id)
    page = ChartSections(client.get(f"/runs/{run_id}").text)
    figures = page.figures()

    charted = [key for figure in figures for key in figure["keys"]]
    assert sorted(charted) == sorted(ODD_KEYS)  # every key, each once
    for figure in figures:
        assert {expected_section(key) for key in figure["keys"]} == {figure["section"]}, figure
    for section in page.sections:
        assert all(figure["section"] == section["name"] for figure in section["figures"])
    user = sorted({expected_section(key) for key in ODD_KEYS} - {""} - set(DASHBOARD_SECTIONS))
    assert [s["name"] for s in page.sections] == ["", *user, *DASHBOARD_SECTIONS]  # bare first, the dashboard's last
    assert len(next(s for s in page.sections if s["name"] == "many")["figures"]) == 200


def test_charts_are_ordered_loss_first_and_titled_by_their_keys(client: TestClient, run_id: int) -> None:
    ingest_odd_keys(client, run_id)
    sections = {s["name"]: s["figures"] for s in ChartSections(client.get(f"/runs/{run_id}").text).sections}

    assert [f["keys"] for f in sections["train"]] == [["train/loss"], ["train/acc"], ["train/ünï"]]
    assert [f["keys"] for f in sections["a"]] == [["a/loss"], ["a/b/c"], ["a/b/d"]]
    assert sections[""][0]["keys"] == ["loss", "val_loss"] and sections[""][0]["title"] == "Loss"
    titles = {f["keys"][0]: f["title"] for figures in sections.values() for f in figures if len(f["keys"]) == 1}
    assert titles["损失"] == "损失" and titles["odd<&>'\"key"] == "odd<&>'\"key" and titles["many/k007"] == "many/k007"
    assert not any(".py" in f["title"] for figures in sections.values() for f in figures)  # no source paths
    assert [f["id"] for f in sections["gpu"]] == ["gpu-util", "gpu-memory"]  # the dashboard's own order
    assert [s["label"] for s in sections["gpu"][1]["chart"]["series"]] == ["node-a GPU 0", "node-a GPU 0 mem total"]


def test_chart_ids_are_dom_safe_unique_and_the_same_for_a_key_on_any_page(client: TestClient, run_id: int) -> None:
    ingest_odd_keys(client, run_id)
    figures = ChartSections(client.get(f"/runs/{run_id}").text).figures()
    ids = [figure["id"] for figure in figures]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[a-z0-9-]+", i) for i in ids)
    assert all(figure["chart"]["id"] == figure["id"] for figure in figures)

    other = running_run(client, "fewer keys")
    assert post(client, other, {"points": points("train/loss", "损失", "my metric")}).status_code == 200
    again = {tuple(f["keys"]): f["id"] for f in ChartSections(client.get(f"/runs/{other}").text).figures()}
    first = {tuple(f["keys"]): f["id"] for f in figures}
    assert again == {key: first[key] for key in again}  # a link naming a chart names it on every run


def test_a_node_without_nvml_says_why_and_gets_cpu_and_memory_charts(client: TestClient, run_id: int) -> None:
    node = wire.Node("cpu-node", (), "NVML did not start: NVML Shared Library Not Found").to_json()
    sys_keys = [f"sys/cpu-node/{field}" for field in wire.SYS_FIELDS]
    assert post(client, run_id, {"points": points("loss", *sys_keys), "node": node}).status_code == 200

    page = client.get(f"/runs/{run_id}").text
    assert "No NVIDIA GPU found on cpu-node: NVML did not start: NVML Shared Library Not Found" in page
    shown = charts(page)
    assert list(shown) == ["loss", "cpu", "host-memory"]
    assert labels(shown["host-memory"]) == ["cpu-node", "cpu-node total"]


def test_a_run_without_metrics_shows_no_empty_charts(client: TestClient, run_id: int) -> None:
    page = client.get(f"/runs/{run_id}").text
    assert charts(page) == {} and "No metrics yet" in page


def test_the_stream_starts_after_the_points_the_charts_already_read(client: TestClient, run_id: int) -> None:
    backlog = [wire.Point("loss", step, 1.0, 0, 1.7e9).to_json() for step in range(1, 5001)]
    assert post(client, run_id, {"points": backlog}).status_code == 200
    page = client.get(f"/runs/{run_id}").text
    stream_url = re.search(r'data-stream="([^"]+)"', page)  # the points' stream static/run.js opens
    assert stream_url is not None
    assert post(client, run_id, {"points": points("loss", steps=range(5001, 5003))}).status_code == 200
    move_run(client, run_id, RunStatus.succeeded)  # so that the stream ends once it has sent everything

    received = [(kind, data) for kind, data, _id in events(client.get(html.unescape(stream_url[1])).text)]
    assert [kind for kind, _ in received] == ["points", "end"]  # the points alone: the fragments have their own stream
    assert json.loads(received[0][1])["series"]["loss"]["steps"] == [5001, 5002]  # not the 5,000 before them


def test_the_charts_fragment_alone_for_the_pages_script(client: TestClient, run_id: int) -> None:
    assert post(client, run_id, {"points": points("lr")}).status_code == 200
    fragment = client.get(f"/runs/{run_id}", headers={"HX-Target": "charts"}).text
    assert fragment.lstrip().startswith('<section id="charts"') and "<html" not in fragment
    assert list(charts(fragment)) == ["lr"]


def gpus_bought(client: TestClient, run_id: int) -> None:
    """What a 2-rank trainer on an H100 node reports of its FLOPs and all-reduce, and a preflight that found rank 1
    on another torch and slow."""
    h100 = wire.Node("node-a", tuple(wire.Gpu(i, f"GPU-a{i}", "NVIDIA H100 80GB HBM3") for i in (0, 1)))
    per_step = {"rank/comm_ms": 4.0, "rank/step_ms": 20.0, "rank/allreduce_ms": 9.0, "rank/backward_ms": 8.0,
                "rank/optimizer_ms": 1.0, "rank/buckets": 2.0}  # fmt: skip
    timings = [wire.Point(key, step, ms + rank, rank, 1.7e9) for step in range(1, 11) for rank in (0, 1)
               for key, ms in per_step.items()]  # fmt: skip
    progress = wire.Progress(epoch=0, epochs=1, step=10, total_steps=100, samples_per_s=1e6)
    batch = wire.Batch((wire.Point(wire.MODEL_FLOPS_KEY, 1, 457_728.0), *timings), progress, h100)
    assert post(client, run_id, batch.to_json()).status_code == 200
    checked = {"fingerprints": [{"torch": "2.9", "gpu": "H100"}, {"torch": "2.8", "gpu": "H100"}],
               "bus_gbps": [40.0, 2.0], "bytes": 1 << 20, "slow_ranks": [1], "seconds": 0.4, "at": 1.7e9,
               "mismatches": [{"field": "torch", "rank": 1, "value": "2.8", "common": "2.9"}]}  # fmt: skip
    app = client.app
    with app.state.sessions() as db:  # type: ignore[attr-defined]
        folder = app.state.folders.run_dir(db.get(Run, run_id))  # type: ignore[attr-defined]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / wire.PREFLIGHT_FILE).write_text(json.dumps(checked))


def test_the_page_shows_what_the_gpus_bought_as_the_api_tells_it(client: TestClient, run_id: int) -> None:
    gpus_bought(client, run_id)
    member = client.post("/api/runs", json={"name": "sweep 1p", "nproc_per_node": 1}).json()["id"]
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, member).sweep_of = run_id  # as a scaling sweep of the run queues it

    page = client.get(f"/runs/{run_id}").text
    flops = client.get(f"/api/runs/{run_id}/mfu").json()
    assert flops["gpu"] == "NVIDIA H100 80GB HBM3" and f"<strong>MFU {100 * flops['mfu']:.1f}%</strong>" in page
    share = client.get(f"/api/runs/{run_id}/comm").json()["share"]
    assert f'id="comm-share">{share:.0%} of each step waits on all-reduce' in page
    assert "Preflight: ranks differ" in page
    assert "Rank 1 has torch <code>2.8</code>; the others <code>2.9</code>." in page
    assert f'<a href="/runs/{member}">run {member}</a>' in page and '<tr data-processes="1">' in page
    assert "<strong>Goodput " in page


def test_the_view_is_read_once_and_renders_with_the_database_gone(client: TestClient, run_id: int) -> None:
    """The stream renders its fragments from a view whose session has closed: every part was read when it was made."""
    gpus_bought(client, run_id)
    state = client.app.state  # type: ignore[attr-defined]
    with state.sessions() as db:
        view = run_page_view(db, run_id=run_id, folders=state.folders, settings=state.settings)
    move_run(client, run_id, RunStatus.succeeded)  # after the read: the view still tells the moment it was read at

    status = render_block(state.templates, "run.html", "status", view_context(view))
    files = render_block(state.templates, "run.html", "files", view_context(view))
    assert 'id="status">running</span>' in status and "Stop</button>" in status and 'id="mfu"' in status
    assert "moved to succeeded" not in files and "created" in files  # the history as it was read
    assert "moved to succeeded by the test" in client.get(f"/runs/{run_id}").text  # a new view reads anew


# --- a page that fits the run it shows ---------------------------------------------------------------------------


def launched(client: TestClient, body: dict[str, object]) -> int:
    """A run made through the API and launched: running (its launch event recorded), holding the hash of TOKEN."""
    run_id = int(client.post("/api/runs", json=body).json()["id"])
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, run_id).token_hash = hash_token(TOKEN)
    move_run(client, run_id, RunStatus.running)
    return run_id


def script_run(client: TestClient, settings: Settings) -> int:
    (settings.shared / "jobs").mkdir(parents=True, exist_ok=True)
    (settings.shared / "jobs" / "train.py").write_text("from rankboard import report\n")
    return launched(client, {"script": "jobs/train.py", "script_args": ["--lr", "3e-4", "a b"], "nproc_per_node": 2})


def logged(steps: range, *keys: str, per_s: float = 4.0) -> dict[str, object]:
    """What a script's report.log sends: each key at each step, `per_s` steps a second by its clock."""
    return wire.Batch(tuple(wire.Point(key, step, 1.0 / step, 0, 1.7e9 + step / per_s) for step in steps
                            for key in keys or ("loss",))).to_json()  # fmt: skip


def declared(step: int, total: int) -> dict[str, object]:
    """What report.init(total_steps=...) and report.progress(...) send: no epoch, a total."""
    return wire.Batch((), wire.Progress(epoch=0, epochs=0, step=step, total_steps=total)).to_json()


def header(page: str) -> str:
    """The run page's status block: its title, facts, goodput and sweep; not its configuration."""
    return page.partition('id="run-status"')[2].partition('<details class="config">')[0]


def facts(page: str) -> dict[str, str]:
    """The facts row, by what each says: {"Step": "30", "Steps/s": "4", ...}."""
    row = header(page).partition('<dl class="facts">')[2].partition("</dl>")[0]
    return dict(re.findall(r"<dt>([^<]+)</dt><dd[^>]*>([^<]*)</dd>", row))


def goodput_line(page: str) -> str:
    return re.sub(r"\s+", " ", header(page).partition('id="goodput"')[2].partition("</p>")[0])


def test_a_scripts_run_shows_its_steps_and_rate_and_no_epoch_or_total_it_never_declared(
    client: TestClient, settings: Settings
) -> None:
    run_id = script_run(client, settings)
    assert post(client, run_id, logged(range(1, 31))).status_code == 200

    page = client.get(f"/runs/{run_id}").text
    # Its steps and their pace, from the clock of its own points: no epoch, no bar, no ETA, no samples it never sent.
    shown = facts(page)
    assert shown.keys() == {"Step", "Steps/s", "Elapsed"} and (shown["Step"], shown["Steps/s"]) == ("30", "4")
    assert "<progress" not in page and 'id="epoch"' not in page
    # A sweep trains a built-in workload for an epoch; this run has neither, so none is offered, and none is taken.
    assert "Scaling sweep" not in page
    refused = client.post(f"/api/runs/{run_id}/sweep")
    assert refused.status_code == 422 and "this run is of a script" in refused.text


def test_a_scripts_declared_total_gives_it_a_bar_and_an_eta(client: TestClient, settings: Settings) -> None:
    run_id = script_run(client, settings)
    assert post(client, run_id, logged(range(1, 31))).status_code == 200
    assert post(client, run_id, declared(30, 120)).status_code == 200

    page = client.get(f"/runs/{run_id}").text
    assert '<progress id="progress" max="120" value="30">' in page
    shown = facts(page)
    assert shown["Step"] == "30 of 120 (25.0%)" and shown["Steps/s"] == "4" and "ETA" in shown
    assert "Epoch" not in shown  # it declared a total, not epochs


def test_a_script_that_logs_its_throughput_is_shown_at_it(client: TestClient, settings: Settings) -> None:
    run_id = script_run(client, settings)
    tokens = [wire.Point("tokens_per_s", step, 52_000.0 + step, 0, 1.7e9 + step) for step in range(1, 11)]
    assert post(client, run_id, wire.Batch(tuple(tokens)).to_json()).status_code == 200
    assert facts(client.get(f"/runs/{run_id}").text)["Tokens/s"] == "52,010"  # its last
    batch = wire.Batch((wire.Point("samples_per_s", 11, 1234.5, 0, 1.7e9),)).to_json()
    assert post(client, run_id, batch).status_code == 200
    shown = facts(client.get(f"/runs/{run_id}").text)
    assert shown["Samples/s"] == "1,234" and "Tokens/s" not in shown and "Steps/s" not in shown


def test_a_scripts_goodput_is_not_itemized_on_the_page_as_in_the_api(client: TestClient, settings: Settings) -> None:
    run_id = script_run(client, settings)
    assert post(client, run_id, logged(range(1, 31))).status_code == 200

    answer = client.get(f"/api/runs/{run_id}/goodput").json()
    assert answer["itemized"] is False and answer["goodput"] is None
    known = [part["label"] for part in answer["parts"] if part["name"] != "unitemized"]
    assert "unitemized" in {part["name"] for part in answer["parts"]} and "training" not in known
    line = goodput_line(client.get(f"/runs/{run_id}").text)
    assert "<strong>Goodput not itemized</strong>" in line and "Goodput 0" not in line
    assert "its script sends no timings of its steps" in line
    assert all(label in line for label in known) and "waiting in the queue" in line


def test_new_run_like_a_scripts_run_starts_the_same_script_with_the_same_arguments(
    client: TestClient, settings: Settings
) -> None:
    run_id = script_run(client, settings)
    page = client.get(f"/runs/{run_id}").text
    assert f'<a class="button" id="clone" href="/runs/new?from_run={run_id}"' in page

    form = client.get("/runs/new", params={"from_run": run_id}).text
    script = str(settings.shared / "jobs" / "train.py")
    assert f'name="script" type="text" value="{script}"' in form
    assert re.search(r'name="script_args"[^>]*>\s*--lr\n3e-4\na b</textarea>', form)
    # The form as a person submits it unchanged: the same command, on as many processes.
    created = client.post("/runs", data=form_fields(form), follow_redirects=False)
    assert created.status_code == 303
    again = client.get(created.headers["location"].replace("/runs/", "/api/runs/")).json()
    assert (again["script"], again["script_args"], again["nproc_per_node"]) == (script, ["--lr", "3e-4", "a b"], 2)


def form_fields(form: str) -> dict[str, str]:
    """What the New-run form posts as it stands: each field's value (a ticked box's, a select's chosen option)."""
    fields = {}
    for tag, name, rest in re.findall(r"<(input|select|textarea)[^>]*?name=\"(\w+)\"([^>]*)>", form):
        if tag == "input" and 'type="checkbox"' in rest:
            if "checked" in rest:
                fields[name] = "true"
        elif tag == "input":
            fields[name] = html.unescape(re.search(r'value="([^"]*)"', rest)[1])  # type: ignore[index]
        elif tag == "textarea":
            text = form.partition(f'name="{name}"')[2].partition(">")[2].partition("</textarea>")[0]
            fields[name] = html.unescape(text)
        else:
            options = form.partition(f'name="{name}"')[2].partition("</select>")[0]
            fields[name] = html.unescape(re.findall(r'<option value="([^"]*)" selected', options)[-1])
    return fields


def test_a_run_launched_elsewhere_shows_what_it_reports_and_says_why_it_cannot_be_started_again(
    client: TestClient,
) -> None:
    joined = [join(client, rank=rank) for rank in (0, 1)]
    run_id = joined[0]["run_id"]
    answer = client.post(f"/api/runs/{run_id}/metrics", json=logged(range(1, 21), per_s=2.0),
                         headers={"Authorization": f"Bearer {joined[0]['token']}"})  # fmt: skip
    assert answer.status_code == 200

    page = client.get(f"/runs/{run_id}").text
    shown = facts(page)
    assert (shown["Step"], shown["Steps/s"]) == ("20", "2") and "Epoch" not in shown and "ETA" not in shown
    assert "<progress" not in page and "Scaling sweep" not in page
    assert "<strong>Goodput not itemized</strong>" in goodput_line(page)
    assert client.get(f"/api/runs/{run_id}/goodput").json()["itemized"] is False
    # Its command is known only where it was started: no link to a form that could not start it.
    assert 'id="clone"' not in page
    assert "No “New run like this”: it was launched elsewhere, and Rankboard does not know its command." in page

    answer = client.post(f"/api/runs/{run_id}/metrics", json=declared(20, 200),
                         headers={"Authorization": f"Bearer {joined[0]['token']}"})  # fmt: skip
    assert answer.status_code == 200
    page = client.get(f"/runs/{run_id}").text
    assert '<progress id="progress" max="200" value="20">' in page and facts(page)["Step"] == "20 of 200 (10.0%)"


def test_the_built_in_trainers_page_shows_its_epochs_total_samples_and_goodput(client: TestClient) -> None:
    run_id = launched(client, {"name": "built-in", "epochs": 5, "nproc_per_node": 1})
    assert facts(client.get(f"/runs/{run_id}").text)["Epoch"] == "0 of 5"  # its places held until it reports
    now = time.time()
    ledger = {"start": now - 2, "at": now, "startup_launch": 0.5, "step": 1.0, "data": 0.5, "first_step": 0.0,
              "step_reached": 40.0}  # fmt: skip
    points = tuple(wire.Point(wire.GOODPUT_KEY.format(attempt="walk0000.0", field=field), 1, value, 0, now)
                   for field, value in ledger.items())  # fmt: skip
    progress = wire.Progress(epoch=2, epochs=5, step=40, total_steps=100, samples_per_s=812.5)
    assert post(client, run_id, wire.Batch(points, progress).to_json()).status_code == 200

    page = client.get(f"/runs/{run_id}").text
    shown = facts(page)
    assert (shown["Epoch"], shown["Step"], shown["Samples/s"]) == ("2 of 5", "40 of 100 (40.0%)", "812")
    assert "ETA" in shown and '<progress id="progress" max="100" value="40">' in page
    goodput = client.get(f"/api/runs/{run_id}/goodput").json()  # a live run's: a moment after the page's
    assert goodput["itemized"] is True and goodput["goodput"] > 0
    assert re.search(r"<strong>Goodput \d+\.\d%</strong>", goodput_line(page)) and "not itemized" not in page
    assert "Scaling sweep</button>" in page and f'id="clone" href="/runs/new?from_run={run_id}"' in page

"""The run page's charts: one per kind of metric the run has, none for what it lacks, and a live stream that starts
after what the charts already read instead of replaying the whole backlog. Its view (app/services/run_page.py): what
the GPUs bought, as the API tells it, and a view read once that renders with the database gone."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

from fastapi.testclient import TestClient
from rankboard import wire

from app.core.models import Run, RunStatus
from app.services.run_page import run_page_view
from app.web.pages.runs import view_context
from app.web.templating import render_block
from tests.app.conftest import move_run, post
from tests.app.test_stream import events


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
    assert list(shown) == ["loss", "throughput", "step-time", "gpu-util", "gpu-memory", "gpu-power"]
    assert labels(shown["loss"]) == ["train loss", "validation loss"]
    assert labels(shown["throughput"]) == ["samples/s"]  # no tokens/s: this run does not report it
    assert labels(shown["gpu-util"]) == ["node-a GPU 0", "node-a GPU 1", "node-b GPU 0", "node-b GPU 1"]
    assert "node-b GPU 1 mem total" in labels(shown["gpu-memory"])
    assert "node-a GPU 0 power limit" in labels(shown["gpu-power"])
    assert shown["gpu-util"]["time"] is True and shown["loss"]["time"] is False  # GPU samples are at unix seconds
    created = client.get(f"/api/runs/{run_id}").json()["created_at"]
    created_s = datetime.fromisoformat(created.replace("Z", "+00:00")).replace(tzinfo=UTC).timestamp()
    assert shown["gpu-util"]["start"] == int(created_s)  # the run's start, not 1970


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
    stream_url = re.search(r'sse-connect="([^"]+)"', page)
    assert stream_url is not None
    assert post(client, run_id, {"points": points("loss", steps=range(5001, 5003))}).status_code == 200
    move_run(client, run_id, RunStatus.succeeded)  # so that the stream ends once it has sent everything

    received = [(kind, data) for kind, data, _id in events(client.get(stream_url[1]).text) if kind == "points"]
    assert len(received) == 1
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

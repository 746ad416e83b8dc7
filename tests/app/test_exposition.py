"""/metrics: Prometheus' own parser reads it, and its numbers are the API's; off by default; behind the login."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from rankboard import wire

from app.auth.passwords import sha256 as hash_token
from app.core.models import Role, Run, RunStatus
from app.core.settings import Settings
from app.main import create_app
from app.services import tokens
from tests.app.conftest import TOKEN, post

NOW = 1_790_000_000
ROOT = Path(__file__).resolve().parents[2]


def make_settings(root: Path, **extra: Any) -> Settings:
    return Settings(data_dir=root / "data", shared_dir=root / "shared", supervise_interval_s=3600, slots=2, **extra)


def open_run(client: TestClient, name: str) -> int:
    """A run as the launcher leaves it once torchrun is up: running, holding the hash of its token."""
    run_id = int(client.post("/api/runs", json={"name": name}).json()["id"])
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        run = db.get(Run, run_id)
        run.status, run.token_hash = RunStatus.running, hash_token(TOKEN)
    return run_id


def gpu_points(host: str, index: int, at: int, util: float) -> list[wire.Point]:
    fields = {"util": util, "mem_used": 3e9 + at, "mem_total": 8e10, "power": 250.0 + index}
    health = ("ecc_sbe_volatile", "ecc_dbe_volatile", "remap_pending", "remap_failure", "pcie_replay", "throttle")
    fields |= dict.fromkeys(health, 0.0) | {"xid": 79.0}  # a GPU that reports its health, and one Xid
    return [wire.Point(wire.GPU_KEY.format(host=host, index=index, field=f), at, v, 0, at) for f, v in fields.items()]


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, dict[int, dict[str, Any]]]]:
    """A server with two live runs fed through the ingest endpoint (steps, losses, GPU samples of two nodes, one
    batch sent twice), a queued run and a stopped one."""
    with TestClient(create_app(make_settings(tmp_path_factory.mktemp("prom"), prometheus=True))) as client:
        fed: dict[int, dict[str, Any]] = {}
        for n, name in enumerate(['with "quotes" \\ and\nnewline', "plain"]):
            run_id = open_run(client, name)
            points = [wire.Point("loss", step, 1.0 / (step + n), 0, NOW + step) for step in range(1, 11)]
            for at, util in ((NOW, 10.0), (NOW + 5, 55.0 + n)):  # the newer sample is the one shown
                points += gpu_points("node-a", 0, at, util) + gpu_points(f"node-{n}", 1, at, util + 1)
            progress = wire.Progress(epoch=1, epochs=1, step=10, total_steps=100, samples_per_s=123.5 + n)
            body = wire.Batch(tuple(points), progress=progress).to_json()
            assert post(client, run_id, body).status_code == 200
            assert post(client, run_id, body).json()["stored"] == 0  # a retry: accepted, not stored
            fed[run_id] = {"points": len(points)}
        client.post("/api/runs", json={"name": "waits"})
        stopped = client.post("/api/runs", json={"name": "stopped"}).json()["id"]
        client.post(f"/api/runs/{stopped}/stop")
        yield client, fed


def families(text: str) -> dict[str, list[Any]]:
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def test_the_official_parser_reads_it_and_each_runs_numbers_are_the_apis(scraped: Any) -> None:
    client, fed = scraped
    answer = client.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    got = families(answer.text)
    for run_id in fed:
        run = client.get(f"/api/runs/{run_id}").json()
        loss = client.get(f"/api/runs/{run_id}/metrics/loss").json()["points"][-1]["value"]
        mine = {"run_id": str(run_id), "run_name": run["name"]}  # the name with quotes and a newline, unescaped
        assert [s.value for s in got["rankboard_run_step"] if s.labels == mine] == [run["step"]] == [10]
        assert [s.value for s in got["rankboard_run_samples_per_second"] if s.labels == mine] == [run["samples_per_s"]]
        assert [s.value for s in got["rankboard_run_loss"] if s.labels == mine] == [loss]
        for host, index in (("node-a", 0), (f"node-{run_id - min(fed)}", 1)):
            key = wire.GPU_KEY.format(host=host, index=index, field="{}")
            newest = {f: client.get(f"/api/runs/{run_id}/metrics/{key.format(f)}").json()["points"][-1]["value"]
                      for f in ("util", "mem_used", "power")}  # fmt: skip
            gpu = {"run_id": str(run_id), "host": host, "gpu": str(index)}
            assert [s.value for s in got["rankboard_gpu_utilization_ratio"] if s.labels == gpu] == [
                newest["util"] / 100
            ]
            assert [s.value for s in got["rankboard_gpu_memory_used_bytes"] if s.labels == gpu] == [newest["mem_used"]]
            assert [s.value for s in got["rankboard_gpu_power_watts"] if s.labels == gpu] == [newest["power"]]


def test_runs_by_state_queue_and_ingest_counters(scraped: Any) -> None:
    client, fed = scraped
    got = families(client.get("/metrics").text)
    by_status = {s.labels["status"]: s.value for s in got["rankboard_runs"]}
    listed = {status.value: client.get("/api/runs", params={"status": status.value}).json()["total"]
              for status in RunStatus}  # fmt: skip
    assert by_status == listed and (listed["running"], listed["queued"], listed["stopped"]) == (2, 1, 1)
    assert [s.value for s in got["rankboard_queue_length"]] == [1]
    # The parser names a counter's family without `_total`; its sample keeps it.
    accepted = got["rankboard_ingest_points_accepted"]
    assert [(s.name, s.value) for s in accepted] == [
        ("rankboard_ingest_points_accepted_total", 2 * sum(f["points"] for f in fed.values()))
    ]
    assert [s.value for s in got["rankboard_ingest_points_stored"]] == [sum(f["points"] for f in fed.values())]
    assert [s.value for s in got["rankboard_ingest_batches"]] == [4]
    assert {s.labels["run_id"] for s in got["rankboard_run_step"]} == {str(r) for r in fed}  # live runs only


def test_off_unless_asked_for(client: TestClient) -> None:
    assert client.get("/metrics").status_code == 404


def test_with_authentication_on_it_needs_a_viewer_or_a_token(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, prometheus=True, admin_password=SecretStr("a-long-admin-password"))
    with TestClient(create_app(settings)) as client:
        refused = client.get("/metrics", headers={"Accept": "text/plain"})
        assert refused.status_code == 401 and "rankboard_runs" not in refused.text
        with client.app.state.sessions() as db:  # type: ignore[attr-defined]
            secret = tokens.create_token(db, name="prom", role=Role.viewer, expires="1d", owner="admin",
                                         actor="test").secret  # fmt: skip
        scraped = client.get("/metrics", headers={"Authorization": f"Bearer {secret}"})
        assert scraped.status_code == 200 and "rankboard_runs" in families(scraped.text)


def test_the_readme_names_every_metric_served_and_no_other(scraped: Any) -> None:
    client, _fed = scraped
    readme = (ROOT / "README.md").read_text()
    monitoring = readme.split("## Monitoring: Prometheus and alerts", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"rankboard_[a-z_]+", monitoring))
    served = {sample.name for samples in families(client.get("/metrics").text).values() for sample in samples}
    assert documented == served


def test_the_grafana_dashboard_asks_only_for_metrics_that_are_served(scraped: Any) -> None:
    client, _fed = scraped
    dashboard = json.loads((ROOT / "examples" / "grafana_dashboard.json").read_text())
    asked = {name for panel in dashboard["panels"] for target in panel["targets"]
             for name in re.findall(r"rankboard_[a-z_]+", target["expr"])}  # fmt: skip
    served = {sample.name for samples in families(client.get("/metrics").text).values() for sample in samples}
    assert asked and asked <= served, asked - served

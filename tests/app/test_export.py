"""Export: a run or a set of runs as Parquet or CSV (a zip of points and runs, or one table), from the API, the runs
table's Export button and `rankboard runs export`; every point exactly as the series API answers it."""

from __future__ import annotations

import csv
import html
import io
import json
import math
import re
import zipfile
from pathlib import Path

import pyarrow.parquet as parquet
import pytest
from fastapi.testclient import TestClient
from rankboard import wire

from app.services import export
from tests.app.conftest import post, running_run
from tests.live import LiveServer, open_run

Point = tuple[int, str, int, int, float, float]  # run, key, rank, step, time, value


def send(client: TestClient, run_id: int, keys: tuple[str, ...], ranks: int = 2) -> None:
    """Points of each key on each rank: more steps than the export reads at once (across a wide gap), with NaN,
    infinities and -0.0 among the values, each with a time of its own."""
    steps = [*range(0, 1500), *range(export.EXPORT_STEPS * 2 - 3, export.EXPORT_STEPS * 2 + 3), 10**12]
    odd = [math.nan, math.inf, -math.inf, -0.0, 0.1 + 0.2]
    points = [wire.Point(key, step, odd[step % 5] if step % 97 == 0 else step / 7 + rank, rank, 1.7e9 + step / 3)
              for key in keys for step in steps for rank in range(ranks)]  # fmt: skip
    for start in range(0, len(points), wire.MAX_POINTS_PER_BATCH):
        batch = wire.Batch(tuple(points[start : start + wire.MAX_POINTS_PER_BATCH]))
        assert post(client, run_id, batch.to_json()).status_code == 200


def from_api(client: TestClient, run_ids: list[int]) -> list[Point]:
    """Every point of the runs, through the series API, in run, key, step and rank order."""
    found: list[Point] = []
    for run_id in run_ids:
        for key in client.get(f"/api/runs/{run_id}/metrics").json():
            text = client.get(f"/api/runs/{run_id}/metrics/{key}", params={"format": "csv"}).text
            found += [(run_id, key, int(r["rank"]), int(r["step"]), float(r["time"]), float(r["value"]))
                      for r in csv.DictReader(io.StringIO(text))]  # fmt: skip
    return found


def assert_same(got: list[Point], want: list[Point]) -> None:
    assert [p[:5] for p in got] == [p[:5] for p in want]
    for (*_, value), (*_, expected) in zip(got, want, strict=True):
        assert (value == expected and math.copysign(1, value) == math.copysign(1, expected)) or (
            math.isnan(value) and math.isnan(expected)
        )


def parquet_points(data: bytes) -> list[Point]:
    rows = parquet.read_table(io.BytesIO(data)).to_pylist()
    return [(r["run"], r["key"], r["rank"], r["step"], r["time"], r["value"]) for r in rows]


def test_a_zip_of_parquet_holds_every_point_of_each_run_and_each_run_with_its_config(client: TestClient) -> None:
    first, second = running_run(client, "first"), running_run(client, "second")
    send(client, first, ("loss", "train/acc"))
    send(client, second, ("loss",), ranks=1)
    client.patch(f"/api/runs/{second}", json={"tags": ["baseline"], "notes": "kept"})
    answer = client.get("/api/export", params=[("run", second), ("run", first)])
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/zip"
    assert 'filename="rankboard-runs-' in answer.headers["content-disposition"]
    bundle = zipfile.ZipFile(io.BytesIO(answer.content))
    assert sorted(bundle.namelist()) == ["points.parquet", "runs.parquet"]
    assert_same(parquet_points(bundle.read("points.parquet")), from_api(client, [second, first]))
    runs = parquet.read_table(io.BytesIO(bundle.read("runs.parquet"))).to_pylist()
    assert [(r["run"], r["name"], json.loads(r["tags"]), r["notes"]) for r in runs] == [
        (second, "second", ["baseline"], "kept"), (first, "first", [], "")]  # fmt: skip
    assert json.loads(runs[0]["config"]) == client.get(f"/api/runs/{second}").json()["config"]
    assert list(runs[0]) == list(export.RUNS.names)


def test_one_table_as_csv_has_the_same_points_and_runs(client: TestClient) -> None:
    run_id = running_run(client)
    send(client, run_id, ("loss",))
    answer = client.get("/api/export/points", params={"run": run_id, "format": "csv"})
    assert answer.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(answer.text)))
    got = [(int(r["run"]), r["key"], int(r["rank"]), int(r["step"]), float(r["time"]), float(r["value"]))
           for r in rows]  # fmt: skip
    assert_same(got, from_api(client, [run_id]))
    [row] = csv.DictReader(io.StringIO(client.get("/api/export/runs", params={"run": run_id, "format": "csv"}).text))
    assert (int(row["run"]), row["status"]) == (run_id, "running")


def test_an_unknown_run_is_a_404_before_any_byte(client: TestClient) -> None:
    run_id = running_run(client)
    for path in ("/api/export", "/api/export/points", "/api/export/runs"):
        answer = client.get(path, params=[("run", run_id), ("run", 999)])
        assert answer.status_code == 404 and answer.json()["detail"] == "run 999 does not exist"
    assert client.get("/api/export").status_code == 422  # no run named


def test_the_runs_tables_export_button_downloads_the_ticked_runs(client: TestClient) -> None:
    first, second = running_run(client, "a"), running_run(client, "b")
    page = client.get("/").text
    assert 'formaction="/runs/export"' in page and 'id="bulk-export"' in page
    answer = client.post("/runs/export", data={"run": [str(first), str(second)], "format": "csv"},
                         follow_redirects=False)  # fmt: skip
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/api/export?run={first}&run={second}&format=csv"
    bundle = zipfile.ZipFile(io.BytesIO(client.get(answer.headers["location"]).content))
    assert sorted(bundle.namelist()) == ["points.csv", "runs.csv"]


def test_the_run_pages_export_links_download_its_points(client: TestClient) -> None:
    run_id = running_run(client, "one")
    send(client, run_id, ("loss", "train/acc"))
    links = re.findall(r'href="(/api/export\?run=\d+[^"]*)" download', client.get(f"/runs/{run_id}").text)
    page_links = [html.unescape(link) for link in links]
    assert page_links == [f"/api/export?run={run_id}", f"/api/export?run={run_id}&format=csv"]
    bundle = zipfile.ZipFile(io.BytesIO(client.get(html.unescape(links[1])).content))
    with bundle.open("points.csv") as points:
        assert len(points.read().decode().splitlines()) - 1 == len(from_api(client, [run_id]))  # every point


def test_the_command_line_streams_the_export_to_a_file(live_server: LiveServer, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from rankboard import cli

    run_id = open_run(live_server, "a-token")
    target = tmp_path / "runs.zip"
    assert cli.main(["export", str(run_id), "-o", str(target), "--url", live_server.url]) == 0
    assert f"wrote {target}" in capsys.readouterr().out
    assert sorted(zipfile.ZipFile(target).namelist()) == ["points.parquet", "runs.parquet"]
    assert cli.main(["export", "999", "-o", str(tmp_path / "no.zip"), "--url", live_server.url]) == 1
    assert "404: run 999 does not exist" in capsys.readouterr().err and not list(tmp_path.glob("*no.zip*"))

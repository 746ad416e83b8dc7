"""A series as CSV (`GET /api/runs/{id}/metrics/{key}?format=csv`, or `Accept: text/csv`): the same points as its
JSON pages, every one of the range, each float exactly as stored; JSON stays the default."""

from __future__ import annotations

import csv
import io
import math
import random

from fastapi.testclient import TestClient
from rankboard import wire

from app.services import metrics
from tests.app.conftest import post

KEY = "train/loss"
# (step, rank) -> (value, time)
Stored = dict[tuple[int, int], tuple[float, float]]
FAR = 10**12  # a step far past the others: reading on to it must be one seek, not a million reads


def send_points(client: TestClient, run_id: int, rng: random.Random) -> Stored:
    """Four ranks of a key, over more steps than a CSV reads at once and across a wide gap: NaN, infinities, the
    smallest subnormal and sums that only repr writes exactly, each point's own unix time to the microsecond."""
    odd = [math.nan, math.inf, -math.inf, 5e-324, 0.1 + 0.2, -0.0, 1e308]
    steps = sorted({*range(0, 3000), *rng.sample(range(3000, 3 * metrics.CSV_STEPS), 2000), FAR, FAR + 1})
    points: Stored = {}
    for step in steps:
        for rank in range(4):
            value = rng.choice(odd) if rng.random() < 0.05 else rng.gauss() * 10 ** rng.randrange(-8, 8)
            points[step, rank] = (value, 1_763_000_000 + rng.randrange(10**12) / 1e6)
    items = list(points.items())
    for start in range(0, len(items), wire.MAX_POINTS_PER_BATCH):
        batch = [wire.Point(KEY, s, v, r, t) for (s, r), (v, t) in items[start : start + wire.MAX_POINTS_PER_BATCH]]
        assert post(client, run_id, wire.Batch(tuple(batch)).to_json()).status_code == 200
    return points


def json_points(client: TestClient, run_id: int, **params: int) -> list[tuple[int, int, float, float]]:
    """Every point of the range through the JSON pages, in their order."""
    found: list[tuple[int, int, float, float]] = []
    cursor = {"start_step": params.pop("start_step", 0), "start_rank": params.pop("start_rank", 0)}
    while True:
        page = client.get(f"/api/runs/{run_id}/metrics/{KEY}", params={**params, **cursor, "limit": 5000}).json()
        found += [(p["step"], p["rank"], wire.decode_value(p["value"]), p["time"]) for p in page["points"]]
        if page["next_step"] is None:
            return found
        cursor = {"start_step": page["next_step"], "start_rank": page["next_rank"]}


def csv_points(text: str) -> list[tuple[int, int, float, float]]:
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["step", "rank", "value", "time"]
    return [(int(step), int(rank), float(value), float(time)) for step, rank, value, time in rows[1:]]


def assert_same(got: list[tuple[int, int, float, float]], want: list[tuple[int, int, float, float]]) -> None:
    assert [(s, r) for s, r, _, _ in got] == [(s, r) for s, r, _, _ in want]
    for (_, _, value, time), (_, _, want_value, want_time) in zip(got, want, strict=True):
        assert time == want_time and (value == want_value or (math.isnan(value) and math.isnan(want_value)))
        assert math.copysign(1, value) == math.copysign(1, want_value)  # -0.0 stays -0.0


def test_csv_holds_exactly_the_points_of_the_json_pages(client: TestClient, run_id: int) -> None:
    assert_csv_holds_the_json_points(client, run_id)


def assert_csv_holds_the_json_points(client: TestClient, run_id: int) -> None:
    """The whole series and ranges of it (from a cursor inside a step, past the gap, nothing): CSV and JSON agree."""
    stored = send_points(client, run_id, random.Random(3))
    url = f"/api/runs/{run_id}/metrics/{KEY}"
    whole = json_points(client, run_id)
    assert len(whole) == len(stored)
    answer = client.get(url, params={"format": "csv"})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/csv")
    assert_same(csv_points(answer.text), whole)
    fields = {field for row in csv.reader(io.StringIO(answer.text)) for field in row}
    assert {"NaN", "inf", "-inf", "5e-324", "0.30000000000000004", "-0.0"} <= fields  # as repr writes them
    assert client.get(url, headers={"Accept": "text/csv"}).text == answer.text
    for params in ({"start_step": 2500, "end_step": 2 * metrics.CSV_STEPS}, {"start_step": 7, "start_rank": 2},
                   {"start_step": 100_000}, {"end_step": 0}, {"start_step": FAR + 1, "start_rank": 3}):  # fmt: skip
        answer = client.get(url, params={**params, "format": "csv"})
        assert_same(csv_points(answer.text), json_points(client, run_id, **params))


def test_csv_with_a_limit_ends_where_the_next_request_goes_on(client: TestClient, run_id: int) -> None:
    send_points(client, run_id, random.Random(4))
    url = f"/api/runs/{run_id}/metrics/{KEY}"
    whole = json_points(client, run_id)
    first = csv_points(client.get(url, params={"format": "csv", "limit": 1001}).text)
    step, rank = first[-1][:2]
    rest = csv_points(client.get(url, params={"format": "csv", "start_step": step, "start_rank": rank + 1}).text)
    assert_same(first + rest, whole)
    assert len(first) == 1001


def test_json_stays_the_default_and_a_wrong_format_names_the_field(client: TestClient, run_id: int) -> None:
    post(client, run_id, wire.Batch((wire.Point(KEY, 1, 0.5, 0, 1.7e9),)).to_json())
    url = f"/api/runs/{run_id}/metrics/{KEY}"
    browser, both = {"Accept": "text/html,*/*;q=0.8"}, {"Accept": "application/json, text/csv;q=0.5"}
    for headers, params in [({}, {}), (browser, {}), (both, {}), ({"Accept": "text/csv"}, {"format": "json"})]:
        answer = client.get(url, headers=headers, params=params)
        assert answer.headers["content-type"] == "application/json" and answer.json()["points"][0]["value"] == 0.5
    assert (
        client.get(url, headers={"Accept": "text/csv, application/json;q=0.9"}).text
        == "step,rank,value,time\n1,0,0.5,1700000000.0\n"
    )
    wrong = client.get(url, params={"format": "xml"})
    assert wrong.status_code == 422 and wrong.json()["detail"][0]["loc"] == ["query", "format"]
    unknown = client.get(f"/api/runs/{run_id}/metrics/los", params={"format": "csv"})
    assert unknown.status_code == 404 and "'los'" in unknown.json()["detail"]
    assert client.get(f"/api/runs/999/metrics/{KEY}", params={"format": "csv"}).status_code == 404

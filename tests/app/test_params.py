"""Every number and path a URL or a body carries is bounded at the edge: past the bound, a 4xx naming it, never a 500.

Numbers beyond 64 bits used to reach SQLite (OverflowError) and names over 255 bytes the file system (File name too
long): both were 500s, on the API and on the pages alike.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import annotated_types
import pytest
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient

from app.core.models import Run, RunStatus
from app.core.settings import Settings
from app.main import create_app

BIG = str(2**64)  # past any integer SQLite takes
LONG = "a" * 300  # past NAME_MAX (255 bytes)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """An app with run 1, finished (so that its live streams end), and a folder in the shared storage."""
    root = tmp_path_factory.mktemp("params")
    settings = Settings(data_dir=root / "data", shared_dir=root / "shared", supervise_interval_s=3600, slots=2)
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        assert test_client.post("/api/runs", json={"name": "bounds"}).status_code == 201
        with test_client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
            db.get(Run, 1).status = RunStatus.succeeded
        (settings.shared / "datasets").mkdir()
        yield test_client


def deep_path() -> str:
    """4096 characters in names of at most 250 bytes: allowed in the query, but with the shared folder's own path in
    front, longer than the 4096 bytes a system call takes."""
    return "/".join(["b" * 250] * 16) + "/" + "c" * 80


API_CASES = [
    ("GET", f"/api/runs/{BIG}", "run_id"),
    ("POST", f"/api/runs/{BIG}/stop", "run_id"),
    ("GET", f"/api/runs/{BIG}/logs", "run_id"),
    ("GET", f"/api/runs?offset={BIG}", "offset"),
    ("GET", f"/api/runs?limit={BIG}", "limit"),
    ("GET", f"/api/runs/1/metrics/loss?start_step={BIG}", "start_step"),
    ("GET", f"/api/runs/1/metrics/loss?end_step={BIG}", "end_step"),
    ("GET", f"/api/runs/1/chart?key=loss&start_step={BIG}", "start_step"),
    ("GET", f"/api/runs/1/chart?key=loss&end_step={BIG}", "end_step"),
    ("GET", f"/api/runs/1/chart?key=loss&rank={BIG}", "rank"),
    ("GET", f"/api/runs/1/output?lines={BIG}", "lines"),
    ("GET", f"/api/runs/1/logs/0/stdout?lines={BIG}", "lines"),
    ("GET", f"/api/runs/1/logs/{BIG}/stdout", "rank"),
    ("GET", f"/api/files?path={LONG}", "path"),
    ("GET", f"/api/files?path=datasets/{'é' * 200}", "path"),  # 200 characters, 400 bytes
    ("GET", f"/api/files/download?path=datasets/{LONG}", "path"),
    ("GET", f"/api/files/inspect?path={LONG}/step-1.pt", "path"),
    ("GET", f"/api/runs/1/checkpoints/{LONG}", "name"),
    ("DELETE", f"/api/runs/1/checkpoints?name={LONG}", "name"),
    ("GET", f"/api/runs/1/metrics/{'k' * 300}", "key"),
    ("GET", f"/api/runs/1/logs/0/{'s' * 300}", "stream"),
]


@pytest.mark.parametrize(("method", "url", "param"), API_CASES)
def test_the_api_answers_an_out_of_bounds_parameter_with_422_naming_it(
    client: TestClient, method: str, url: str, param: str
) -> None:
    response = client.request(method, url)
    assert response.status_code == 422, response.text
    assert any(param in error["loc"] for error in response.json()["detail"]), response.text


@pytest.mark.parametrize("field", ["script", "init_from"])
@pytest.mark.parametrize("value", [LONG, f"datasets/{LONG}.py"])
def test_a_run_whose_file_is_named_too_long_is_refused_naming_the_field(
    client: TestClient, field: str, value: str
) -> None:
    response = client.post("/api/runs", json={"name": "long", field: value})
    assert response.status_code == 422, response.text
    error = response.json()["detail"][0]
    assert error["loc"] == ["body", field] and "bytes" in error["msg"], error


def test_a_shared_path_too_long_in_all_is_refused_naming_it(client: TestClient) -> None:
    response = client.get("/api/files", params={"path": deep_path()})
    assert response.status_code == 422, response.text
    error = response.json()["detail"][0]
    assert error["loc"] == ["query", "path"] and "shorter than 4096 bytes" in error["msg"], error


@pytest.mark.parametrize("body", [{"seed": 2**64}, {"epochs": 2**64}, {"nproc_per_node": 2**70}])
def test_a_run_with_a_number_beyond_64_bits_is_refused(client: TestClient, body: dict[str, Any]) -> None:
    response = client.post("/api/runs", json={"name": "big", **body})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", *body]


@pytest.mark.parametrize(
    "progress",
    [{"epoch": 2**31}, {"step": 2**62 + 1}, {"total_steps": 2**64}, {"epochs": 2**63}],
)
def test_a_batch_with_a_step_beyond_the_columns_is_refused(client: TestClient, progress: dict[str, int]) -> None:
    body = {"points": [], "progress": {"epoch": 0, "epochs": 1, "step": 0, "total_steps": 1, **progress}}
    response = client.post("/api/runs/1/metrics", json=body, headers={"Authorization": "Bearer x"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "progress", *progress]


PAGE_CASES = [
    ("GET", f"/runs/{BIG}", {}, "run_id"),
    ("GET", f"/runs/{BIG}/logs", {}, "run_id"),
    ("POST", f"/runs/{BIG}/stop", {}, "run_id"),
    ("GET", f"/?page_number={BIG}", {}, "page_number"),
    ("GET", f"/runs/new?from_run={BIG}", {}, "from_run"),
    ("GET", f"/runs/new?init_from={'a' * 2000}", {}, "init_from"),
    ("GET", f"/runs/1/stream?after={BIG}", {}, "after"),
    ("GET", "/runs/1/stream", {"Last-Event-ID": BIG}, "last-event-id"),
    ("GET", f"/runs/1/logs/stream?rank={BIG}", {}, "rank"),
    ("GET", f"/files?path={LONG}", {}, "path"),
    ("GET", f"/files?path=datasets/{LONG}", {"HX-Request": "true"}, "path"),
    ("GET", f"/files/inspect?path={LONG}", {}, "path"),
    ("DELETE", f"/runs/1/checkpoints?name={LONG}", {}, "name"),
]


@pytest.mark.parametrize(("method", "url", "headers", "param"), PAGE_CASES)
def test_a_page_answers_an_out_of_bounds_parameter_with_a_4xx_page_naming_it(
    client: TestClient, method: str, url: str, headers: dict[str, str], param: str
) -> None:
    response = client.request(method, url, headers=headers)
    assert 400 <= response.status_code < 500, response.text
    assert response.headers["content-type"].startswith("text/html")
    alert = re.search(r'role="alert">(.*?)</p>', response.text, re.S)
    assert alert and param in alert.group(1), response.text


def test_every_route_that_takes_a_run_id_bounds_it(client: TestClient) -> None:
    """Walks the app's routes, so that a route added later cannot take a run id unbounded."""
    checked = 0
    for context in iter_route_contexts(client.app.routes):  # type: ignore[attr-defined]
        route = context.original_route
        if isinstance(route, APIRoute) and "{run_id}" in route.path:
            for method in route.methods:
                url = route.path.replace("{run_id}", BIG).replace("{key:path}", "loss")
                url = url.replace("{rank}", "0").replace("{stream}", "stdout").replace("{name}", "step-1.pt")
                response = client.request(method, url, params={"key": "loss"}, headers={"Authorization": "Bearer x"})
                assert response.status_code == 422, (method, url, response.text)
                assert "run_id" in response.text, (method, url)
                checked += 1
    assert checked >= 24


def test_every_integer_any_route_takes_has_an_upper_bound(client: TestClient) -> None:
    """Over app.routes, pages included: an integer parameter without `le` is how the 500s above came about."""
    unbounded, integers = [], 0
    for context in iter_route_contexts(client.app.routes):  # type: ignore[attr-defined]
        route = context.original_route
        if isinstance(route, APIRoute):
            dependant = route.dependant
            for param in dependant.path_params + dependant.query_params + dependant.header_params:
                if int in (param.field_info.annotation, *getattr(param.field_info.annotation, "__args__", ())):
                    integers += 1
                    if not any(isinstance(bound, (annotated_types.Le, annotated_types.Lt)) for bound in
                               param.field_info.metadata):  # fmt: skip
                        unbounded.append(f"{route.path} {param.name}")
    assert integers >= 30 and unbounded == []

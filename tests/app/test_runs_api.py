"""The runs API: create, list, get, stop; every bad input is a 4xx naming the field, and stores nothing."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient


def field_errors(response) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {".".join(str(p) for p in e["loc"][1:]): e["msg"] for e in response.json()["detail"]}


def test_create_then_get_and_list(client: TestClient) -> None:
    created = client.post("/api/runs", json={"name": "baseline", "epochs": 3, "lr": 0.01})
    assert created.status_code == 201
    run = created.json()
    assert (run["name"], run["status"], run["epochs"], run["lr"], run["nproc_per_node"]) == (
        "baseline",
        "queued",
        3,
        0.01,
        2,
    )
    assert [e["status"] for e in run["events"]] == ["queued"]
    assert client.get(f"/api/runs/{run['id']}").json()["name"] == "baseline"
    assert [r["id"] for r in client.get("/api/runs").json()["items"]] == [run["id"]]


def test_list_is_paginated_newest_first_and_filters_by_status(client: TestClient) -> None:
    ids = [client.post("/api/runs", json={"name": f"r{i}"}).json()["id"] for i in range(5)]
    client.post(f"/api/runs/{ids[0]}/stop")
    page = client.get("/api/runs", params={"limit": 2, "offset": 1}).json()
    assert (page["total"], [r["id"] for r in page["items"]]) == (5, [ids[3], ids[2]])
    stopped = client.get("/api/runs", params={"status": "stopped"}).json()
    assert [r["id"] for r in stopped["items"]] == [ids[0]]
    assert client.get("/api/runs", params={"status": "queued"}).json()["total"] == 4


def test_stopping_a_queued_run_ends_it_at_once_and_a_finished_run_cannot_stop_again(client: TestClient) -> None:
    run_id = client.post("/api/runs", json={}).json()["id"]
    stopped = client.post(f"/api/runs/{run_id}/stop")
    assert (stopped.status_code, stopped.json()["status"]) == (202, "stopped")
    again = client.post(f"/api/runs/{run_id}/stop")
    assert again.status_code == 409 and "already ended" in again.json()["detail"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"nproc_per_node": 0}, "nproc_per_node"),
        ({"nproc_per_node": 3}, "nproc_per_node"),  # more than the host's 2 process slots
        ({"epochs": -1}, "epochs"),
        ({"epochs": 10**9}, "epochs"),
        ({"batch_size": 0}, "batch_size"),
        ({"lr": 0}, "lr"),
        ({"lr": 1e6}, "lr"),
        ({"lr": "fast"}, "lr"),
        ({"checkpoint_every": 0}, "checkpoint_every"),
        ({"seed": -5}, "seed"),
        ({"workload": "imagenet"}, "workload"),
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({"name": "x" * 101}, "name"),
        ({"color": "red"}, "color"),
    ],
)
def test_bad_run_fields_are_refused_by_name_and_nothing_is_stored(client: TestClient, body: dict, field: str) -> None:
    response = client.post("/api/runs", json=body)
    assert response.status_code == 422
    assert field in field_errors(response)
    assert client.get("/api/runs").json()["total"] == 0


def test_host_capacity_error_says_what_the_host_has(client: TestClient) -> None:
    capacity = client.get("/api/health").json()["process_slots"]
    response = client.post("/api/runs", json={"nproc_per_node": capacity + 1})
    assert f"at most {capacity}" in field_errors(response)["nproc_per_node"]


def test_malformed_json_is_a_422_not_a_500(client: TestClient) -> None:
    response = client.post("/api/runs", content=b'{"name": "x",', headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == "json_invalid"


@pytest.mark.parametrize(
    "path", ["/api/runs/999", "/api/runs/999/metrics", "/api/runs/999/metrics/loss", "/api/runs/999/checkpoints"]
)
def test_unknown_run_is_404(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404 and response.json()["detail"] == "run 999 does not exist"


def test_bad_query_parameters_are_named(client: TestClient) -> None:
    assert "status" in field_errors(client.get("/api/runs", params={"status": "sleeping"}))
    assert "limit" in field_errors(client.get("/api/runs", params={"limit": 0}))
    assert client.get("/api/runs/abc").status_code == 422


def test_openapi_documents_every_operation(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert {"post", "get"} <= set(paths["/api/runs"])
    for path in [
        "/api/runs/{run_id}",
        "/api/runs/{run_id}/stop",
        "/api/runs/{run_id}/metrics",
        "/api/runs/{run_id}/metrics/{key}",
        "/api/runs/{run_id}/checkpoints",
    ]:
        assert path in paths
    assert client.get("/docs").status_code == 200


def test_a_method_a_path_does_not_take_is_a_405_whose_allow_lists_every_method_it_takes(client: TestClient) -> None:
    """Every documented path, with a method it lacks: Starlette named only the first route's methods in Allow, and
    PATCH /api/runs/bulk was taken by PATCH /api/runs/{run_id} as a run id "bulk" (a 422)."""
    paths = client.get("/openapi.json").json()["paths"]
    for path, operations in paths.items():
        concrete = re.sub(r"\{[^}]+\}", "1", path).replace("/1/1/", "/1/stdout/")  # {rank}/{stream}: a stream
        takes = {method.upper() for method in operations} | ({"HEAD"} if "get" in operations else set())
        wrong = next(method for method in ("PUT", "PATCH", "DELETE", "POST") if method not in takes)
        answer = client.request(wrong, concrete)
        assert answer.status_code == 405, (wrong, concrete, answer.text)
        assert set(answer.headers["Allow"].split(", ")) == takes, (wrong, concrete)
        assert answer.json()["detail"] == f"{wrong} is not allowed here; allowed: {answer.headers['Allow']}"
    bulk = client.patch("/api/runs/bulk", json={"runs": [1], "action": "tag"})
    assert (bulk.status_code, bulk.headers["Allow"]) == (405, "POST")


def test_the_openapi_document_says_which_operations_need_a_token_so_generated_clients_send_one(
    client: TestClient,
) -> None:
    document = client.get("/openapi.json").json()
    assert set(document["components"]["securitySchemes"]) == {"apiToken", "session", "runToken"}
    operations = {(method, path): op for path, ops in document["paths"].items() for method, op in ops.items()}
    assert operations[("get", "/api/runs")]["security"] == [{"apiToken": []}, {"session": []}]
    assert operations[("post", "/api/users")]["security"] == [{"apiToken": []}, {"session": []}]
    assert operations[("post", "/api/runs/{run_id}/metrics")]["security"] == [{"runToken": []}]
    assert operations[("post", "/api/runs/{run_id}/dumps/{request}")]["security"] == [{"runToken": []}]
    assert operations[("get", "/api/health")]["security"] == []
    assert all("security" in operation for operation in operations.values())


def test_a_desync_rerun_of_a_run_launched_elsewhere_is_a_documented_409(client: TestClient) -> None:
    joined = client.post("/api/runs/external", json={"key": "job-d", "name": "elsewhere", "rank": 0, "world_size": 1,
                                                     "local_world_size": 1, "host": "node-a"}).json()  # fmt: skip
    refused = client.post(f"/api/runs/{joined['run_id']}/desync")
    assert refused.status_code == 409 and "rerun it there" in refused.json()["detail"]
    documented = client.get("/openapi.json").json()["paths"]["/api/runs/{run_id}/desync"]["post"]["responses"]
    assert "409" in documented

"""The whole /api fuzzed from its own OpenAPI document (schemathesis): no 5xx, and every answer as documented.

Each operation gets a bounded number of generated requests, valid and invalid, against the real app over a store
seeded with runs in several states, their metrics, a checkpoint and logs, so that requests reach past the 404s.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import schemathesis
import torch
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from rankboard import wire
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.auth.passwords import sha256 as hash_token
from app.core.models import Run, RunStatus
from app.core.settings import Settings
from app.main import create_app
from app.schemas.metrics import BatchIn
from app.services import metrics
from tests.app.conftest import TOKEN as RUN_TOKEN
from tests.app.conftest import running_run

TOKEN = "fuzz-token"
CHECKS = [schemathesis.checks.not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]  # fmt: skip
MAX_EXAMPLES = 25
requests_sent: list[int] = []

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[..., Awaitable[None]]], Any]


def without_lifespan(app: ASGIApp) -> ASGIApp:
    """The app with its lifespan answered here: the supervisor never starts, so no torchrun is ever launched and
    the seeded runs keep their states."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            return await app(scope, receive, send)
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})

    return asgi


def seed(app: Any) -> None:
    """Runs in five states (run 1 running with TOKEN), metric points, a checkpoint with its sidecar, and logs."""
    folders = app.state.folders
    with app.state.sessions() as db, db.begin():
        for status in (RunStatus.running, RunStatus.succeeded, RunStatus.failed, RunStatus.stopped, RunStatus.queued):
            db.add(Run(name=f"{status.value} run", status=status, status_reason="seeded", workload="mlp",
                       nproc_per_node=2, epochs=2, batch_size=8, lr=0.01, checkpoint_every=1, seed=0,
                       token_hash=hash_token(TOKEN) if status == RunStatus.running else None))  # fmt: skip
    with app.state.sessions() as db:
        batch = BatchIn.model_validate(
            wire.Batch(tuple(wire.Point("loss", s, 1 / s, s % 2) for s in range(1, 50))).to_json()
        )
        metrics.ingest(db, run_id=1, token=TOKEN, batch=batch)
        for run in db.query(Run).all():
            folder = folders.checkpoint_dir(run)
            folder.mkdir(parents=True)
            torch.save({"model": torch.nn.Linear(2, 2).state_dict(), "step": 8}, folder / wire.checkpoint_name(8))
            sidecar = wire.CheckpointSidecar(wire.checkpoint_name(8), 8, 1, {"loss": 0.5}, 1000, 1.7e9, "epoch")
            (folder / wire.sidecar_name(wire.checkpoint_name(8))).write_text(json.dumps(sidecar.to_json()))
            ranks = folders.run_dir(run) / "ranks" / "rdzv_x" / "attempt_0"
            for rank in (0, 1):
                (ranks / str(rank)).mkdir(parents=True)
                (ranks / str(rank) / "stdout.log").write_text("".join(f"step {s} loss 0.5\n" for s in range(30)))
                (ranks / str(rank) / "stderr.log").write_text("Traceback (most recent call last):\nValueError: x\n")
            (folders.run_dir(run) / "launcher.log").write_text("torchrun started\n")


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[schemathesis.BaseSchema]:
    root = tmp_path_factory.mktemp("fuzz")
    app = create_app(Settings(data_dir=root / "data", shared_dir=root / "shared", supervise_interval_s=3600, slots=2))
    seed(app)
    started = time.monotonic()
    yield schemathesis.openapi.from_asgi("/openapi.json", without_lifespan(app))
    print(f"\nfuzzed /api: {len(requests_sent)} requests in {time.monotonic() - started:.1f} s")


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None
)
def test_every_operation_answers_as_documented(case: schemathesis.Case) -> None:
    requests_sent.append(1)
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"}, checks=CHECKS)


def test_downloads_are_documented_as_files_and_errors_with_their_model(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    paths = document["paths"]
    file_download = paths["/api/files/download"]["get"]["responses"]
    log_download = paths["/api/runs/{run_id}/logs/{rank}/{stream}/download"]["get"]["responses"]
    assert list(file_download["200"]["content"]) == ["application/octet-stream"]
    assert list(log_download["200"]["content"]) == ["text/plain"]
    error = {"$ref": "#/components/schemas/ErrorOut"}
    assert file_download["404"]["content"]["application/json"]["schema"] == error
    assert log_download["404"]["content"]["application/json"]["schema"] == error
    ingest = paths["/api/runs/{run_id}/metrics"]["post"]["responses"]
    assert {"200", "400", "401", "404", "409", "422"} <= set(ingest)
    for path, operations in paths.items():
        for method, operation in operations.items():
            if "{run_id}" in path:
                assert "404" in operation["responses"], (method, path)


# JSON that Python's and pydantic's parsers take although it is no JSON number (1e400 parses as infinity), and values
# of the wrong JSON type, which a strict field refuses instead of coercing (`true` is no integer, `0` no boolean).
NON_FINITE = ("NaN", "Infinity", "-Infinity", "1e400")
WRONG_TYPE = {"number": ("true", '"1"'), "integer": ("true", "1.0", '"1"'), "boolean": ("0", "1", '"true"')}
JSON_WITH_TOKEN = {"Content-Type": "application/json", "Authorization": f"Bearer {RUN_TOKEN}"}
METRIC_VALUES = {("points", 0, "value"), ("columns", 0, "values", 0)}  # data: NaN and infinities are stored as such


def scalar_fields(schema: dict, resolve: Callable[[str], dict], path: tuple = ()) -> Iterator[tuple[tuple, str]]:
    """(path, JSON type) of every number, integer and boolean a body schema reaches; 0 stands for an array's item."""
    if "$ref" in schema:
        yield from scalar_fields(resolve(schema["$ref"]), resolve, path)
    for option in schema.get("anyOf", ()):
        yield from scalar_fields(option, resolve, path)
    kind = schema.get("type")
    if kind in WRONG_TYPE:
        yield path, kind
    elif kind == "array" and "items" in schema:
        yield from scalar_fields(schema["items"], resolve, (*path, 0))
    elif kind == "object":
        for name, field in schema.get("properties", {}).items():
            yield from scalar_fields(field, resolve, (*path, name))


def body_with(path: tuple, literal: str) -> str:
    """A JSON body holding `literal`, written as is, at `path`, and nothing else."""
    value: object = "__LITERAL__"
    for part in reversed(path):
        value = [value] if part == 0 else {part: value}
    return json.dumps(value).replace('"__LITERAL__"', literal)


FILLED = {"{run_id}": "1", "{request}": "1", "{user}": "ada", "{group}": "vision"}  # a path's parameters


def operations_with_bodies(document: dict) -> Iterator[tuple[str, str, dict, Callable[[str], dict]]]:
    """(method, path, body schema, $ref resolver) of every operation that takes a JSON body."""
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if "requestBody" not in operation:
                continue
            schema = operation["requestBody"]["content"]["application/json"]["schema"]

            def resolve(ref: str, schema: dict = schema) -> dict:
                root = document["components"]["schemas"] if ref.startswith("#/components") else schema["$defs"]
                return root[ref.rpartition("/")[2]]

            url = functools.reduce(lambda url, name: url.replace(name, FILLED[name]), FILLED, path)
            yield method, url, schema, resolve


def test_every_number_and_boolean_of_every_body_refuses_non_finite_values_and_wrong_types(client: TestClient) -> None:
    """NaN, Infinity or 1e400 where a number is not data, `true` for an integer, `0` for a boolean: a 422 naming the
    field, in every body of the API (before, NaN anywhere gave a 500, which a trainer's client retried forever)."""
    running_run(client)  # run 1, so that ingest and dumps reach their bodies' checks
    checked = 0
    for method, url, schema, resolve in operations_with_bodies(client.get("/openapi.json").json()):
        for field, kind in scalar_fields(schema, resolve):
            if field in METRIC_VALUES:
                continue
            for literal in (*NON_FINITE, *WRONG_TYPE[kind]) if kind != "boolean" else WRONG_TYPE[kind]:
                answer = client.request(method, url, content=body_with(field, literal),
                                        headers=JSON_WITH_TOKEN)  # fmt: skip
                assert answer.status_code == 422, (method, url, field, literal, answer.text)
                places = [tuple(error["loc"][1:]) for error in answer.json()["detail"]]
                assert any(place[: len(field)] == field for place in places), (method, url, field, literal, places)
                checked += 1
    assert checked > 300  # every body's fields, not a few: RunCreate alone has 30 numbers and booleans


def test_non_finite_metric_values_are_data_and_stored_as_such(client: TestClient) -> None:
    run_id = running_run(client)
    body = '{"columns": [{"key": "loss", "steps": [1, 2, 3], "values": [NaN, Infinity, 1e400], "times": [1, 2, 3]}]}'
    answer = client.post(f"/api/runs/{run_id}/metrics", content=body,
                         headers=JSON_WITH_TOKEN)  # fmt: skip
    assert answer.status_code == 200, answer.text
    values = [point["value"] for point in client.get(f"/api/runs/{run_id}/metrics/loss").json()["points"]]
    assert values == ["NaN", "Infinity", "Infinity"]

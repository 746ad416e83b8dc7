"""Run options through the API and the form: each reaches torchrun's command line; every impossible combination,
and every script path outside the allowed folders, is a 4xx naming the field, with nothing created."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from app.core.models import Run
from app.core.option_text import as_form_text
from app.core.settings import Settings
from app.core.trainer_options import TrainerOptions
from app.launcher.local import LocalLauncher
from app.schemas.runs import RunCreate
from trainer.config import TrainConfig


def field_errors(response) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {str(e["loc"][1]): e["msg"] for e in response.json()["detail"]}


def refused(client: TestClient, body: dict[str, object]) -> dict[str, str]:
    response = client.post("/api/runs", json=body)
    assert response.status_code == 422, response.text
    assert client.get("/api/runs").json()["total"] == 0  # nothing stored
    return field_errors(response)


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"precision": "fp16"}, "precision", "fp16 needs CUDA"),
        ({"sync_batchnorm": True}, "sync_batchnorm", "SyncBatchNorm runs only on CUDA"),
        ({"nccl_env": {"NCCL_DEBUG": "INFO"}}, "nccl_env", "NCCL never reads"),
        ({"nccl_env": {"LD_PRELOAD": "/x.so"}}, "nccl_env", "not an NCCL variable"),
        ({"grad_accum": 0}, "grad_accum", "greater than or equal to 1"),
        ({"optimizer": "lamb"}, "optimizer", "choose one of: adamw, adam, sgd"),
        ({"precision": "fp8"}, "precision", "choose one of: off, bf16, fp16"),
        ({"max_restarts": -1}, "max_restarts", "greater than or equal to 0"),
        ({"pg_timeout_s": 1}, "pg_timeout_s", "greater than or equal to 5"),
        ({"script_args": "--epochs 3"}, "script_args", "valid list"),
        ({"script_args": ["--epochs", 3]}, "script_args", "valid string"),
        ({"script": "../outside.py"}, "script", "'..' is not allowed"),
        ({"script": "/etc/hostname"}, "script", "outside the folders scripts may be in"),
        ({"script": "missing.py"}, "script", "does not exist"),
        ({"script": "notes.txt"}, "script", "not a Python file"),
    ],
)
def test_an_impossible_option_is_refused_naming_its_field(
    client: TestClient, settings: Settings, body: dict[str, object], field: str, words: str
) -> None:
    (settings.shared / "notes.txt").write_text("not python")
    errors = refused(client, body)
    assert field in errors and words in errors[field], errors


def test_a_link_out_of_the_shared_folder_is_not_a_script(
    client: TestClient, settings: Settings, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere.py"
    outside.write_text("print('hello')")
    (settings.shared / "linked.py").symlink_to(outside)
    assert "leads outside" in refused(client, {"script": "linked.py"})["script"]


def test_a_script_run_is_launched_as_the_script_under_torchrun(client: TestClient, settings: Settings) -> None:
    (settings.shared / "jobs").mkdir()
    (settings.shared / "jobs" / "train.py").write_text("print('hi')")
    body = {"script": "jobs/train.py", "script_args": ["--epochs", "3", "a b"], "max_restarts": 2}
    run = client.post("/api/runs", json=body).json()
    assert (run["workload"], run["script"]) == ("script", str(settings.shared / "jobs" / "train.py"))
    command = launcher_command(client, run["id"])
    assert "--max-restarts" in command and command[command.index("--max-restarts") + 1] == "2"
    assert command[-4:] == [run["script"], "--epochs", "3", "a b"]  # one argument each: no shell splits them


def test_every_trainer_option_reaches_the_trainers_command_line(client: TestClient) -> None:
    options = {
        "workload": "cnn", "optimizer": "sgd", "lr_schedule": "cosine", "warmup_steps": 7, "weight_decay": 0.05,
        "grad_clip": 2.5, "grad_accum": 3, "precision": "bf16", "find_unused_parameters": True, "bucket_cap_mb": 9,
        "gradient_as_bucket_view": True, "val_every": 11, "checkpoint_every": 13, "checkpoint_unit": "step",
        "pg_timeout_s": 17, "seed": 19, "keep_last": 2,
    }  # fmt: skip
    run = client.post("/api/runs", json=options).json()
    command = launcher_command(client, run["id"])
    trainer_args = command[command.index("trainer") + 1 :]
    config = TrainConfig.from_argv(trainer_args)  # the trainer parses exactly what the launcher built
    assert {name: getattr(config, name) for name in options} == options
    # Every option of the document is a flag, none written out by hand: only `resume` is left at the trainer's own.
    flags = {arg[2:].replace("-", "_") for arg in trainer_args if arg.startswith("--")}
    assert flags == {f.name for f in dataclasses.fields(TrainConfig)} - {"resume"}
    assert run["config"] == TrainerOptions(**{k: v for k, v in options.items() if k != "workload"}).model_dump()


# What the server keeps of a run itself rather than in TrainerOptions, and why.
SERVERS_OWN = {
    "workload": "a run's own column, which also says a run of a script or launched elsewhere",
    "checkpoint_dir": "the server gives each run its folder",
    "resume": "a launched run always resumes from its newest snapshot (torchrun's restarts depend on it)",
}


def trainer_bounds(name: str) -> dict[str, Any]:
    """TrainConfig's bounds and choices of a field, as its check reads them."""
    metadata = next(f.metadata for f in dataclasses.fields(TrainConfig) if f.name == name)
    return {key: metadata[key] for key in ("ge", "gt", "le") if key in metadata} | (
        {"choices": set(metadata["choices"])} if "choices" in metadata else {}
    )


def server_bounds(model: type[BaseModel], name: str) -> dict[str, Any]:
    """The server model's bounds and choices of a field, as the API's schema and the form show them."""
    field = model.model_fields[name]
    found = {key: getattr(rule, key) for rule in field.metadata for key in ("ge", "gt", "le") if hasattr(rule, key)}
    enum = model.model_json_schema()["properties"][name].get("enum")
    return found | ({"choices": set(enum)} if enum else {})


def server_type(model: type[BaseModel], name: str) -> type:
    annotation = model.model_fields[name].annotation
    return type(get_args(annotation)[0]) if get_origin(annotation) is Literal else annotation  # type: ignore[return-value]


def test_the_servers_options_are_the_trainers_field_for_field() -> None:
    """The contract: names, types, defaults, bounds and choices equal, so that what the form and the API accept the
    trainer accepts, and no option is missing on either side. It fails when one side changes alone."""
    trainer = {f.name: f for f in dataclasses.fields(TrainConfig)}
    assert set(TrainerOptions.model_fields) == set(trainer) - set(SERVERS_OWN)
    types = typing.get_type_hints(TrainConfig)
    for name, field in TrainerOptions.model_fields.items():
        assert server_type(TrainerOptions, name) is types[name], name
        assert field.default == trainer[name].default and type(field.default) is type(trainer[name].default), name
        assert server_bounds(TrainerOptions, name) == trainer_bounds(name), name
    assert server_bounds(RunCreate, "workload") == trainer_bounds("workload")
    assert RunCreate.model_fields["workload"].default == trainer["workload"].default


def beyond(name: str) -> list[object]:
    """Values on and just past each bound of a numeric option: each side must take or refuse them alike."""
    bounds, kind = trainer_bounds(name), typing.get_type_hints(TrainConfig)[name]
    step = 1 if kind is int else 1e-9
    values: list[object] = []
    for key, edge in bounds.items():
        if key != "choices":
            values += [kind(edge), kind(edge - step if key in ("ge", "gt") else edge + step)]
    return values


@pytest.mark.parametrize("name", [n for n in TrainerOptions.model_fields if beyond(n)])
def test_the_server_and_the_trainer_take_and_refuse_the_same_values_at_each_bound(name: str) -> None:
    for value in beyond(name):
        trainer_takes = _takes(lambda: TrainConfig(**{name: value}))  # noqa: B023
        server_takes = _takes(lambda: TrainerOptions.model_validate({name: value}))  # noqa: B023
        assert trainer_takes == server_takes, (name, value, trainer_takes)


def _takes(make: Callable[[], object]) -> bool:
    try:
        make()
    except ValueError:  # pydantic's ValidationError is one
        return False
    return True


def test_a_scripts_run_has_only_what_it_had_its_arguments_and_no_trainer_option(
    client: TestClient, settings: Settings
) -> None:
    (settings.shared / "train.py").write_text("print('hi')")
    run = client.post("/api/runs", json={"script": "train.py", "script_args": ["--lr", "3e-4"], "epochs": 3}).json()
    assert run["config"] == {"script_args": ["--lr", "3e-4"], "desync_checks": False}
    assert (run["epochs"], run["lr"], run["script_args"]) == (None, None, ["--lr", "3e-4"])
    page = client.get(f"/runs/{run['id']}").text
    config = page.partition('id="run-config"')[2].partition("</dl>")[0]
    assert "<dt>desync_checks</dt>" in config and "epochs" not in config and "--lr 3e-4" in config
    form = client.get("/runs/new", params={"from_run": run["id"]}).text
    assert 'name="epochs" type="number" value="10"' in form  # the default: it never had 3, which it was not given


def launcher_command(client: TestClient, run_id: int) -> list[str]:
    launcher: LocalLauncher = client.app.state.launcher  # type: ignore[attr-defined]
    with client.app.state.sessions() as db:  # type: ignore[attr-defined]
        return launcher.trainer_command(db.get(Run, run_id))


def test_a_run_with_nothing_to_resume_from_is_refused(client: TestClient) -> None:
    run_id = client.post("/api/runs", json={}).json()["id"]
    client.post(f"/api/runs/{run_id}/stop")  # queued: it stops at once, before writing anything
    refused = client.post(f"/api/runs/{run_id}/resume")
    assert refused.status_code == 409 and "no checkpoint to resume from" in refused.json()["detail"]
    queued = client.post("/api/runs", json={}).json()["id"]
    assert client.post(f"/api/runs/{queued}/resume").status_code == 409  # not stopped: nothing to resume
    assert client.post("/api/runs/999/resume").status_code == 404


def test_the_form_offers_each_option_with_its_default_and_turns_lines_into_lists(client: TestClient) -> None:
    page = client.get("/runs/new").text
    for name in ("optimizer", "lr_schedule", "precision", "grad_accum", "max_restarts", "script", "nccl_env"):
        assert f'name="{name}"' in page
    assert '<option value="adamw" selected>' in page and "Default 25; 1 to 1,024." in page  # bucket_cap_mb
    values = as_form_text(RunCreate().model_dump()) | {"grad_accum": "2", "script_args": ""}
    response = client.post("/runs", data=values, follow_redirects=False)
    assert response.status_code == 303
    run = client.get(response.headers["location"].replace("/runs/", "/api/runs/")).json()
    assert (run["grad_accum"], run["script_args"], run["nccl_env"]) == (2, [], {})


def test_a_bad_nccl_line_in_the_form_is_shown_at_its_field(client: TestClient) -> None:
    values = as_form_text(RunCreate().model_dump()) | {"nccl_env": "NCCL_DEBUG INFO"}
    response = client.post("/runs", data=values)
    assert response.status_code == 422 and 'id="e-nccl_env"' in response.text and "NAME=value" in response.text

"""Runs launched elsewhere, through the API: the processes of one job join one run, each with its own token; how
they end decides the run's end; silence makes it lost, and a report brings it back; Stop only where it reaches."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rankboard import wire
from sqlalchemy import update

from app.core.models import Run, utcnow


def join(client: TestClient, rank: int = 0, key: str = "slurm:c1:4242", **fields: Any) -> dict[str, Any]:
    body = {"key": key, "name": "llama-ft", "config": {"lr": 3e-4, "layers": 24}, "rank": rank, "world_size": 2,
            "local_world_size": 2, "host": "node-a"} | fields  # fmt: skip
    answer = client.post("/api/runs/external", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def post(client: TestClient, joined: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    answer = client.post(f"/api/runs/{joined['run_id']}/metrics", json=body,
                         headers={"Authorization": f"Bearer {joined['token']}"})  # fmt: skip
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def ended(rank: int, how: str, error: str | None = None) -> dict[str, Any]:
    return wire.Batch(ended=wire.Ended(rank, "node-a", how, error)).to_json()


def run(client: TestClient, run_id: int) -> dict[str, Any]:
    return client.get(f"/api/runs/{run_id}").json()  # type: ignore[no-any-return]


def test_every_process_of_a_job_joins_one_run_with_a_token_of_its_own(client: TestClient) -> None:
    first, second = join(client, rank=0), join(client, rank=1)
    other_job = join(client, rank=0, key="slurm:c1:4243")
    assert first["run_id"] == second["run_id"] != other_job["run_id"]
    assert (first["created"], second["created"]) == (True, False)
    assert first["token"] != second["token"]
    loss = wire.Batch((wire.Point("loss", 1, 0.5),), heartbeat=wire.Heartbeat(0, "node-a", 1))
    assert post(client, first, loss.to_json()) == {"accepted": 1, "stored": 1}
    assert post(client, second, wire.Batch(heartbeat=wire.Heartbeat(1, "node-a", 1)).to_json())["accepted"] == 0
    shown = run(client, first["run_id"])
    assert (shown["launcher"], shown["status"], shown["world_size"]) == ("external", "running", 2)
    assert shown["config"] == {"lr": 3e-4, "layers": 24} and shown["external_key"] == "slurm:c1:4242"
    ranks = client.get(f"/api/runs/{first['run_id']}/ranks").json()
    assert [(r["rank"], r["host"], r["step"], r["ended"]) for r in ranks] == [
        (0, "node-a", 1, None),
        (1, "node-a", 1, None),
    ]
    # One process's token is no other run's.
    refused = client.post(f"/api/runs/{other_job['run_id']}/metrics", json=wire.Batch().to_json(),
                          headers={"Authorization": f"Bearer {first['token']}"})  # fmt: skip
    assert refused.status_code == 401


def test_the_run_succeeds_once_every_rank_has_ended_and_fails_when_one_raises(client: TestClient) -> None:
    first, second = join(client, rank=0), join(client, rank=1)
    post(client, first, ended(0, "finished"))
    assert run(client, first["run_id"])["status"] == "starting"  # rank 1 still trains
    post(client, second, ended(1, "exited"))
    done = run(client, first["run_id"])
    assert done["status"] == "succeeded" and done["status_reason"] == "training finished: all 2 ranks ended"

    third, fourth = join(client, rank=0, key="k8s:job-7"), join(client, rank=1, key="k8s:job-7")
    post(client, fourth, ended(1, "failed", "ValueError: shapes (3,) and (4,) differ"))
    failed = run(client, third["run_id"])
    assert failed["status"] == "failed"
    assert failed["status_reason"] == "rank 1 on node-a raised ValueError: shapes (3,) and (4,) differ"
    # Rank 0's last points, sent after rank 1 failed the run, are still its points: kept, and the verdict stands.
    last = wire.Batch((wire.Point("loss", 9, 0.25),), ended=wire.Ended(0, "node-a", "exited")).to_json()
    assert post(client, third, last) == {"accepted": 1, "stored": 1}
    assert run(client, third["run_id"])["status"] == "failed"


def test_a_restarted_job_rejoins_its_run_as_the_next_attempt(client: TestClient) -> None:
    first = join(client, rank=0)
    post(client, first, ended(0, "failed", "RuntimeError: NCCL timeout"))
    again = join(client, rank=0)  # torchrun restarted the workers, or Slurm requeued the job
    assert again["run_id"] == first["run_id"] and not again["created"]
    reopened = run(client, first["run_id"])
    assert (reopened["status"], reopened["attempt"], reopened["finished_at"]) == ("starting", 2, None)
    post(client, again, ended(0, "exited"))
    assert run(client, first["run_id"])["status"] == "starting"  # the first attempt's failure no longer counts


def test_a_silent_run_is_lost_and_comes_back_when_it_reports_again(client: TestClient) -> None:
    joined = join(client)
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.execute(update(Run).where(Run.id == joined["run_id"]).values(contact_at=utcnow() - timedelta(hours=1)))
    client.app.state.supervisor.tick()  # type: ignore[attr-defined]
    lost = run(client, joined["run_id"])
    assert lost["status"] == "lost" and lost["status_reason"].startswith("no process of the job has reported for")
    post(client, joined, wire.Batch((wire.Point("loss", 5, 0.5),)).to_json())  # the server was cut off, not the job
    back = run(client, joined["run_id"])
    assert back["status"] == "running" and back["status_reason"] == "reporting again after a silence"


def test_stop_reaches_only_a_script_that_takes_it(client: TestClient) -> None:
    deaf = join(client, key="torchrun:deaf")
    refused = client.post(f"/api/runs/{deaf['run_id']}/stop")
    assert refused.status_code == 409 and "does not take stop requests" in refused.json()["detail"]
    assert "stop requested" not in post(client, deaf, wire.Batch().to_json())

    listening = [join(client, rank=r, key="torchrun:listening", takes_stop=True) for r in (0, 1)]
    assert post(client, listening[0], wire.Batch().to_json()) == {"accepted": 0, "stored": 0}
    assert client.post(f"/api/runs/{listening[0]['run_id']}/stop").status_code == 202
    assert post(client, listening[1], wire.Batch().to_json())["stop"] is True
    for rank, joined in enumerate(listening):
        post(client, joined, ended(rank, "exited"))
    assert run(client, listening[0]["run_id"])["status"] == "stopped"
    page = client.get(f"/runs/{listening[0]['run_id']}").text
    assert "launched elsewhere" in page


def test_a_run_launched_elsewhere_cannot_be_resumed_from_here(client: TestClient) -> None:
    joined = join(client)
    post(client, joined, ended(0, "failed", "OSError: disk full"))
    answer = client.post(f"/api/runs/{joined['run_id']}/resume")
    assert answer.status_code == 409 and "start its job there again" in answer.json()["detail"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"key": ""}, "key"),
        ({"key": "two words"}, "key"),
        ({"rank": 2}, "rank"),  # world_size is 2
        ({"world_size": 0}, "world_size"),
        ({"config": {"blob": "x" * 70_000}}, "config"),
        ({"host": ""}, "host"),
    ],
)
def test_a_malformed_join_is_refused_naming_the_field_and_makes_no_run(
    client: TestClient, change: dict[str, Any], field: str
) -> None:
    body = {"key": "slurm:c1:1", "name": "n", "rank": 0, "world_size": 2, "local_world_size": 2, "host": "h"}
    answer = client.post("/api/runs/external", json=body | change)
    assert answer.status_code == 422
    assert field in str(answer.json()["detail"])
    assert client.get("/api/runs").json()["total"] == 0


def test_an_ended_rank_with_an_unknown_ending_is_refused(client: TestClient) -> None:
    joined = join(client)
    body = {"points": [], "ended": {"rank": 0, "host": "node-a", "how": "vanished"}}
    answer = client.post(f"/api/runs/{joined['run_id']}/metrics", json=body,
                         headers={"Authorization": f"Bearer {joined['token']}"})  # fmt: skip
    assert answer.status_code == 422 and "ended" in str(answer.json()["detail"])
    assert run(client, joined["run_id"])["status"] == "starting"


def test_checkpoints_in_the_folder_a_script_names_are_listed_and_one_outside_the_shared_folder_is_not(
    client: TestClient, tmp_path: Path
) -> None:
    shared = client.app.state.folders.shared  # type: ignore[attr-defined]
    folder = shared / "teams" / "nlp" / "llama-ft"
    joined = join(client, checkpoint_dir=str(folder))
    folder.mkdir(parents=True)
    (folder / wire.checkpoint_name(500)).write_bytes(b"weights")
    (folder / "notes.txt").write_text("not a checkpoint")
    listed = client.get(f"/api/runs/{joined['run_id']}/checkpoints").json()
    assert [(c["name"], c["path"]) for c in listed] == [("step-00000500.pt", "teams/nlp/llama-ft/step-00000500.pt")]

    elsewhere = join(client, key="slurm:c1:9", checkpoint_dir=str(tmp_path / "outside"))
    shown = run(client, elsewhere["run_id"])
    assert shown["checkpoint_folder"] is None
    assert "is not in the shared folder, so none are listed" in shown["events"][0]["reason"]


def test_a_run_launched_elsewhere_shows_what_its_script_reported_and_no_option_it_never_had(
    client: TestClient,
) -> None:
    joined = join(client, config={"lr": 3e-4, "layers": 24, "optim": {"betas": [0.9, 0.95]}})
    shown = run(client, joined["run_id"])
    assert shown["config"] == {"lr": 3e-4, "layers": 24, "optim": {"betas": [0.9, 0.95]}}
    assert (shown["epochs"], shown["lr"], shown["batch_size"], shown["seed"]) == (None, None, None, None)
    config = client.get(f"/runs/{joined['run_id']}").text.partition('id="run-config"')[2].partition("</dl>")[0]
    assert "<dt>layers</dt><dd><code>24</code>" in config and "<dt>epochs</dt>" not in config
    assert '<dt>optim</dt><dd><code>{"betas": [0.9, 0.95]}</code>' in config  # as JSON, as it was sent
    table = client.get("/api/runs", params={"columns": "lr,epochs,config.layers"}).json()["values"]
    assert table[str(joined["run_id"])] == {"lr": 3e-4, "epochs": None, "config.layers": 24}
    form = client.get("/runs/new", params={"from_run": joined["run_id"]}).text
    for name, default in (("epochs", "10"), ("batch_size", "64"), ("lr", "0.001")):  # defaults, not placeholders
        assert f'name="{name}" type="number" value="{default}"' in form, name


def test_a_config_that_some_store_could_not_keep_as_sent_is_refused_naming_it(client: TestClient) -> None:
    """NaN and infinities (report.init sends them as strings) and NUL characters (PostgreSQL's jsonb refuses them)."""
    for raw in ('{"lr": 1e400}', '{"note": "a\\u0000b"}'):
        body = ('{"key": "k", "name": "n", "rank": 0, "world_size": 1, "local_world_size": 1, "host": "h", "config": '
                + raw + "}")  # fmt: skip
        answer = client.post("/api/runs/external", content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["body", "config"], answer.text
    assert client.get("/api/runs").json()["total"] == 0


def test_a_total_declared_at_join_is_the_runs_until_a_progress_declares_another(client: TestClient) -> None:
    """report.init(total_steps=...): the page shows progress against it from the join on; a progress of the script
    without a total (0) keeps it, one with a total replaces it. Epochs it never counted stay unset."""
    joined = join(client, total_steps=5000)
    shown = run(client, joined["run_id"])
    assert (shown["total_steps"], shown["step"], shown["epoch"], shown["epochs"]) == (5000, 0, 0, None)
    post(client, joined, wire.Batch(progress=wire.Progress(epoch=0, epochs=0, step=10, total_steps=0)).to_json())
    assert (run(client, joined["run_id"])["step"], run(client, joined["run_id"])["total_steps"]) == (10, 5000)
    post(client, joined, wire.Batch(progress=wire.Progress(epoch=0, epochs=0, step=20, total_steps=8000)).to_json())
    assert run(client, joined["run_id"])["total_steps"] == 8000
    join(client, rank=1)  # a process that declares none leaves it
    assert run(client, joined["run_id"])["total_steps"] == 8000
    body = {"key": "k", "name": "n", "rank": 0, "world_size": 1, "local_world_size": 1, "host": "h"}
    refused = client.post("/api/runs/external", json=body | {"total_steps": -1})
    assert refused.status_code == 422 and "total_steps" in str(refused.json()["detail"])

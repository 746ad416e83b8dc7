"""A run's checkpoints: listed from the trainer's metadata files, deleted with the space shown first."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.core.models import Run, RunStatus


def write_checkpoint(folder: Path, step: int, loss: float | None, size: int = 1000) -> None:
    """What the trainer leaves: step-N.pt and, beside it, step-N.json with the metrics at save time."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"step-{step:08d}.pt").write_bytes(b"x" * size)
    if loss is not None:
        meta = {"file": f"step-{step:08d}.pt", "step": step, "epoch": step // 10, "reason": "epoch",
                "metrics": {"loss": loss, "epoch_loss": loss + 0.5}, "size": size, "written_at": 0}  # fmt: skip
        (folder / f"step-{step:08d}.json").write_text(json.dumps(meta))


@pytest.fixture
def run_folder(client: TestClient) -> Path:
    client.post("/api/runs", json={"name": "with checkpoints"})
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, 1).status = RunStatus.succeeded
    folder: Path = client.app.state.settings.shared / "checkpoints" / "run-1"  # type: ignore[attr-defined]
    for step, loss in [(10, 0.9), (20, 0.4), (30, 0.6)]:
        write_checkpoint(folder, step, loss)
    write_checkpoint(folder, 40, None, size=5000)  # no metadata: still listed
    (folder / ".step-00000050.pt.123.abcd.tmp").write_bytes(b"half")  # a write in progress: not a checkpoint
    (folder / "step-00000060.pt").symlink_to(folder / "step-00000010.pt")  # a link: not a checkpoint
    return folder


def test_checkpoints_come_with_their_metrics_and_the_latest_and_best_marked(
    client: TestClient, run_folder: Path
) -> None:
    listed = client.get("/api/runs/1/checkpoints").json()
    assert [(c["step"], c["epoch"], c["metrics"].get("loss"), c["latest"], c["best"]) for c in listed] == [
        (10, 1, 0.9, False, False),
        (20, 2, 0.4, False, True),
        (30, 3, 0.6, False, False),
        (40, None, None, True, False),
    ]
    assert listed[0]["path"] == "checkpoints/run-1/step-00000010.pt" and listed[3]["size"] == 5000
    by_epoch_loss = client.get("/api/runs/1/checkpoints", params={"best_metric": "epoch_loss"}).json()
    assert [c["step"] for c in by_epoch_loss if c["best"]] == [20]


def test_one_checkpoints_metadata(client: TestClient, run_folder: Path) -> None:
    one = client.get("/api/runs/1/checkpoints/step-00000020.pt").json()
    assert (one["step"], one["epoch"], one["metrics"], one["best"]) == (20, 2, {"loss": 0.4, "epoch_loss": 0.9}, True)
    assert client.get("/api/runs/1/checkpoints/step-00000099.pt").status_code == 404


def test_a_dry_run_tells_what_a_deletion_frees_and_deletes_nothing(client: TestClient, run_folder: Path) -> None:
    preview = client.delete("/api/runs/1/checkpoints", params={"dry_run": True}).json()
    assert preview == {"files": ["step-00000010.pt", "step-00000020.pt", "step-00000030.pt", "step-00000040.pt"],
                       "freed": 8000, "deleted": False}  # fmt: skip
    assert len(client.get("/api/runs/1/checkpoints").json()) == 4


def test_deleting_one_checkpoint_removes_it_and_its_metadata(client: TestClient, run_folder: Path) -> None:
    done = client.delete("/api/runs/1/checkpoints", params={"name": "step-00000020.pt"}).json()
    assert done == {"files": ["step-00000020.pt"], "freed": 1000, "deleted": True}
    assert not (run_folder / "step-00000020.pt").exists() and not (run_folder / "step-00000020.json").exists()
    assert [c["step"] for c in client.get("/api/runs/1/checkpoints").json()] == [10, 30, 40]


def test_delete_all_from_the_page_returns_the_updated_fragment(client: TestClient, run_folder: Path) -> None:
    fragment = client.delete("/runs/1/checkpoints", headers={"HX-Request": "true"}).text
    assert "None." in fragment and "<html" not in fragment
    assert client.get("/api/runs/1/checkpoints").json() == []


def test_unknown_names_and_the_newest_checkpoint_of_a_live_run_are_not_deleted(
    client: TestClient, run_folder: Path
) -> None:
    unknown = client.delete("/api/runs/1/checkpoints", params={"name": "../../data/rankboard.db"})
    assert unknown.status_code == 404
    with client.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, 1).status = RunStatus.running
    newest = client.delete("/api/runs/1/checkpoints", params={"name": "step-00000040.pt"})
    assert newest.status_code == 409 and "still going" in newest.json()["detail"]
    assert (run_folder / "step-00000040.pt").exists()


def test_retention_removals_are_read_from_the_trainers_log(client: TestClient, run_folder: Path) -> None:
    log = {"removed": "step-00000005.pt", "step": 5, "freed": 1000, "at": 1.0,
           "policy": {"keep_last": 1, "keep_best": 1, "best_metric": "loss"}}  # fmt: skip
    (run_folder / "retention.jsonl").write_text(json.dumps(log) + "\n" + '{"removed": "cut sh')
    assert [r["removed"] for r in client.get("/api/runs/1/checkpoints/removed").json()] == ["step-00000005.pt"]
    assert "1 removed by the retention policy" in client.get("/runs/1").text


@pytest.mark.parametrize(
    ("init_from", "message"),
    [
        ("../secret.pt", "'..' is not allowed"),
        ("/etc/passwd", "absolute paths are not allowed"),
        ("checkpoints/run-1/step-00000099.pt", "does not exist"),
        ("checkpoints/run-1/step-00000010.json", "is not a checkpoint file"),
        ("checkpoints/run-1", "is not a checkpoint file"),
    ],
)
def test_a_checkpoint_to_start_from_must_be_a_checkpoint_in_the_shared_folder(
    client: TestClient, run_folder: Path, init_from: str, message: str
) -> None:
    response = client.post("/api/runs", json={"init_from": init_from})
    assert response.status_code == 422
    assert (
        response.json()["detail"][0]["loc"] == ["body", "init_from"] and message in response.json()["detail"][0]["msg"]
    )


def test_a_run_started_from_a_checkpoint_passes_it_to_the_trainer(client: TestClient, run_folder: Path) -> None:
    created = client.post("/api/runs", json={"init_from": "checkpoints/./run-1/step-00000020.pt",
                                             "init_optimizer": True}).json()  # fmt: skip
    assert created["init_from"] == "checkpoints/run-1/step-00000020.pt" and created["init_optimizer"] is True
    launcher = client.app.state.launcher  # type: ignore[attr-defined]
    with client.app.state.sessions() as db:  # type: ignore[attr-defined]
        command = launcher.trainer_command(db.get(Run, created["id"]))
    assert command[command.index("--init-from") + 1] == str(run_folder / "step-00000020.pt")
    assert command[command.index("--init-optimizer") + 1] == "true"


def test_the_form_for_a_new_run_from_a_checkpoint_is_filled_in(client: TestClient, run_folder: Path) -> None:
    page = client.get("/runs/new", params={"from_run": 1, "init_from": "checkpoints/run-1/step-00000020.pt"}).text
    assert 'value="checkpoints/run-1/step-00000020.pt"' in page
    assert 'value="with checkpoints from step-00000020.pt"' in page


def test_a_run_whose_checkpoints_would_not_fit_is_warned_about_before_it_starts(
    client: TestClient, run_folder: Path
) -> None:
    each = shutil.disk_usage(run_folder).free // 10
    with open(run_folder / "step-00000070.pt", "wb") as sparse:
        sparse.truncate(each)  # takes no disk, but its size is this workload's estimate: 10 fit, 1000 do not
    too_big = client.post("/api/runs", json={"epochs": 1000})
    assert too_big.status_code == 422
    error = too_big.json()["detail"][0]
    assert error["loc"] == ["body", "allow_low_disk"] and "its 1000 checkpoints are projected at" in error["msg"]
    assert "from run 1's newest checkpoint" in error["msg"]
    assert client.get("/api/runs", params={"status": "queued"}).json()["total"] == 0
    assert client.post("/api/runs", json={"epochs": 1000, "keep_last": 2}).status_code == 201
    assert client.post("/api/runs", json={"epochs": 1000, "allow_low_disk": True}).status_code == 201
    form = client.post("/runs", data={"epochs": "1000"})
    assert form.status_code == 422 and 'id="e-allow_low_disk"' in form.text

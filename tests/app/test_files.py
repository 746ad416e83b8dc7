"""The shared folder over HTTP: browse, download with ranges, inspect safely, and no way out of the root."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from app.services import checkpoints

SECRET = "top secret outside the shared folder"


@pytest.fixture
def shared(client: TestClient, tmp_path: Path) -> Path:
    """The shared root with a checkpoint, a text file, and links in and out; a secret lies beside the root."""
    root: Path = client.app.state.settings.shared  # type: ignore[attr-defined]
    (tmp_path / "secret.txt").write_text(SECRET)
    (root / "checkpoints" / "run-1").mkdir(parents=True)
    torch.save({"model": torch.nn.Linear(4, 3).state_dict(), "step": 7}, root / "checkpoints" / "run-1" / "step-7.pt")
    (root / "datasets").mkdir()
    (root / "datasets" / "notes.txt").write_bytes(bytes(range(256)) * 40)
    (root / "datasets" / "leak.txt").symlink_to(tmp_path / "secret.txt")
    (root / "datasets" / "outside").symlink_to(tmp_path)
    (root / "datasets" / "inside.txt").symlink_to(root / "datasets" / "notes.txt")
    return root


ESCAPES = [
    "../secret.txt",
    "datasets/../../secret.txt",
    "/etc/passwd",
    "datasets/leak.txt",  # a link to a file outside
    "datasets/outside/secret.txt",  # through a link to a folder outside
    "datasets\\..\\..\\secret.txt",
    "datasets/notes.txt\0.pt",
]


@pytest.mark.parametrize("path", ESCAPES)
@pytest.mark.parametrize("endpoint", ["/api/files", "/api/files/download", "/api/files/inspect", "/files"])
def test_no_way_out_of_the_shared_folder(client: TestClient, shared: Path, endpoint: str, path: str) -> None:
    response = client.get(endpoint, params={"path": path})
    assert response.status_code == 400, response.text
    assert SECRET not in response.text and "root:" not in response.text


def test_an_encoded_slash_in_the_url_is_refused_too(client: TestClient, shared: Path) -> None:
    response = client.get("/api/files/download?path=datasets%2F..%2F..%2Fsecret.txt")
    assert response.status_code == 400 and SECRET not in response.text
    assert client.get("/api/files/download?path=..%252Fsecret.txt").status_code == 404  # a name with '%2F' in it


def test_a_folder_lists_folders_first_with_sizes_and_hides_links_that_leave(client: TestClient, shared: Path) -> None:
    listing = client.get("/api/files", params={"path": "datasets"}).json()
    assert [(e["name"], e["is_dir"], e["size"]) for e in listing["entries"]] == [
        ("inside.txt", False, 10240),
        ("notes.txt", False, 10240),
    ]
    top = {e["path"]: e for e in client.get("/api/files").json()["entries"]}
    assert (
        top["checkpoints"]["is_dir"]
        and top["checkpoints"]["size"] == (shared / "checkpoints/run-1/step-7.pt").stat().st_size
    )
    assert listing["disk"]["free"] > 0
    assert client.get("/api/files", params={"path": "nowhere"}).status_code == 404


def test_download_is_whole_or_by_range_so_it_can_resume(client: TestClient, shared: Path) -> None:
    data = (shared / "datasets" / "notes.txt").read_bytes()
    whole = client.get("/api/files/download", params={"path": "datasets/notes.txt"})
    assert whole.content == data and whole.headers["content-length"] == str(len(data))
    assert whole.headers["accept-ranges"] == "bytes"
    first = client.get("/api/files/download", params={"path": "datasets/notes.txt"}, headers={"Range": "bytes=0-999"})
    rest = client.get("/api/files/download", params={"path": "datasets/notes.txt"}, headers={"Range": "bytes=1000-"})
    assert (first.status_code, rest.status_code) == (206, 206)
    assert first.content + rest.content == data
    beyond = client.get("/api/files/download", params={"path": "datasets/notes.txt"}, headers={"Range": "bytes=99999-"})
    assert beyond.status_code == 416
    assert client.get("/api/files/download", params={"path": "datasets"}).status_code == 404


def test_inspect_lists_keys_tensors_and_parameters(client: TestClient, shared: Path) -> None:
    found = client.get("/api/files/inspect", params={"path": "checkpoints/run-1/step-7.pt"}).json()
    assert found["parameters"] == 4 * 3 + 3
    assert {t["name"]: t["shape"] for t in found["tensors"]} == {"model.weight": [3, 4], "model.bias": [3]}
    assert found["keys"]["step"] == "int 7"
    page = client.get("/files/inspect", params={"path": "checkpoints/run-1/step-7.pt"}).text
    assert "model.weight" in page and "15 model parameters" in page


def test_inspect_explains_files_that_are_not_checkpoints(client: TestClient, shared: Path) -> None:
    good = (shared / "checkpoints/run-1/step-7.pt").read_bytes()
    (shared / "datasets" / "cut.pt").write_bytes(good[: len(good) // 2])
    (shared / "datasets" / "legacy.pt").write_bytes(pickle.dumps(Path("/"), protocol=2))  # refused, never run
    torch.save({"model": Path("/")}, shared / "datasets" / "zipped.pt")
    cases = {
        "datasets/cut.pt": "not a PyTorch checkpoint",
        "datasets/notes.txt": "not a PyTorch checkpoint",
        "datasets/legacy.pt": "(pathlib.PosixPath) that safe loading",
        "datasets/zipped.pt": "refuses",
    }
    for path, message in cases.items():
        response = client.get("/api/files/inspect", params={"path": path})
        assert response.status_code == 422 and message in response.json()["detail"][0]["msg"], (path, response.text)
        assert response.json()["detail"][0]["loc"] == ["query", "path"]


def test_inspect_gives_up_on_a_load_that_takes_too_long(
    client: TestClient, shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints, "INSPECT_TIMEOUT_S", 0.05)  # less than the child needs just to import torch
    response = client.get("/api/files/inspect", params={"path": "checkpoints/run-1/step-7.pt"})
    assert response.status_code == 422 and "took longer" in response.json()["detail"][0]["msg"]
    probe = f"checkpoint_probe\0{shared}"  # this test's probe: other test runs on the machine may have their own
    assert not [p for p in os.listdir("/proc") if p.isdigit() and probe in _cmdline(p)]


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def test_browse_page_shows_the_folder_and_the_disk(client: TestClient, shared: Path) -> None:
    page = client.get("/files", params={"path": "checkpoints/run-1"}).text
    assert "step-7.pt" in page and "Inspect" in page and "free of" in page


def test_links_that_lead_round_in_a_circle_are_404_and_their_folder_still_lists(
    client: TestClient, shared: Path
) -> None:
    (shared / "datasets" / "loop").symlink_to("loop")
    (shared / "datasets" / "ping").symlink_to("pong")
    (shared / "datasets" / "pong").symlink_to("ping")
    for endpoint in ("/api/files", "/api/files/download", "/api/files/inspect", "/files"):
        for path in ("datasets/loop", "datasets/ping/x"):
            response = client.get(endpoint, params={"path": path})
            assert response.status_code == 404 and "circle" in response.text, (endpoint, path, response.text)
    listing = client.get("/api/files", params={"path": "datasets"})
    assert listing.status_code == 200 and "loop" not in {e["name"] for e in listing.json()["entries"]}
    assert client.get("/files", params={"path": "datasets"}).status_code == 200
    refused = client.post("/api/runs", json={"init_from": "datasets/ping"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "init_from"]

"""A clean install works: `pip install .` into a fresh venv that sees no system packages (torch pinned first, as
scripts/setup pins it), then that venv's `rankboard serve` trains a real 2-rank run to a checkpoint.

The venv made by scripts/setup sees the system's packages, so an import the project does not declare (numpy, which
torch's object collectives need on CPU) goes unnoticed there; this venv has only what pyproject.toml brings.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tomllib

from app.launcher import processes
from tests.live import free_port, run_processes, wait_for

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parent.parent
TORCH = f"torch=={os.environ.get('RANKBOARD_TORCH_VERSION', '2.13.0')}"  # the pin of scripts/setup


def _source_copy(target: Path) -> Path:
    """The working tree's files that git tracks or would (a fresh clone, with today's edits), nothing ignored:
    pip builds in the folder it installs from, and must not write into this checkout."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, names):
        if (REPO / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).write_bytes((REPO / name).read_bytes())
    return target


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with torch (pinned) and then `pip install .`, and nothing of the system's site-packages."""
    root = tmp_path_factory.mktemp("install")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]  # no .pyc: faster
    subprocess.run([*pip, TORCH], check=True)
    subprocess.run([*pip, str(_source_copy(root / "src"))], check=True)
    return venv


@pytest.fixture
def served(venv: Path, tmp_path: Path) -> Iterator[str]:
    """The venv's own `rankboard serve`, started outside this checkout, on its own data and shared folders."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and "RANKBOARD_" not in k}
    env |= {"RANKBOARD_DATA_DIR": str(tmp_path / "data"), "RANKBOARD_SHARED_DIR": str(tmp_path / "shared"),
            "RANKBOARD_SLOTS": "2", "RANKBOARD_SUPERVISE_INTERVAL_S": "0.2"}  # fmt: skip
    with open(tmp_path / "server.log", "wb") as log:
        server = subprocess.Popen([str(venv / "bin" / "rankboard"), "serve", "--port", str(port)], cwd=tmp_path,
                                  env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: server.poll() is not None or _answers(url), 60, what="the installed server to answer")
        assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        processes.kill_all(run_processes(tmp_path))


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _version(venv: Path) -> str:
    result = subprocess.run([str(venv / "bin" / "rankboard"), "--version"], check=True, capture_output=True, text=True)
    return result.stdout.split()[-1]


def test_the_installed_package_serves_its_pages_and_trains_a_run_to_a_checkpoint(
    venv: Path, served: str, tmp_path: Path
) -> None:
    with httpx.Client(base_url=served, timeout=10) as api:
        assert api.get("/").status_code == 200 and "Rankboard" in api.get("/").text  # templates were installed
        assert api.get("/static/app.css").status_code == 200
        assert api.get("/openapi.json").json()["info"]["version"] == _version(venv)
        created = api.post("/api/runs", json={"name": "installed", "workload": "mlp", "nproc_per_node": 2, "epochs": 1})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]

        def ended() -> dict | None:
            run = api.get(f"/api/runs/{run_id}").json()
            return run if run["status"] in {"succeeded", "failed", "stopped", "lost"} else None

        run = wait_for(ended, 120, what="the run to end")
        logs = "\n".join(line for o in api.get(f"/api/runs/{run_id}/output").json() for line in o["lines"])
        assert run["status"] == "succeeded", (run["status_reason"], logs[-3000:])
        points = api.get(f"/api/runs/{run_id}/metrics/loss").json()["points"]
        checkpoints = api.get(f"/api/runs/{run_id}/checkpoints").json()
    assert points and all(p["value"] > 0 for p in points)
    assert checkpoints and (tmp_path / "shared" / "checkpoints" / f"run-{run_id}" / checkpoints[-1]["name"]).is_file()


def test_a_script_beside_its_own_trainer_py_imports_the_installed_client_as_rankboard(
    venv: Path, tmp_path: Path
) -> None:
    (tmp_path / "trainer.py").write_text("WHO = 'the user'\n")
    (tmp_path / "train.py").write_text(
        "import trainer\nfrom rankboard import report\nprint(trainer.WHO, report.__name__, report.wire.__name__)\n"
    )
    result = subprocess.run([str(venv / "bin" / "python"), "train.py"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["the", "user", "rankboard.report", "rankboard.wire"]


def test_the_wheel_lists_every_package_folder() -> None:
    """pyproject.toml lists the packages by hand (`rankboard` is `trainer/rankboard/`, under its own name); a folder
    added later but not listed would be missing from every installed copy."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(path.relative_to(REPO).parts)
        for top in ("app", "trainer", "migrations", "templates", "static", "examples")
        for path in [REPO / top, *(REPO / top).rglob("*")]
        if path.is_dir() and path.name != "__pycache__"
    }
    client = "trainer.rankboard"  # installed as `rankboard`, with its subpackages (rankboard.importers...)
    assert listed == {name.replace(client, "rankboard", 1) if name.startswith(client) else name for name in folders}

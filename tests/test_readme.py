"""The README is a test: every shell block in README.md runs, as written, with bash, against a server started as
the README says (`scripts/serve`, on its own data and shared folders, so on port 8000), and what each block does is
checked: a run it creates succeeds (or ends `stopped` when the block stops it), a series or list it reads is not
empty, no answer is an error.

The blocks are read from README.md itself, so an edited README is checked again. A block that must not run here is
marked in the README, on the line before it, with `<!-- not run by tests/test_readme.py: <why> -->`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.launcher import processes
from tests.live import KNOWN_EXIT_ABORT, run_processes, wait_for

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
URL = "http://127.0.0.1:8000"  # the README's `localhost:8000`
SKIP = re.compile(r"<!-- not run by tests/test_readme\.py: (?P<why>.+?) -->", re.DOTALL)
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<code>.*?)^```$", re.DOTALL | re.MULTILINE)
SHELLS = {"bash", "sh", "shell", "console"}
FINAL = {"succeeded", "failed", "stopped", "lost"}


@dataclass(frozen=True)
class Block:
    """A shell block of the README: where it starts, what it says, and why it is not run (if it is not)."""

    line: int
    code: str
    not_run: str | None


def shell_blocks(text: str) -> list[Block]:
    """Every fenced bash/sh block, with the reason of the marker right above it; a marker anywhere else is refused."""
    blocks, markers_used = [], set()
    for fence in FENCE.finditer(text):
        if fence["lang"] not in SHELLS:
            continue
        before = text[: fence.start()].rstrip()
        marker = next((m for m in SKIP.finditer(before) if m.end() == len(before)), None)
        if marker is not None:
            markers_used.add(marker.start())
        why = None if marker is None else " ".join(marker["why"].split())
        blocks.append(Block(text.count("\n", 0, fence.start()) + 1, fence["code"], why))
    stray = [m.start() for m in SKIP.finditer(text) if m.start() not in markers_used]
    assert not stray, f"README.md: a 'not run' marker not right above a shell block, at offset {stray}"
    return blocks


BLOCKS = shell_blocks(README.read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The README's first command, `scripts/serve`, run as written in the background, on fresh data and shared
    folders; yields the shared folder."""
    serve = BLOCKS[0].code.splitlines()[0]
    assert serve.startswith("scripts/serve"), "README.md: the first block's first line must be `scripts/serve`"
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 8000)) == 0:
            pytest.fail("port 8000 is taken: the README's commands talk to localhost:8000, so this test needs it free")
    root = tmp_path_factory.mktemp("readme")
    env = _environment(root)
    with open(root / "server.log", "wb") as log:
        process = subprocess.Popen(["bash", "-c", serve], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: process.poll() is not None or _answers(), 300, interval=0.5, what="scripts/serve to answer")
        assert process.poll() is None, (root / "server.log").read_text()[-3000:]
        yield root / "shared"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
        processes.kill_all(run_processes(root))


def _environment(root: Path) -> dict[str, str]:
    """This environment without any RANKBOARD_ setting, but with its own data and shared folders."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKBOARD_") and k != "VIRTUAL_ENV"}
    return env | {"RANKBOARD_DATA_DIR": str(root / "data"), "RANKBOARD_SHARED_DIR": str(root / "shared")}


def _answers() -> bool:
    try:
        return httpx.get(f"{URL}/api/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def json_documents(output: str) -> list[Any]:
    """The JSON values a block printed (curl writes them back to back), skipping any other text (torchrun's)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (start := min((i for i in (output.find("{", at), output.find("[", at)) if i >= 0), default=-1)) >= 0:
        try:
            value, at = decoder.raw_decode(output, start)
            found.append(value)
        except json.JSONDecodeError:
            at = start + 1
    return found


def run_ids(api: httpx.Client) -> set[int]:
    return {run["id"] for run in api.get("/api/runs", params={"limit": 500}).json()["items"]}


def check_printed(documents: list[Any]) -> None:
    """No answer is an error; a series read has points; a list read is not empty."""
    for document in documents:
        assert not (isinstance(document, dict) and "detail" in document), f"an error answer: {document}"
        if isinstance(document, dict) and "points" in document:
            assert document["points"], f"a series without points: {document}"
        if isinstance(document, list):
            assert document, "an empty list"


def check_created(api: httpx.Client, created: set[int], stopped: set[int], shared: Path) -> None:
    """Each run the block made ends as the block means it to: stopped if it stops it, else succeeded, with its
    loss points stored."""
    for run_id in sorted(created):

        def ended(run_id: int = run_id) -> dict[str, Any] | None:
            run = api.get(f"/api/runs/{run_id}").json()
            return run if run["status"] in FINAL else None

        run = wait_for(ended, 180, interval=0.5, what=f"run {run_id} to end")
        expected = "stopped" if run_id in stopped else "succeeded"
        logs = sorted((shared / "logs" / f"run-{run_id}").rglob("*"))
        assert run["status"] == expected, (run["status_reason"], [str(p) for p in logs])
        if expected == "succeeded":
            assert api.get(f"/api/runs/{run_id}/metrics/loss").json()["points"], f"run {run_id} stored no loss"


def run_block(block: Block, root: Path) -> subprocess.CompletedProcess[str]:
    """Runs the block with bash; once more if a torchrun in it failed by torch's known abort at exit (the README
    says so beside the block that runs one by hand: 3 of 60 runs of that script here)."""
    for _ in range(2):
        result = subprocess.run(["bash", "-e", "-c", block.code], cwd=REPO, env=_environment(root),
                                capture_output=True, text=True, timeout=300)  # fmt: skip
        if result.returncode == 0 or KNOWN_EXIT_ABORT not in result.stderr:
            break
    return result


@pytest.mark.parametrize("block", BLOCKS, ids=[f"README.md:{block.line}" for block in BLOCKS])
def test_the_readme_block_runs_as_written_and_does_what_it_says(block: Block, server: Path) -> None:
    if block.not_run is not None:
        pytest.skip(f"marked in README.md: {block.not_run}")
    with httpx.Client(base_url=URL, timeout=10) as api:
        before = run_ids(api)
        result = run_block(block, server.parent)
        assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        check_printed(json_documents(result.stdout))
        stopped = {int(run_id) for run_id in re.findall(r"/api/runs/(\d+)/stop", block.code)}
        check_created(api, run_ids(api) - before, stopped, server)


def test_the_readme_opens_with_its_two_commands() -> None:
    assert [line.split()[0] for line in BLOCKS[0].code.splitlines()] == ["scripts/serve", "scripts/test"]
    # Only that block is left out, those that would turn authentication on for the server the others share, and those
    # that start a server of their own with other settings (on the port the shared one holds).
    reasons = ("turns authentication on", "starts a server of its own")
    assert BLOCKS[0].not_run and all(block.not_run is None or any(why in block.not_run for why in reasons)
                                     for block in BLOCKS[1:])  # fmt: skip

"""What `report.log` takes, as a W&B or TensorBoard user writes it, through the real client to the real server: nested
mappings, a step left out, tensors and numpy scalars; what is not a number is refused once per key and never raised.
And a script's progress: a declared total, and no epochs it never counted."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from rankboard import wire
from rankboard.report import Reporter

from tests.live import LiveServer, free_port, open_run, points, wait_for

TOKEN = "log-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("server"), RANKBOARD_SUPERVISE_INTERVAL_S="3600")
    live.start()
    yield live
    live.stop()


def reporter_for(server: LiveServer, run_id: int, spool: Path, **options: float) -> Reporter:
    return Reporter(server.url, str(run_id), TOKEN, spool, flush_interval=0.02, **options)  # type: ignore[arg-type]


def series(server: LiveServer, run_id: int) -> dict[str, list[tuple[int, float]]]:
    """Every key the run reported, with its (step, value) points."""
    with server.api() as api:
        keys = api.get(f"/api/runs/{run_id}/metrics").json()
        return {key: [(p["step"], wire.decode_value(p["value"])) for p in points(api, run_id, key)] for key in keys}


def run_of(server: LiveServer, run_id: int) -> dict:
    with server.api() as api:
        return api.get(f"/api/runs/{run_id}").json()  # type: ignore[no-any-return]


def test_nested_mappings_are_flattened_with_their_keys_joined_by_slashes(server: LiveServer, tmp_path: Path) -> None:
    run_id = open_run(server, TOKEN)
    reporter = reporter_for(server, run_id, tmp_path)
    reporter.log({"train": {"loss": 0.5, "acc": 0.75}, "lr": 1e-3, "a": {"b": {"c": {"d": 4.0}}}}, step=1)
    reporter.log({"val": {"loss": 0.25}, "train": {}}, step=2)  # an empty mapping adds nothing
    reporter.close()
    assert series(server, run_id) == {
        "a/b/c/d": [(1, 4.0)],
        "lr": [(1, 1e-3)],
        "train/acc": [(1, 0.75)],
        "train/loss": [(1, 0.5)],
        "val/loss": [(2, 0.25)],
    }


def test_a_step_left_out_continues_after_the_last_one_logged(server: LiveServer, tmp_path: Path) -> None:
    """As wandb.log counts: 0, 1, 2 for calls that name no step; one that names a step sets the counter."""
    run_id = open_run(server, TOKEN)
    reporter = reporter_for(server, run_id, tmp_path)
    for value in (1.0, 2.0, 3.0):
        reporter.log({"loss": value})
    reporter.log({"loss": 4.0}, step=10)
    reporter.sample({"sys/cpu_percent": 50.0}, step=1_700_000_000)  # the GPU sampler's clock is no training step
    reporter.log({"loss": 5.0})
    reporter.log({"loss": 6.0}, step=np.int64(20))  # type: ignore[arg-type]  # a numpy step is a step too
    reporter.log({"loss": 7.0})
    reporter.close()
    assert series(server, run_id)["loss"] == [(0, 1.0), (1, 2.0), (2, 3.0), (10, 4.0), (11, 5.0), (20, 6.0), (21, 7.0)]


def test_tensors_and_numpy_scalars_are_numbers_and_a_bool_is_0_or_1(server: LiveServer, tmp_path: Path) -> None:
    run_id = open_run(server, TOKEN)
    reporter = reporter_for(server, run_id, tmp_path)
    weight = torch.tensor([1.5, -2.0], requires_grad=True)
    reporter.log({
        "loss": (weight * weight).sum(),  # 0-d, with a graph: read with .item()
        "w0": weight[0],
        "one": torch.tensor([[0.25]]),  # one element, two dimensions
        "f32": np.float32(0.5), "i64": np.int64(7), "np_bool": np.bool_(True), "array0d": np.array(3.0),
        "array1": np.array([2.5]),
        "ok": True, "steps": 12,
    }, step=1)  # fmt: skip
    reporter.close()
    values = {key: points[0][1] for key, points in series(server, run_id).items()}
    assert values == {"loss": 6.25, "w0": 1.5, "one": 0.25, "f32": 0.5, "i64": 7.0, "np_bool": 1.0, "array0d": 3.0,
                      "array1": 2.5, "ok": 1.0, "steps": 12.0}  # fmt: skip


def test_what_is_not_a_number_is_skipped_with_one_warning_naming_its_key(
    server: LiveServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    run_id = open_run(server, TOKEN)
    reporter = reporter_for(server, run_id, tmp_path)
    looped: dict[str, object] = {}
    looped["self"] = looped  # holds itself: ends at the longest key, never in a RecursionError
    odd = {"note": "0.5", "list": [1.0], "none": None, "many": torch.ones(3), "grid": np.zeros((2, 2)),
           "complex": 1j, "raw": b"1", "nested": {"bad": "x", 3: 1.0}, "looped": looped}  # fmt: skip
    for step in range(3):  # each refused every time, said once
        reporter.log({**odd, "loss": 0.5}, step=step)
    reporter.log(["not", "a", "mapping"], step=4)  # type: ignore[arg-type]
    reporter.close()
    assert series(server, run_id) == {"loss": [(0, 0.5), (1, 0.5), (2, 0.5)]}
    said = [line for line in capfd.readouterr().err.splitlines() if line.startswith("rankboard: ")]
    for key, what in [("'note'", "'0.5' is not a number"), ("'list'", "[1.0] is not a number"),
                      ("'none'", "None is not a number"), ("'many'", "a Tensor of shape (3,) is not a number"),
                      ("'grid'", "a ndarray of shape (2, 2) is not a number"), ("'complex'", "1j is not a number"),
                      ("'raw'", "b'1' is not a number"), ("'nested/bad'", "'x' is not a number")]:  # fmt: skip
        assert [line for line in said if f"metric {key}:" in line] == [f"rankboard: [rank 0] metric {key}: {what}; "
                                                                       "skipped"], key  # fmt: skip
    assert sum("metric 'nested' holds the key 3: nested keys must be strings" in line for line in said) == 1
    assert sum(f"longer than {wire.MAX_KEY_LENGTH} characters" in line for line in said) == 1
    assert sum("log() takes a mapping of names to numbers, not ['not', 'a', 'mapping']" in line for line in said) == 1


def test_a_flat_dict_of_floats_stays_in_the_plain_loop(tmp_path: Path) -> None:
    """The training loop's path: floats go straight into the queue, never through the conversions for other values
    (its cost is measured in bench/log_call.py)."""
    reporter = Reporter(f"http://127.0.0.1:{free_port()}", "1", TOKEN, tmp_path, start=False)

    def converted(*args: object) -> None:
        raise AssertionError(f"a plain float left the plain loop: {args}")

    reporter._queue_other = converted  # type: ignore[method-assign]
    reporter.log({"loss": 0.5, "lr": 1e-3}, step=7)
    reporter.log({"loss": 0.25})
    assert [(key, step, value) for key, step, value, _time, _rank in reporter._points] == [
        ("loss", 7, 0.5), ("lr", 7, 1e-3), ("loss", 8, 0.25)]  # fmt: skip


def test_a_scripts_progress_declares_its_total_and_is_sent_only_when_it_moves(
    server: LiveServer, tmp_path: Path
) -> None:
    """Repeated by the reporter's thread while the script hangs, a progress would tell the server that it moves."""
    run_id = open_run(server, TOKEN)
    reporter = reporter_for(server, run_id, tmp_path, heartbeat_interval=0.05)
    reporter.progress(total_steps=100)  # a total declared: the step follows the steps logged
    for step in range(1, 6):
        reporter.log({"loss": 1 / step})  # steps 0..4
    first = wait_for(lambda: (r := run_of(server, run_id))["step"] == 4 and r, 10, interval=0.05, what="step 4")
    assert (first["total_steps"], first["epoch"]) == (100, 0)
    reporter.progress(step=30)  # the total declared stays
    moved = wait_for(lambda: (r := run_of(server, run_id))["step"] == 30 and r, 10, interval=0.05, what="step 30")
    assert moved["total_steps"] == 100 and moved["heartbeat_at"] > first["heartbeat_at"]
    time.sleep(1)  # the thread posts every 0.05 s meanwhile, and none of its posts says the script moved
    assert run_of(server, run_id)["heartbeat_at"] == moved["heartbeat_at"]
    reporter.progress(step=40, total_steps=200, epoch=2, epochs=3)
    reporter.close()
    last = run_of(server, run_id)
    assert (last["step"], last["total_steps"], last["epoch"]) == (40, 200, 2)


SCRIPT = """
import sys
from rankboard import report

report.init(name="declared", total_steps=int(sys.argv[1]), sample_gpus=False)
for step in range(int(sys.argv[2])):
    report.log({"train": {"loss": 1.0 / (step + 1)}, "note": "text"})
report.finished()
"""


def test_a_script_launched_elsewhere_declares_its_total_with_init_and_reports_no_epochs(
    server: LiveServer, tmp_path: Path
) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("RANKBOARD_")}
    env[wire.ENV_URL] = server.url
    script = tmp_path / "declared.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run([sys.executable, str(script), "40", "25"], env=env, capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    assert done.stderr.count("metric 'note': 'text' is not a number; skipped") == 1, done.stderr
    with server.api() as api:
        [run] = [r for r in api.get("/api/runs").json()["items"] if r["name"] == "declared"]
    assert (run["status"], run["step"], run["total_steps"], run["epoch"], run["epochs"]) == (
        "succeeded", 24, 40, 0, None)  # fmt: skip
    assert series(server, run["id"]) == {"train/loss": [(step, 1.0 / (step + 1)) for step in range(25)]}

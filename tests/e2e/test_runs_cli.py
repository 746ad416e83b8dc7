"""`rankboard runs ...` and the Python client as a user meets them: the real command, as a subprocess, against a real
server running real 1- and 2-rank torchruns; and against a server with authentication on, for tokens. Runs are
short (one epoch of large batches), and one server serves the whole module."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rankboard.client import Client, ClientError, WaitTimedOut

from tests.e2e.runs import finished_runs_with_loss
from tests.live import REPO, LiveServer, free_port, serving, wait_for

pytestmark = pytest.mark.e2e
RANKBOARD = REPO / ".venv" / "bin" / "rankboard"
SHORT = ["--epochs", "1", "--batch-size", "256", "--nproc-per-node", "2"]  # 128 steps
IMPORT_FAILS = "import torch\nimport a_module_that_is_not_installed\n"


def rankboard(*args: str, timeout: float = 180, **env: str) -> subprocess.CompletedProcess[str]:
    """The installed command, with no RANKBOARD_ setting but those given, and no client config file."""
    return subprocess.run([str(RANKBOARD), *args], env=environment(**env), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip


def environment(**env: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RANKBOARD_")}
    return clean | {"XDG_CONFIG_HOME": str(REPO / "tests" / "no-such-config"), **env}


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command wrote, checked to be one line, with no traceback, and a non-zero exit."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    return result.stderr.strip()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serving(tmp_path_factory.mktemp("cli"), RANKBOARD_SLOTS="2", RANKBOARD_STOP_GRACE_S="30") as live:
        yield live


def test_start_wait_exits_0_on_success_while_logs_follow_to_the_end(server: LiveServer, tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('name = "from-a-file"\nepochs = 5\nlr = 0.003\n')  # the flags' epochs wins over the file's
    waiting = subprocess.Popen([str(RANKBOARD), "runs", "start", "--config", str(config), *SHORT, "--wait"],
                               env=environment(RANKBOARD_URL=server.url), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert waiting.stderr is not None
    first = waiting.stderr.readline()  # "run 1 queued: from-a-file"
    run_id = int(first.split()[1])
    follow = rankboard("runs", "logs", str(run_id), "-f", "--url", server.url)
    status = Client(server.url).get(run_id)["status"]
    progress = first + waiting.stderr.read()
    out = waiting.stdout.read() if waiting.stdout else ""
    assert waiting.wait(timeout=180) == 0, (progress, out)
    assert status == "succeeded", "logs -f ended before the run did"
    assert follow.returncode == 0 and "Traceback" not in follow.stderr, follow.stderr
    assert "finished after 128 steps" in follow.stdout.splitlines()[-1], follow.stdout[-2000:]
    assert f"run {run_id} succeeded" in out
    assert "step 128/128" in progress and "loss " in progress, progress
    run = Client(server.url).get(run_id)
    assert (run["name"], run["epochs"], run["lr"], run["batch_size"]) == ("from-a-file", 1, 0.003, 256)


def test_json_output_parses_and_says_what_the_api_says(server: LiveServer, tmp_path: Path) -> None:
    client = Client(server.url)
    run = succeeded_run(client)
    listed = json.loads(rankboard("runs", "list", "--json", "--status", "succeeded", RANKBOARD_URL=server.url).stdout)
    assert run["id"] in {r["id"] for r in listed}
    got = json.loads(rankboard("runs", "get", str(run["id"]), "--json", RANKBOARD_URL=server.url).stdout)
    assert got["status"] == "succeeded" and got["events"]
    said = rankboard("runs", "get", str(run["id"]), RANKBOARD_URL=server.url).stdout.splitlines()
    assert said[0] == f"run {run['id']} {run['name']}: succeeded (training finished)"
    assert re.fullmatch(
        r"  step 128 of 128, epoch 1/1, final loss [\d.]+; created \d{4}-\d\d-\d\d \d\d:\d\d UTC", said[1]
    )
    points = json.loads(rankboard("runs", "metrics", str(run["id"]), "loss", "--json", RANKBOARD_URL=server.url).stdout)
    assert [p["step"] for p in points] == list(range(1, 129)) and points == client.series(run["id"], "loss")
    csv = rankboard("runs", "metrics", str(run["id"]), "loss", "--csv", RANKBOARD_URL=server.url).stdout.splitlines()
    assert csv[0] == "step,rank,value,time" and len(csv) == 129 and float(csv[1].split(",")[2]) == points[0]["value"]
    (checkpoint,) = json.loads(
        rankboard("runs", "checkpoints", str(run["id"]), "--json", RANKBOARD_URL=server.url).stdout
    )
    saved = tmp_path / "weights.pt"
    fetched = rankboard("runs", "download", str(run["id"]), checkpoint["name"], "-o", str(saved), "--json",
                        RANKBOARD_URL=server.url)  # fmt: skip
    assert json.loads(fetched.stdout) == {"path": str(saved), "size": checkpoint["size"]}
    assert saved.read_bytes() == (server.root / "shared" / checkpoint["path"]).read_bytes()
    nowhere = tmp_path / "missing" / "weights.pt"
    unwritable = rankboard("runs", "download", str(run["id"]), checkpoint["name"], "-o", str(nowhere),
                           RANKBOARD_URL=server.url)  # fmt: skip
    assert one_error_line(unwritable) == f"rankboard: cannot write {nowhere}: No such file or directory"


def succeeded_run(client: Client) -> dict:
    """A succeeded run of 128 steps: the one an earlier test made, or a new one."""
    done = [run for run in client.list(status="succeeded") if run["total_steps"] == 128]
    if done:
        return done[0]
    return client.wait(client.create(name="short", epochs=1, batch_size=256, nproc_per_node=2)["id"], 180)


def test_start_wait_exits_3_when_the_script_fails(server: LiveServer) -> None:
    (server.root / "shared" / "broken.py").write_text(IMPORT_FAILS)
    failed = rankboard("runs", "start", "--script", "broken.py", "--nproc-per-node", "1", "--wait",
                       RANKBOARD_URL=server.url)  # fmt: skip
    assert failed.returncode == 3, (failed.stdout, failed.stderr)
    assert "failed: " in failed.stdout and "exited with 1" in failed.stdout
    run_id = int(failed.stdout.split()[1])
    errors = rankboard("runs", "logs", str(run_id), "--stream", "stderr", RANKBOARD_URL=server.url).stdout
    assert "No module named 'a_module_that_is_not_installed'" in errors


def test_start_wait_exits_4_when_the_client_stops_the_run(server: LiveServer) -> None:
    waiting = subprocess.Popen([str(RANKBOARD), "runs", "start", "--name", "long", "--epochs", "100",
                                "--nproc-per-node", "1", "--wait"], env=environment(RANKBOARD_URL=server.url),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert waiting.stderr is not None
    run_id = int(waiting.stderr.readline().split()[1])
    client = Client(server.url)
    wait_for(lambda: client.get(run_id)["step"] > 0, 120, what="the run to train")
    assert client.stop(run_id)["status"] == "stopping"
    stopped = client.wait(run_id, timeout=120)
    assert stopped["status"] == "stopped"
    assert waiting.wait(timeout=60) == 4, waiting.stderr.read()
    assert client.resume(run_id)["status"] == "queued"
    client.stop(run_id)
    assert client.wait(run_id, timeout=120)["status"] == "stopped"


def test_start_wait_outlives_a_server_restart(server: LiveServer) -> None:
    waiting = subprocess.Popen([str(RANKBOARD), "runs", "start", "--name", "restarted", "--epochs", "100",
                                "--nproc-per-node", "1", "--wait"], env=environment(RANKBOARD_URL=server.url),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert waiting.stderr is not None and waiting.stdout is not None
    run_id = int(waiting.stderr.readline().split()[1])
    client = Client(server.url)
    wait_for(lambda: client.get(run_id)["step"] > 0, 120, what="the run to train")
    server.stop(signal.SIGKILL)  # the trainer goes on, and spools what it cannot send
    time.sleep(3)  # three of the client's polls find no server
    assert waiting.poll() is None, waiting.stderr.read()
    server.start()
    client.stop(run_id)
    assert waiting.wait(timeout=120) == 4, waiting.stderr.read()
    assert f"run {run_id} stopped" in waiting.stdout.read()


def test_the_python_client_creates_waits_and_reads_a_series(server: LiveServer) -> None:
    client = Client(server.url)
    run = client.wait(client.create(name="from-python", epochs=1, batch_size=256, nproc_per_node=2)["id"], 180)
    assert run["status"] == "succeeded", run["status_reason"]
    assert run["id"] in {listed["id"] for listed in client.list(status="succeeded")}
    points = client.series(run["id"], "loss")
    assert [p["step"] for p in points] == list(range(1, 129))
    assert client.series(run["id"], "loss", start_step=100) == points[99:]
    assert "finished after 128 steps" in client.logs(run["id"], lines=5)[-1]
    assert list(client.follow_logs(run["id"]))[-1] == client.logs(run["id"], lines=1)[-1]  # an ended run: at once
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ClientError, match="needs pandas"):
            client.series_frame(run["id"], "loss")
    else:
        frame = client.series_frame(run["id"], "loss")
        assert list(frame["step"]) == list(range(1, 129))


def test_the_python_client_raises_one_clear_error(server: LiveServer) -> None:
    with pytest.raises(ClientError) as unknown:
        Client(server.url).get(999_999)
    assert (unknown.value.status, unknown.value.message) == (404, "404: run 999999 does not exist")
    with pytest.raises(ClientError) as refused:
        Client(server.url).create(name="x", epochs=0)
    assert refused.value.status == 422 and "epochs: " in refused.value.message
    with pytest.raises(ClientError) as unreachable:
        Client(f"http://127.0.0.1:{free_port()}").list()
    assert unreachable.value.status is None and "cannot reach" in unreachable.value.message
    client = Client(server.url)
    queued = client.create(name="waited-for", nproc_per_node=1, epochs=100)
    with pytest.raises(WaitTimedOut, match=f"run {queued['id']} is still (queued|starting) after 0 s"):
        client.wait(queued["id"], 0)
    assert client.wait(client.stop(queued["id"])["id"], 60)["status"] == "stopped"


def test_errors_are_one_line_and_a_non_zero_exit(server: LiveServer) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    assert one_error_line(rankboard("runs", "list", "--url", nobody)).startswith(f"rankboard: cannot reach {nobody}")
    assert "cannot reach" in one_error_line(rankboard("runs", "start", "--wait", RANKBOARD_URL=nobody))
    unknown = one_error_line(rankboard("runs", "get", "999999", RANKBOARD_URL=server.url))
    assert unknown == "rankboard: 404: run 999999 does not exist"
    assert "404" in one_error_line(rankboard("runs", "logs", "999999", "-f", RANKBOARD_URL=server.url))
    refused = one_error_line(rankboard("runs", "start", "--epochs", "0", "--nccl-env", "PATH=/x",
                                       RANKBOARD_URL=server.url))  # fmt: skip
    assert "epochs: " in refused and "nccl_env: " in refused
    timed_out = rankboard("runs", "start", "--nproc-per-node", "1", "--epochs", "100", "--wait", "--timeout", "0",
                          RANKBOARD_URL=server.url)  # fmt: skip
    assert timed_out.returncode == 6, timed_out.stderr
    assert re.search(r"^rankboard: run \d+ is still (queued|starting|running) after 0 s$", timed_out.stderr, re.M)
    Client(server.url).stop(int(timed_out.stderr.split()[1]))
    run = Client(server.url).stop(Client(server.url).create(name="typos", nproc_per_node=1, epochs=100)["id"])
    typo = one_error_line(rankboard("runs", "metrics", str(run["id"]), "nosuchkey", RANKBOARD_URL=server.url))
    assert typo.startswith(f"rankboard: 404: run {run['id']} has no metric 'nosuchkey'; its metrics: "), typo
    wrong_type = rankboard("runs", "start", "--epochs", "many", RANKBOARD_URL=server.url)
    assert wrong_type.returncode == 2 and wrong_type.stderr == (
        "rankboard runs start: argument --epochs: invalid int value: 'many' (see rankboard runs start -h)\n"
    )


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, str]]:
    """A server with a user, so authentication on, and an operator's token made by `rankboard tokens create`."""
    root = tmp_path_factory.mktemp("guarded")
    live = LiveServer(root)
    manage = {"RANKBOARD_DATA_DIR": str(root / "data"), "RANKBOARD_SHARED_DIR": str(root / "shared")}
    added = rankboard("users", "add", "ada", "--role", "admin", RANKBOARD_NEW_PASSWORD="a-password-1", **manage)
    assert added.returncode == 0, added.stderr
    made = rankboard("tokens", "create", "--name", "ci", "--role", "operator", **manage)
    assert made.returncode == 0, made.stderr
    live.start()
    yield live, made.stdout.strip().splitlines()[-1]
    live.stop()


def test_a_token_from_flag_environment_or_config_file_in_that_order(guarded: tuple[LiveServer, str],
                                                                    tmp_path: Path) -> None:  # fmt: skip
    server, token = guarded
    assert "401" in one_error_line(rankboard("runs", "list", "--url", server.url))
    assert "401" in one_error_line(rankboard("runs", "list", "--url", server.url, "--token", "rbt_wrong"))
    assert rankboard("runs", "list", "--url", server.url, RANKBOARD_TOKEN=token).returncode == 0
    wrong_flag = rankboard("runs", "list", "--url", server.url, "--token", "rbt_wrong", RANKBOARD_TOKEN=token)
    assert "401" in one_error_line(wrong_flag)  # the flag wins over the environment
    (tmp_path / "rankboard").mkdir()
    (tmp_path / "rankboard" / "client.toml").write_text(f'url = "{server.url}"\ntoken = "{token}"\n')
    from_file = rankboard("runs", "start", "--name", "by-file", "--nproc-per-node", "1", "--json",
                          XDG_CONFIG_HOME=str(tmp_path))  # fmt: skip
    assert from_file.returncode == 0, from_file.stderr
    run = json.loads(from_file.stdout)
    assert run["created_by"] == "token ci"
    env_wins = rankboard("runs", "get", str(run["id"]), RANKBOARD_TOKEN="rbt_wrong", XDG_CONFIG_HOME=str(tmp_path))
    assert "401" in one_error_line(env_wins)
    Client(server.url, token).stop(run["id"])
    with pytest.raises(ClientError) as refused:
        Client(server.url, "rbt_wrong").list()
    assert refused.value.status == 401


def test_client_commands_import_none_of_the_servers_packages() -> None:
    """`rankboard runs` starts fast because it imports the standard library only (and so needs nothing else)."""
    result = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-X", "importtime", "-m", "app.cli", "runs",
                             "list", "--url", f"http://127.0.0.1:{free_port()}"], env=environment(),
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    imported = {line.split("|")[-1].strip().split(".")[0] for line in result.stderr.splitlines() if "|" in line}
    assert "rankboard: cannot reach" in result.stderr and "app" in imported
    assert imported & {"sqlalchemy", "pydantic", "fastapi", "starlette", "torch", "httpx", "numpy"} == set()


def test_list_finds_sorts_and_shows_columns_and_tag_archive_delete_act(server: LiveServer, tmp_path: Path) -> None:
    """The runs table from the command line: --search, --filter, --sort, --columns; tag, note, archive, delete."""
    ids = finished_runs_with_loss(server, {"cli-a": 0.9, "cli-b": 0.2, "cli-c": 0.5})
    env = {"RANKBOARD_URL": server.url}
    listed = rankboard("runs", "list", "--search", "cli-", "--filter", "loss.min < 0.8", "--sort", "loss.min",
                       "--columns", "lr,loss.min", **env)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [str(ids["cli-b"]), str(ids["cli-c"])]
    assert "loss.min=0.2" in lines[0] and "lr=0.001" in lines[0]
    bad = one_error_line(rankboard("runs", "list", "--filter", "loss.min < low", **env))
    assert "loss.min is a number; 'low' is not" in bad
    unsorted = one_error_line(rankboard("runs", "list", "--sort=-loss.mni", **env))  # a typo: a metric no run has
    assert "sort: 'loss.mni' is no field of a run, and no run has a metric of that name" in unsorted, unsorted
    assert rankboard("runs", "tag", "keep", str(ids["cli-a"]), str(ids["cli-b"]), **env).stdout == "tagged 2 runs\n"
    tagged = rankboard("runs", "list", "--search", "keep", "--json", **env)
    assert sorted(run["id"] for run in json.loads(tagged.stdout)) == sorted([ids["cli-a"], ids["cli-b"]])
    assert rankboard("runs", "archive", str(ids["cli-a"]), **env).returncode == 0
    shown = [line.split()[0] for line in rankboard("runs", "list", "-q", "cli-", **env).stdout.splitlines()]
    assert str(ids["cli-a"]) not in shown  # the ids' column: "step 3" is no run 3
    refused = rankboard("runs", "delete", str(ids["cli-c"]), **env)  # asks; stdin is empty: not deleted
    assert refused.returncode == 1 and "not deleted" in refused.stderr and "3 metric points" in refused.stderr
    deleted = rankboard("runs", "delete", str(ids["cli-c"]), "--yes", **env)
    assert deleted.stdout.startswith(f"deleted run {ids['cli-c']}: 3 points"), deleted.stderr
    assert "404" in one_error_line(rankboard("runs", "get", str(ids["cli-c"]), **env))

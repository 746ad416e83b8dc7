"""The Slurm launcher's pure parts: the job script (every value stays data), squeue's lines, and the state map."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rankboard import wire

from app.core.folders import RunFolders
from app.core.models import Run, RunStatus
from app.core.settings import Settings
from app.launcher.interface import JobView
from app.launcher.slurm import JobOptions, SlurmLauncher, describe, ending, job_name, job_script, parse_squeue
from app.main import create_app
from app.services.lifecycle.tick import final_status

HOSTILE = ["'; touch {pwned} #", "$(touch {pwned})", "`touch {pwned}`", 'a"b', "line\nbreak", "$HOME", "*", "--x=1 2"]


def hostile_run(tmp_path: Path) -> Run:
    pwned = tmp_path / "pwned"
    return Run(id=7, name="'; touch /tmp/evil #", launcher="slurm", nproc_per_node=2, max_restarts=0,
               script=str(tmp_path / "my script $(x).py"), script_args=[a.format(pwned=pwned) for a in HOSTILE],
               slurm_nodes=2, slurm_cpus_per_task=3, slurm_gpus_per_node=0, slurm_time_limit="1-00:00",
               slurm_partition="debug", slurm_account=None, slurm_qos="high", slurm_constraint="a100&ib",
               slurm_requeue=True)  # fmt: skip


def script_argv(script: str, tmp_path: Path) -> list[str]:
    """What srun would be given when bash runs the script: srun and scontrol stand in as functions that print."""
    prelude = 'srun() { printf "%s\\0" "$@" > "$ARGV"; env > "$ARGV.env"; }\nscontrol() { echo node-a; echo node-b; }\n'
    env = {**os.environ, "ARGV": str(tmp_path / "argv"), "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_NTASKS": "2",
           "SLURM_JOB_ID": "41", "SLURM_CPUS_PER_TASK": "3"}  # fmt: skip
    subprocess.run(["bash", "-c", prelude + script], env=env, check=True, timeout=30, capture_output=True)
    return (tmp_path / "argv").read_bytes().decode().split("\0")[:-1]


def test_hostile_names_and_arguments_reach_torchrun_as_data(tmp_path: Path) -> None:
    run = hostile_run(tmp_path)
    folders = RunFolders(tmp_path / "shared")
    folders.run_dir(run).mkdir(parents=True)
    script = job_script(run, options=JobOptions.of(run, Settings(data_dir=tmp_path, stop_grace_s=45)), folders=folders,
                        python="/opt/py thon/bin/python")  # fmt: skip
    argv = script_argv(script, tmp_path)
    assert not (tmp_path / "pwned").exists() and "/tmp/evil" not in script  # the name never enters the script
    assert argv[:4] == ["--kill-on-bad-exit=1", "bash", "-c", argv[3]] and argv[4] == "/opt/py thon/bin/python"
    torchrun = argv[5:]
    assert torchrun[:5] == ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                            "--rdzv-endpoint=node-a:" + str(29500 + 41), "--rdzv-id=41"]  # fmt: skip
    # torchrun's options that a torch older than them would refuse come by variables, which it ignores.
    assert not [option for option in torchrun if option.startswith(("--signals-to-handle", "--shutdown-timeout"))]
    told = dict(line.split("=", 1) for line in (tmp_path / "argv.env").read_text().splitlines() if "=" in line)
    assert told["PET_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"  # else USR2 kills torchrun
    assert told["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "45"  # the grace, not torchrun's 30 s
    assert torchrun[-len(HOSTILE) - 1 :] == [run.script, *(run.script_args or [])]  # each argument intact
    assert (folders.run_dir(run) / "exit.json").read_text() == '{"exit_code": 0}\n'  # the exit code, recorded


def test_the_directives_carry_the_options_and_the_token_never_appears(tmp_path: Path) -> None:
    run = hostile_run(tmp_path)
    settings = Settings(data_dir=tmp_path, slurm_account="proj-1", stop_grace_s=60)
    script = job_script(run, options=JobOptions.of(run, settings), folders=RunFolders(tmp_path))
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        f"#SBATCH --job-name={job_name(run)}", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=3", "#SBATCH --time=1-00:00", "#SBATCH --partition=debug",
        "#SBATCH --account=proj-1", "#SBATCH --qos=high", "#SBATCH --constraint='a100&ib'",
        "#SBATCH --signal=B:USR2@120", "#SBATCH --open-mode=append", "#SBATCH --requeue",
    ]  # fmt: skip
    assert "RANKBOARD_TOKEN" not in script


def test_a_job_without_a_head_node_fails_loudly_rather_than_rendezvous_with_itself(tmp_path: Path) -> None:
    run = hostile_run(tmp_path)
    script = job_script(run, options=JobOptions.of(run, Settings(data_dir=tmp_path)), folders=RunFolders(tmp_path))
    done = subprocess.run(["bash", "-c", "scontrol() { :; }\n" + script], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "SLURM_JOB_NODELIST": "", "SLURM_CPUS_PER_TASK": "1"})  # fmt: skip
    assert done.returncode == 1 and "no head node" in done.stderr


def test_squeue_lines_are_read_by_job_id_and_noise_is_left_out() -> None:
    text = "12|PENDING|Resources|\n13|RUNNING|None|node-[1-2]\nslurm_load_jobs warning\n14_2|TIMEOUT|TimeLimit|n3\n"
    assert parse_squeue(text) == {
        "12": JobView("PENDING", "Resources", "", waiting=True, words="Slurm job 12: queued in Slurm (Resources)"),
        "13": JobView("RUNNING", "None", "node-[1-2]", running=True, words="Slurm job 13: running on node-[1-2]"),
        "14_2": JobView("TIMEOUT", "TimeLimit", "n3", words="Slurm job 14_2: ended in Slurm: TIMEOUT"),
    }


@pytest.mark.parametrize(
    ("state", "said"),
    [
        ("PENDING", "queued in Slurm (Priority)"),
        ("REQUEUED", "queued in Slurm (Priority)"),
        ("CONFIGURING", "queued in Slurm (Priority)"),
        ("RUNNING", "running on node-[1-2]"),
        ("COMPLETING", "running on node-[1-2]"),
        ("COMPLETED", "ended in Slurm: COMPLETED"),
    ],
)
def test_the_page_says_queued_with_the_reason_or_running_with_the_nodes(state: str, said: str) -> None:
    assert describe(JobView(state, "Priority", "node-[1-2]")) == said


@pytest.mark.parametrize(
    ("state", "status", "words"),
    [
        ("CANCELLED", RunStatus.stopped, "cancelled outside Rankboard"),
        ("TIMEOUT", RunStatus.failed, "timed out"),
        ("PREEMPTED", RunStatus.failed, "preempted"),
        ("NODE_FAIL", RunStatus.failed, "node failure on node-7"),
        ("BOOT_FAIL", RunStatus.failed, "node failure on node-7"),
        ("OUT_OF_MEMORY", RunStatus.failed, "out of memory"),
    ],
)
def test_slurm_endings_become_run_states_people_read(state: str, status: RunStatus, words: str) -> None:
    verdict = ending(JobView(state, "", "node-7"))
    assert verdict is not None and verdict[0] == status and words in verdict[1]


@pytest.mark.parametrize("state", ["COMPLETED", "FAILED"])
def test_completed_and_failed_leave_the_decision_to_the_recorded_exit_code(state: str) -> None:
    assert ending(JobView(state, "", "n1")) is None


def test_a_slurm_run_on_a_server_without_slurm_is_refused_naming_the_launcher(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, shared_dir=tmp_path / "shared", launcher="local", supervise_interval_s=3600)
    with TestClient(create_app(settings)) as client:
        answer = client.post("/api/runs", json={"launcher": "slurm", "nproc_per_node": 1})
        assert answer.status_code == 422 and "launcher" in answer.text and "Slurm" in answer.text
        assert client.get("/api/runs").json()["total"] == 0
        assert client.get("/api/health").json()["launchers"] == ["local"]
        form = client.get("/runs/new").text  # offers this host only, and none of Slurm's fields
        assert 'value="local"' in form and 'value="slurm"' not in form and "f-slurm_" not in form


@pytest.mark.parametrize(
    ("environ", "name"),
    [
        ({}, "gpu-7"),  # torchrun alone, or one agent per node
        ({"SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "1"}, "gpu-7"),
        ({"SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "2"}, "gpu-7:1"),  # two agents on one host
        ({"SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2(x3)"}, "gpu-7:0"),
    ],
)
def test_agents_that_share_a_host_report_under_names_of_their_own(environ: dict[str, str], name: str) -> None:
    assert wire.node_name(environ, "gpu-7") == name


@pytest.mark.parametrize(
    ("verdict", "stop_requested", "finished", "status"),
    [
        ((RunStatus.stopped, "cancelled outside Rankboard"), True, False, RunStatus.stopped),
        ((RunStatus.failed, "timed out"), False, True, RunStatus.succeeded),
        ((RunStatus.stopped, "cancelled outside Rankboard"), False, False, RunStatus.stopped),
    ],
)
def test_the_servers_stop_and_the_trainers_marker_come_before_slurms_word(
    verdict: tuple[RunStatus, str], stop_requested: bool, finished: bool, status: RunStatus
) -> None:
    decided = final_status(exit_code=1, stop_requested=stop_requested, trainer_finished=finished, verdict=verdict)
    assert decided[0] == status
    assert ("cancelled outside" in decided[1]) == (not stop_requested and not finished)


def test_each_agent_writes_its_ranks_logs_into_a_folder_of_its_own(tmp_path: Path) -> None:
    """The agent's command, run as each srun task runs it: the folder comes from that task's SLURM_PROCID."""
    run = hostile_run(tmp_path)
    folders = RunFolders(tmp_path / "shared dir $HOME")
    folders.run_dir(run).mkdir(parents=True)
    script = job_script(run, options=JobOptions.of(run, Settings(data_dir=tmp_path)), folders=folders)
    agent, *arguments = script_argv(script, tmp_path)[3:]  # bash -c AGENT python torchrun-arguments...
    python = tmp_path / "python"  # stands in for the interpreter: records what torchrun would be given
    python.write_text('#!/bin/sh\nprintf "%s\\0" "$@" > "$ARGV"\n')
    python.chmod(0o755)
    env = {**os.environ, "ARGV": str(tmp_path / "agent-argv"), wire.ENV_RUN_DIR: str(folders.run_dir(run))}
    for task in ("0", "1"):
        subprocess.run(["bash", "-c", agent, str(python), *arguments[1:]], env={**env, "SLURM_PROCID": task},
                       check=True, timeout=30)  # fmt: skip
        argv = (tmp_path / "agent-argv").read_bytes().decode().split("\0")[:-1]
        assert f"--log-dir={folders.run_dir(run)}/ranks/agent{task}" in argv
        assert argv[argv.index("--redirects") + 1] == "3" and "--log-dir" not in argv  # no second, shared one
    without = subprocess.run(["bash", "-c", agent, str(python)], env={"SLURM_PROCID": "1", "PATH": os.environ["PATH"]},
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    assert without.returncode != 0 and wire.ENV_RUN_DIR in without.stderr  # never a folder at the root of the disk


MAPPING = {
    "priority": {"low": {"qos": "scavenger", "nice": 1000}, "0": {"qos": "normal"},
                 "high": {"qos": "urgent", "nice": 0}},
    "owners": {"ada": {"account": "ada-lab"}, "@vision": {"account": "vision", "partition": "gpu"},
               "@nlp": {"partition": "big"}},
}  # fmt: skip


@pytest.mark.parametrize(("priority", "owner", "groups", "chosen"), [
    (-100, "cy", [], {"qos": "scavenger", "nice": 1000}),
    (-500, "cy", [], {}),  # below every band: nothing from the priority
    (5, "bo", ["vision"], {"qos": "normal", "account": "vision", "partition": "gpu"}),
    (100, "ada", ["vision", "nlp"], {"qos": "urgent", "nice": 0, "account": "ada-lab", "partition": "big"}),
])  # fmt: skip
def test_the_mapping_gives_a_job_its_priority_band_and_its_owners_or_groups_options(
    priority: int, owner: str, groups: list[str], chosen: dict[str, object]
) -> None:
    mapping = Settings.model_validate({"slurm_mapping": MAPPING}).slurm_mapping
    found = mapping.choose(priority=priority, owner=owner, groups=groups).model_dump(exclude_none=True)
    assert found == chosen


def test_the_mapped_options_fill_only_what_the_run_left_empty_and_reach_the_job_as_directives(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, slurm_mapping=MAPPING, slurm_account="server-default")
    launcher = SlurmLauncher(settings, RunFolders(tmp_path))
    run = hostile_run(tmp_path)  # its own partition (debug) and QoS (high)
    run.priority, run.owner = -100, "bo"
    mapped = launcher.scheduler_options(run, groups=["vision"])
    assert mapped == {"slurm_nice": 1000, "slurm_account": "vision"}
    for column, value in mapped.items():
        setattr(run, column, value)
    script = job_script(run, options=JobOptions.of(run, settings), folders=RunFolders(tmp_path))
    directives = [line.split()[1] for line in script.splitlines() if line.startswith("#SBATCH")]
    assert {"--partition=debug", "--account=vision", "--qos=high", "--nice=1000"} <= set(directives)


def test_a_mapping_with_a_priority_that_is_none_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="'urgent' is no priority"):
        Settings.model_validate({"slurm_mapping": {"priority": {"urgent": {"qos": "x"}}}})
    with pytest.raises(ValueError, match=r"slurm_mapping\.owners\.ada\.account"):
        Settings.model_validate({"slurm_mapping": {"owners": {"ada": {"account": "a; rm -rf /"}}}})

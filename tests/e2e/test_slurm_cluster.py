"""The tests' own Slurm cluster works as the launcher will use it: a batch job runs through srun and completes."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.slurm import node_state, wait_for


def test_the_node_is_idle_and_a_batch_job_completes(slurm: dict[str, str], tmp_path: Path) -> None:
    assert node_state(slurm) == "idle"
    tmp_path.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --ntasks=2 --cpus-per-task=1\nsrun bash -c 'echo task $SLURM_PROCID'\n")
    submitted = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/out.txt", str(script)],
                               capture_output=True, text=True, env=slurm, timeout=30, check=True)  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]

    def state() -> str:
        found = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, env=slurm)
        return found.stdout.split("JobState=")[1].split()[0]

    wait_for(f"job {job_id} to end", lambda: state() not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"), 60)
    assert state() == "COMPLETED"
    assert sorted((tmp_path / "out.txt").read_text().split("\n")) == ["", "task 0", "task 1"]

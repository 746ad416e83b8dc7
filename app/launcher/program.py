"""What a run's ranks execute and the environment they get, whichever launcher starts them."""

from __future__ import annotations

import itertools

from rankboard import wire

from app.core.folders import RunFolders
from app.core.models import Run


def trainer_program(run: Run, folders: RunFolders) -> list[str]:
    """What follows torchrun's own options: the user's script and its arguments, or `-m trainer` with the run's
    workload and its config document as flags of the same names (`batch_size` -> `--batch-size`)."""
    if run.script:
        return [run.script, *run.script_args]
    options = {"workload": run.workload, **run.trainer_options()}
    if options.get("init_from"):  # stored relative to the shared folder, which the trainer does not know
        options["init_from"] = str(folders.shared / str(options["init_from"]))
    flags = [(f"--{name.replace('_', '-')}", wire.flag_value(value)) for name, value in options.items()]
    return ["-m", "trainer", *itertools.chain.from_iterable(flags),
            "--checkpoint-dir", str(folders.checkpoint_dir(run))]  # fmt: skip


def trainer_environment(
    run: Run, *, folders: RunFolders, server_url: str, token: str, launch_id: str
) -> dict[str, str]:
    """The variables the trainer and the client read: who the run is, where to report, where its files go."""
    return {
        wire.ENV_RUN_ID: str(run.id),
        wire.ENV_SERVER_URL: server_url,
        wire.ENV_TOKEN: token,
        wire.ENV_RUN_DIR: str(folders.run_dir(run)),
        wire.ENV_CHECKPOINT_DIR: str(folders.checkpoint_dir(run)),
        wire.ENV_LAUNCH_ID: launch_id,
        "PYTHONUNBUFFERED": "1",
        # Restarted workers must not reuse the agent's rendezvous store (pytorch/pytorch#135712).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        # Each rank's collectives, for a dump to name the one behind. A script's desync checks are torch's own; the
        # built-in trainer runs a monitored barrier instead (its --desync-checks): with DETAIL, DDP's constructor
        # crashed every rank (SIGSEGV, torch 2.13 on CPU), and with the flight recorder too, the first collective.
        **({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"} if run.desync_checks and run.script else wire.FR_BUFFER_ENV),
    }

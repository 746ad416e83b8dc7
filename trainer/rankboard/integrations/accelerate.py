"""Accelerate: `Accelerator(log_with=RankboardTracker())`; needs `pip install rankboard[accelerate]`.

`accelerator.init_trackers(project, config=...)` joins the run with that config (named as the tracker was, else as
`report.init` names runs: RANKBOARD_RUN_NAME or the script), and `accelerator.log(...)` sends metrics, both from the
main process, where Accelerate calls its trackers. The other ranks join too, so that the dashboard shows every rank:
Accelerate never calls their tracker, so each waits, in a thread of its own, for the main process's run to exist
(the run's config is the first joiner's), then joins it; at the latest as it exits. A stop from the dashboard
reaches the loop only if it asks, on every rank at the same step (it is a collective):

    if tracker.stop_requested():  # or report.stop_requested() in a single process
        break
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from accelerate.tracking import GeneralTracker

from .. import external, report, wire
from ..client import Client, ClientError
from . import job

_WAIT_FOR_MAIN_S = 120.0  # then a rank joins anyway: a main process that never logs must not leave it out
_WAIT_AT_EXIT_S = 15.0
_LOOK_EVERY_S = 0.5


class RankboardTracker(GeneralTracker):
    """Reports an Accelerate run to Rankboard (see the module's docstring); arguments as `report.init` takes them."""

    name = "rankboard"
    requires_logging_directory = False
    main_process_only = False  # made on every rank by the script itself: the tracker decides what each rank does

    def __init__(
        self,
        run_name: str | None = None,
        *,
        config: Mapping[str, Any] | None = None,
        server: str | None = None,
        token: str | None = None,
        key: str | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__()
        self._run_name, self._config = run_name, dict(config or {})
        self._server, self._token = server, token
        self._key = key or os.environ.get(wire.ENV_RUN_KEY) or external.job_key()  # torchrun's: the same on every rank
        self._checkpoint_dir = checkpoint_dir
        self._joined = False
        self._joining = threading.Lock()
        if job.world()[0] != 0:
            threading.Thread(target=self._join_after_main, args=(_WAIT_FOR_MAIN_S,), daemon=True).start()
            atexit.register(self._join_at_exit)

    @property
    def tracker(self) -> report.Reporter | None:
        return report.default_reporter()

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """The run's config, sent as the main process joins."""
        self._config.update(values)
        self._join()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self._join()
        report.log({key: value for key, value in values.items() if not isinstance(value, str)}, step=step)
        if step is not None:
            report.heartbeat(step)

    def finish(self) -> None:
        if self._joined:
            report.finished()

    def stop_requested(self) -> bool:
        """Whether the dashboard asked the run to stop, agreed by every rank: call it on every rank at the same step."""
        return job.agreed_stop()

    def _join(self) -> None:
        with self._joining:
            if not self._joined:
                self._joined = True
                job.join(name=self._run_name, config=self._config, key=self._key, server=self._server,
                         token=self._token, checkpoint_dir=self._checkpoint_dir)  # fmt: skip

    def _join_after_main(self, wait_s: float) -> None:
        """A rank other than the main process: join once the main process's run exists, so that the run's config is
        the main's (or after `wait_s`)."""
        url = self._server or os.environ.get(wire.ENV_URL)
        if url:
            client = Client(url, self._token or os.environ.get(wire.ENV_TOKEN), timeout=5.0)
            deadline = time.monotonic() + wait_s
            while not self._joined and time.monotonic() < deadline and not _run_exists(client, self._key):
                time.sleep(_LOOK_EVERY_S)
        self._join()

    def _join_at_exit(self) -> None:
        """A loop shorter than the wait: the rank joins as it exits (the main process's last post makes the run),
        then says how it ended, so that the run ends once every rank has."""
        self._join_after_main(_WAIT_AT_EXIT_S)
        report.close()


def _run_exists(client: Client, key: str) -> bool:
    try:
        runs = client.list(q="external", limit=50, archived="all")
    except ClientError:
        return False
    return any(run.get("external_key") == key for run in runs)

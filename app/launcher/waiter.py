"""`python -m app.launcher.waiter EXIT_FILE -- COMMAND...`: runs COMMAND and records how it ended.

The launcher starts this small process (not torchrun directly) as the leader of the run's process session, so that
the exit code lands in the run's folder even when the server that started it is gone. It ignores SIGTERM and
SIGINT: a stop signals the whole process group, and torchrun, in the same group, is the one that must act on it.
(It catches them with a handler rather than ignoring them, because an ignored signal would stay ignored in torchrun
across exec, while a caught one is reset to the default there.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def write_exit_file(path: Path, exit_code: int) -> None:
    """Writes the exit record atomically, so a reader never sees half of it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"exit_code": exit_code, "finished_at": time.time()}))
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m app.launcher.waiter EXIT_FILE -- COMMAND...", file=sys.stderr)
        return 2
    exit_file, command = Path(argv[0]), argv[2:]
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    child = subprocess.Popen(command)
    write_exit_file(exit_file, child.wait())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A run launched elsewhere kept in a folder, for `rankboard sync` to upload later (rankboard.sync).

With RANKBOARD_MODE=offline, `report.init()` never touches the network: every process of the job writes into
RANKBOARD_OFFLINE_DIR (default ./rankboard-offline), in a folder named by the job's key, so that all of a job's
ranks, on one node or on several sharing a file system, land in one folder. A run reporting online whose server did
not take everything before the process ended leaves the same files in its spool folder (a temporary folder keyed
by the run), and says where.

Each process of a rank writes, under the stem `spool-<host>-rank<rank>`:

    .jsonl        its batches, one a line, exactly as they would have been posted (the reporter's spool)
    .aside.jsonl  batches the server failed on while it took the others (report.SetAside); online only
    .join.json    its join request (wire.Join): the run's key, name, config, total steps, checkpoint folder, ranks
    .ended.json   how its process ended (wire.Ended), written when it ends

and `rankboard sync` adds `.synced.json`: how many lines of each batches file the server has taken, so that a sync
cut short resumes there. Nothing depends on it: the server stores a point once per (run, key, step, rank).
Standard library only: the reporter imports this module on every rank.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import wire

ENV_MODE = "RANKBOARD_MODE"  # "offline": write the run to a folder; "online" (the default): report to the server
ENV_OFFLINE_DIR = "RANKBOARD_OFFLINE_DIR"
DEFAULT_OFFLINE_DIR = "rankboard-offline"
MODES = ("online", "offline")
JOIN_GLOB = "spool-*.join.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def mode(environ: Mapping[str, str]) -> tuple[str, str | None]:
    """RANKBOARD_MODE as one of MODES, and a sentence when it said something else (then: online)."""
    said = environ.get(ENV_MODE, "").strip().lower()
    if said in ("", *MODES):
        return said or "online", None
    return "online", f"{ENV_MODE}={environ[ENV_MODE]!r} is neither online nor offline; reporting online"


def run_folder(environ: Mapping[str, str], key: str) -> Path:
    """Where a run of this key is written offline: RANKBOARD_OFFLINE_DIR/<the key, made a file name>, absolute."""
    root = Path(environ.get(ENV_OFFLINE_DIR) or DEFAULT_OFFLINE_DIR)
    # A key holds colons and slashes ("slurm:c1:81234"); the digest keeps two keys that read alike apart.
    name = f"{_UNSAFE.sub('_', key)[:80]}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
    return (root / name).absolute()


@dataclasses.dataclass(frozen=True)
class RankFiles:
    """The files of one rank's process in a run's folder (see the module's docstring)."""

    folder: Path
    stem: str  # spool-<host>-rank<rank>

    @classmethod
    def of(cls, folder: Path, host: str, rank: int) -> RankFiles:
        return cls(folder, f"spool-{host}-rank{rank}")

    @classmethod
    def from_join(cls, join_file: Path) -> RankFiles:
        return cls(join_file.parent, join_file.name.removesuffix(".join.json"))

    @property
    def batches(self) -> Path:
        return self.folder / f"{self.stem}.jsonl"

    @property
    def aside(self) -> Path:
        return self.folder / f"{self.stem}.aside.jsonl"

    @property
    def join(self) -> Path:
        return self.folder / f"{self.stem}.join.json"

    @property
    def ended(self) -> Path:
        return self.folder / f"{self.stem}.ended.json"

    @property
    def synced(self) -> Path:
        return self.folder / f"{self.stem}.synced.json"

    def write_join(self, join: wire.Join) -> None:
        """Keep the join request; raises OSError when the folder cannot be written."""
        write_json(self.join, join.to_json())

    def write_ended(self, ended: wire.Ended) -> None:
        """Keep how this rank's process ended; a later process of the rank replaces it."""
        write_json(self.ended, dataclasses.asdict(ended))

    def read_join(self) -> wire.Join:
        """The join request kept; raises ValueError (or OSError) when it is not one."""
        body = json.loads(self.join.read_text())
        try:
            return wire.Join(**body)
        except TypeError as error:
            raise ValueError(f"{self.join} is not a join request: {error}") from None

    def read_ended(self) -> wire.Ended | None:
        """How the rank's last process ended; None when it left no word (killed, or still running)."""
        try:
            return wire.Ended(**json.loads(self.ended.read_text()))
        except FileNotFoundError:
            return None
        except (TypeError, ValueError) as error:
            raise ValueError(f"{self.ended} is not a rank's ending: {error}") from None

    def forget(self) -> None:
        """Remove what a sync would read besides the batches: this rank's process reached the server itself, and
        replays its spool on its own."""
        for path in (self.join, self.ended, self.synced):
            path.unlink(missing_ok=True)


def write_json(path: Path, body: Any) -> None:
    """Write a JSON file whole or not at all: a sync, or another rank, may read it at any moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile's: its files are the owner's alone, and whoever syncs may not be the job's user.
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(body, default=str))
    os.replace(partial, path)

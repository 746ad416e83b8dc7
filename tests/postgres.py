"""A throwaway PostgreSQL server for the tests: initdb in a temporary folder, listening on a Unix socket only."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg


def postgres_bin() -> Path | None:
    """The folder of Debian's PostgreSQL server binaries, newest version first; None when not installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), reverse=True)
    return Path(found[0]).parent if found else None


def _as_server_user(command: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; Debian's package makes the `postgres` user for it.
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextmanager
def postgres_server() -> Iterator[str]:
    """Starts a server in a temporary folder; yields the libpq connection string of its `postgres` database."""
    bindir = postgres_bin()
    assert bindir is not None, "PostgreSQL is not installed (scripts/test installs it)"
    # Not pytest's tmp_path: its folders are private to this user, and the server runs as `postgres`.
    root = Path(tempfile.mkdtemp(prefix="rankboard-pg-"))
    data, socket_dir = root / "pgdata", root / "pgsocket"
    socket_dir.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(socket_dir, "postgres")
    subprocess.run(_as_server_user([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
                   check=True, capture_output=True)  # fmt: skip
    options = f"-c listen_addresses='' -k {socket_dir} -c fsync=off"
    subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-w", "-l",
                                    str(root / "postgres.log"), "start"]), check=True, capture_output=True)  # fmt: skip
    try:
        yield f"host={socket_dir} user=postgres dbname=postgres"
    finally:
        subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def new_database(admin_dsn: str) -> str:
    """Creates an empty database; returns its SQLAlchemy URL."""
    name = f"rb_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    host = admin_dsn.split("host=")[1].split()[0]
    return f"postgresql+psycopg://postgres@/{name}?host={host}"

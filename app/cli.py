"""`rankboard serve [--host H] [--port P] [--workers N]`, `rankboard db upgrade`, `rankboard users ...`,
`rankboard tokens ...`, `rankboard --version`, and `rankboard runs ...` (a client of a server's API: rankboard.cli).

The server's packages (SQLAlchemy, pydantic, FastAPI) are imported only by the commands that need them, so that
`rankboard runs ...` starts as fast as the standard library does."""

from __future__ import annotations

import argparse
import getpass
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

from app import __version__
from app.core.errors import RankboardError, SchemaMismatch

if TYPE_CHECKING:
    from fastapi import FastAPI
    from sqlalchemy.orm import Session, sessionmaker

    from app.core.settings import Settings

NEW_PASSWORD_ENV = "RANKBOARD_NEW_PASSWORD"  # `users add` reads the password here when it is not asked for
SHUTDOWN_GRACE_S = 5  # what a stopping server waits for requests under way, streams included


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["runs"]:
        from rankboard import cli as runs_cli

        return runs_cli.main(argv[1:])
    if argv[:1] == ["import"]:
        from rankboard import cli as runs_cli

        return runs_cli.import_main(argv[1:])
    if argv[:1] == ["queue"]:
        from rankboard import cli as runs_cli

        return runs_cli.queue_main(argv[1:])
    if argv[:1] == ["usage"]:
        from rankboard import cli as runs_cli

        return runs_cli.usage_main(argv[1:])
    if argv[:1] == ["sync"]:
        from rankboard import cli as runs_cli

        return runs_cli.sync_main(argv[1:])
    args = parser().parse_args(argv)
    from pydantic import ValidationError

    from app.core.settings import Settings

    overrides = {
        k: v
        for k, v in {name: getattr(args, name, None) for name in ("host", "port", "workers")}.items()
        if v is not None
    }
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        for error in exc.errors():
            name = Settings.model_config["env_prefix"] + "_".join(map(str, error["loc"])).upper()
            print(f"rankboard: {name}: {error['msg'].removeprefix('Value error, ')}", file=sys.stderr)
        return 2
    if args.command == "db":
        from app.core.db import upgrade

        settings.data_dir.mkdir(parents=True, exist_ok=True)
        upgrade(settings.sqlalchemy_url)
        print(f"database at the newest schema: {settings.sqlalchemy_url}")
        return 0
    if args.command in ("users", "tokens"):
        return manage(settings, args)
    return serve_app(settings)


def parser() -> argparse.ArgumentParser:
    from app.core.models import Role

    roles = [role.value for role in Role]
    parser = argparse.ArgumentParser(prog="rankboard", description="Start, stop and watch PyTorch DDP runs.")
    parser.add_argument("--version", action="version", version=f"rankboard {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="start the dashboard")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1, or RANKBOARD_HOST)")
    serve.add_argument("--port", type=int, help="port (default 8000, or RANKBOARD_PORT)")
    serve.add_argument("--workers", type=int, help="server processes on the one port (default 1, or "
                       "RANKBOARD_WORKERS); more than one needs PostgreSQL (RANKBOARD_DATABASE_URL): SQLite takes one "
                       "writer at a time, so a server on it is one process")  # fmt: skip
    commands.add_parser("runs", help="runs on a server, over its API: list, start, get, stop, resume, logs, metrics, "
                        "checkpoints, download (`rankboard runs -h`)")  # fmt: skip
    commands.add_parser("import", help="runs from TensorBoard, MLflow or W&B into a server, over its API "
                        "(`rankboard import -h`)")  # fmt: skip
    commands.add_parser("sync", help="runs kept in folders (RANKBOARD_MODE=offline, or a server that was away) into "
                        "a server, over its API (`rankboard sync -h`)")  # fmt: skip
    commands.add_parser("usage", help="GPU-hours, energy, cost and goodput by user, tag or launcher, over a server's "
                        "API (`rankboard usage -h`)")  # fmt: skip
    commands.add_parser("queue", help="the queue over a server's API: its order, a run's priority, the limits of "
                        "users and groups (`rankboard queue -h`)")  # fmt: skip
    db = commands.add_parser("db", help="database schema")
    db.add_argument("action", choices=["upgrade"], help="upgrade: bring the schema to the newest version")
    users = commands.add_parser("users", help="who may log in (the first user turns authentication on)")
    user_actions = users.add_subparsers(dest="action", required=True)
    add = user_actions.add_parser("add", help=f"add a user; the password is asked for, read from {NEW_PASSWORD_ENV}, "
                                  "or made and printed once")  # fmt: skip
    add.add_argument("name")
    add.add_argument("--role", choices=roles, required=True)
    user_actions.add_parser("list", help="the users and their roles")
    remove = user_actions.add_parser("remove", help="remove a user, their logins and tokens")
    remove.add_argument("name")
    tokens = commands.add_parser("tokens", help="API tokens for scripts: Authorization: Bearer <token>")
    token_actions = tokens.add_subparsers(dest="action", required=True)
    create = token_actions.add_parser("create", help="make a token; it is printed once")
    create.add_argument("--name", required=True)
    create.add_argument("--role", choices=roles, required=True)
    create.add_argument("--expires", default="90d", help="hours, days or weeks: 12h, 90d, 2w (default 90d)")
    create.add_argument("--owner", help="the user it belongs to (default: none)")
    token_actions.add_parser("list", help="the tokens, with last use and expiry")
    revoke = token_actions.add_parser("revoke", help="revoke a token by its id")
    revoke.add_argument("id", type=int)
    return parser


def manage(settings: Settings, args: argparse.Namespace) -> int:
    """The users and tokens commands, on the server's database (made or upgraded as the server would)."""
    from app.core.db import make_engine, make_sessionmaker, prepare_schema

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.sqlalchemy_url)
    try:
        prepare_schema(engine, settings.sqlalchemy_url)
        run_command(make_sessionmaker(engine), args)
    except RankboardError as exc:
        print(f"rankboard: {exc.message}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    return 0


def run_command(sessions: sessionmaker[Session], args: argparse.Namespace) -> None:
    from app.core.models import Role
    from app.services import tokens, users

    actor = f"{getpass.getuser()} (command line)"
    with sessions() as db:
        if (args.command, args.action) == ("users", "add"):
            made = users.add_user(db, name=args.name, role=Role(args.role), password=new_password(), actor=actor)
            told = f"; password, shown only this once: {made.password}" if made.password else ""
            print(f"added {made.role.value} {made.name}{told}")
        elif (args.command, args.action) == ("users", "list"):
            table([(user.name, user.role.value, f"added {user.created_at:%Y-%m-%d %H:%M} UTC")
                   for user in users.list_users(db)])  # fmt: skip
        elif (args.command, args.action) == ("users", "remove"):
            users.remove_user(db, name=args.name, actor=actor)
            print(f"removed {args.name}")
        elif (args.command, args.action) == ("tokens", "create"):
            with sessions() as check:
                anyone = bool(users.list_users(check))
            if not anyone:
                raise RankboardError("add a user first (`rankboard users add NAME --role admin`): until one exists, "
                                     "authentication is off and a token would mean nothing")  # fmt: skip
            new = tokens.create_token(db, name=args.name, role=Role(args.role), expires=args.expires,
                                      owner=args.owner, actor=actor)  # fmt: skip
            print(f"token {new.token.id} {new.token.name} ({new.token.role.value}, expires "
                  f"{new.token.expires_at:%Y-%m-%d}); shown only this once:\n{new.secret}")  # fmt: skip
        elif (args.command, args.action) == ("tokens", "list"):
            table([(t.id, t.name, t.role.value, t.user.name if t.user else "-", f"expires {t.expires_at:%Y-%m-%d}",
                    f"last used {t.last_used_at:%Y-%m-%d %H:%M} UTC" if t.last_used_at else "never used",
                    "revoked" if t.revoked_at else "") for t in tokens.list_tokens(db)])  # fmt: skip
        else:
            token = tokens.revoke_token(db, token_id=args.id, actor=actor)
            print(f"revoked token {token.id} {token.name}")


def new_password() -> str | None:
    """The new user's password: from RANKBOARD_NEW_PASSWORD, else asked for at a terminal; None: make one."""
    if NEW_PASSWORD_ENV in os.environ:
        return os.environ[NEW_PASSWORD_ENV]
    if not sys.stdin.isatty():
        return None
    password = getpass.getpass("password (empty: make one): ")
    if password and getpass.getpass("again: ") != password:
        raise RankboardError("the two passwords differ")
    return password or None


def table(rows: list[tuple[Any, ...]]) -> None:
    for row in rows:
        print("  ".join(str(cell) for cell in row))


def serve_app(settings: Settings) -> int:
    import uvicorn

    from app.core import collector, cpus
    from app.main import create_app
    from app.web.guard import refuse_bind

    if settings.workers > 1 and settings.on_sqlite:
        print(f"rankboard: --workers {settings.workers} (RANKBOARD_WORKERS) needs PostgreSQL (RANKBOARD_DATABASE_URL): "
              "SQLite takes one writer at a time, so a server on it runs as one process", file=sys.stderr)  # fmt: skip
        return 2
    try:
        app = create_app(settings)  # its launcher notes every CPU for the runs, before keep_to below
    except SchemaMismatch as exc:  # made or refused here once, before any worker starts
        print(f"rankboard: {exc.message}", file=sys.stderr)
        return 1
    refusal = refuse_bind(settings, auth_on=app.state.auth.on)
    if refusal is not None:
        print(f"rankboard: {refusal}", file=sys.stderr)
        return 2
    print(
        f"Rankboard on http://{settings.host}:{settings.port}  (data: {settings.data_dir}, "
        f"shared: {settings.shared}{' [fallback]' if settings.shared_dir_is_fallback else ''}"
        f"{f'; {settings.workers} workers' if settings.workers > 1 else ''})",
        flush=True,
    )
    if settings.workers > 1:
        app.state.sessions.kw["bind"].dispose()  # each worker builds its own app; this one only checked the database
        return serve_workers(settings)
    if settings.server_cpus:  # before uvicorn starts its threads, which then keep to them too
        print(f"its threads on CPUs {cpus.describe(settings.server_cpus)}; the runs it starts on "
              f"{cpus.describe(cpus.available())}", flush=True)  # fmt: skip
        cpus.keep_to(settings.server_cpus)
    collector.settle()
    uvicorn.run(app, host=settings.host, port=settings.port, workers=1, **uvicorn_options())
    return 0


def uvicorn_options() -> dict[str, Any]:
    """How uvicorn serves, with one worker or several."""
    from app.web import access_log

    # No proxy headers: uvicorn would take the client's address from X-Forwarded-For of anyone on 127.0.0.1, and
    # the guard believes X-Forwarded-User only from the proxy's own address (RANKBOARD_TRUSTED_PROXY).
    # A stopping server gives requests under way SHUTDOWN_GRACE_S, then cuts what is left: a page's stream lasts as
    # long as the page is open, and uvicorn would otherwise wait for it, not stopping at all. The pages reconnect.
    # No websocket route (the pages stream by server-sent events): ws="none" keeps its library out of an idle server.
    return {"log_level": "info", "proxy_headers": False, "timeout_graceful_shutdown": SHUTDOWN_GRACE_S,
            "log_config": access_log.log_config(), "ws": "none"}  # fmt: skip


def serve_workers(settings: Settings) -> int:
    """`settings.workers` uvicorn processes accepting on one socket; uvicorn's manager restarts one that dies. Each
    builds its app (worker_app) from the environment, which carries what the command line said."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    os.environ.update(RANKBOARD_HOST=settings.host, RANKBOARD_PORT=str(settings.port),
                      RANKBOARD_WORKERS=str(settings.workers))  # fmt: skip
    try:
        listening = listening_socket(settings.host, settings.port)
    except OSError as exc:
        print(f"rankboard: cannot listen on {settings.host}:{settings.port}: {exc.strerror}", file=sys.stderr)
        return 1
    config = uvicorn.Config("app.cli:worker_app", factory=True, host=settings.host, port=settings.port,
                            workers=settings.workers, **uvicorn_options())  # fmt: skip
    Multiprocess(config, sockets=[listening]).run()
    return 0


def listening_socket(host: str, port: int) -> socket.socket:
    """The workers' one socket, made a TCP socket by name (IPPROTO_TCP). uvicorn makes it with protocol 0, and its
    connections then keep that 0: asyncio sets TCP_NODELAY only on those that say IPPROTO_TCP, so with Nagle on,
    each request after the first on a kept-alive connection waited ~44 ms for a delayed ACK (Kludex/uvicorn#3149;
    uvloop sets it on every connection, but a server without uvloop runs on asyncio)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.bind((host, port))
    listening.set_inheritable(True)
    return listening


def worker_app() -> FastAPI:
    """One worker's app, for `serve --workers N`: built from the environment, its threads kept to
    RANKBOARD_SERVER_CPUS once its launcher has noted every CPU for the runs."""
    from app.core import collector, cpus
    from app.core.settings import Settings
    from app.main import create_app

    settings = Settings()
    app = create_app(settings)
    if settings.server_cpus:
        cpus.keep_to(settings.server_cpus)
    collector.settle()
    return app


if __name__ == "__main__":
    sys.exit(main())

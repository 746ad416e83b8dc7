"""`rankboard serve [--host H] [--port P]`, `rankboard db upgrade` and `rankboard --version`."""

from __future__ import annotations

import argparse
import sys

from app import __version__
from app.errors import SchemaMismatch
from app.settings import Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rankboard", description="Start, stop and watch PyTorch DDP runs.")
    parser.add_argument("--version", action="version", version=f"rankboard {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="start the dashboard (one worker: the server is single-writer)")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1, or RANKBOARD_HOST)")
    serve.add_argument("--port", type=int, help="port (default 8000, or RANKBOARD_PORT)")
    db = commands.add_parser("db", help="database schema")
    db.add_argument("action", choices=["upgrade"], help="upgrade: bring the schema to the newest version")
    args = parser.parse_args(argv)

    overrides = {
        k: v
        for k, v in {"host": getattr(args, "host", None), "port": getattr(args, "port", None)}.items()
        if v is not None
    }
    settings = Settings(**overrides)
    if args.command == "db":
        from app.db import upgrade

        settings.data_dir.mkdir(parents=True, exist_ok=True)
        upgrade(settings.sqlalchemy_url)
        print(f"database at the newest schema: {settings.sqlalchemy_url}")
        return 0
    return serve_app(settings)


def serve_app(settings: Settings) -> int:
    import uvicorn

    from app.main import create_app

    try:
        app = create_app(settings)
    except SchemaMismatch as exc:
        print(f"rankboard: {exc.message}", file=sys.stderr)
        return 1
    print(
        f"Rankboard on http://{settings.host}:{settings.port}  (data: {settings.data_dir}, "
        f"shared: {settings.shared}{' [fallback]' if settings.shared_dir_is_fallback else ''})",
        flush=True,
    )
    # One worker: uvicorn with several leaves Nagle on and stalls kept-alive requests ~44 ms (Kludex/uvicorn#3149).
    uvicorn.run(app, host=settings.host, port=settings.port, workers=1, log_level="info")
    return 0


if __name__ == "__main__":
    sys.exit(main())

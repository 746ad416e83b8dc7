"""`rankboard runs ...`: runs on a Rankboard server, driven over its REST API only (never its database).

The server and token come from --url/--token, else RANKBOARD_URL/RANKBOARD_TOKEN, else the `url` and `token` keys of
~/.config/rankboard/client.toml. `runs start` takes every option of the New-run form as a flag, made from the server's
own schema of a new run (so a newer server's options appear without a newer client), or from --config FILE.
Everything here imports only the standard library and rankboard.client, so that a command starts in a few milliseconds.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from .client import DEFAULT_URL, UNANSWERED, Client, ClientError, WaitTimedOut

# `runs start --wait` exits with the run's end: 0 only when it succeeded.
EXIT_CODES = {"succeeded": 0, "failed": 3, "stopped": 4, "lost": 5}
EXIT_ERROR = 1  # the request failed: server unreachable, bad token, unknown run, an option refused
EXIT_TIMEOUT = 6  # --wait --timeout ran out before the run ended
EXIT_HELP = """exit codes: 0 done (with --wait: the run succeeded); 1 a request failed (server unreachable, 401/403,
unknown run, an option refused); 2 bad command line; with --wait: 3 the run failed, 4 it was stopped, 5 it was lost,
6 --timeout ran out."""
CONFIG_KEYS = ("url", "token")
OWN_FLAGS = {"url", "token", "json", "config", "wait", "timeout", "help"}  # flags of `start` that are not run options


class Parser(argparse.ArgumentParser):
    """argparse, with a mistake on the command line said in one line rather than under the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} -h)\n")


def main(argv: list[str]) -> int:
    """Runs one `rankboard runs` command; errors are one line on stderr and a non-zero exit."""

    def run() -> int:
        args = parse(argv)
        return int(args.handler(client_for(args), args))

    return handled(run)


def import_main(argv: list[str]) -> int:
    """`rankboard import tensorboard|mlflow|wandb WHERE`: another tracker's runs into the server (rankboard.importers;
    its readers need `pip install rankboard[import]`)."""
    from .importers import command  # here: `rankboard runs` never loads it
    from .importers.upload import Uploader

    top = Parser(prog="rankboard import", description=command.__doc__, parents=[common_flags()])
    command.add_arguments(top)

    def run() -> int:
        args = top.parse_args(argv)
        return command.import_runs(Uploader(client_for(args)), args)

    return handled(run)


def queue_main(argv: list[str]) -> int:
    """`rankboard queue`: the server's queue, a waiting run's priority, the limits of users and groups (admins)."""
    from . import queue_command

    top = Parser(prog="rankboard queue", description=queue_command.__doc__, parents=[common_flags()])
    queue_command.add_arguments(top, common_flags())

    def run() -> int:
        args = top.parse_args(argv)
        return queue_command.run(client_for(args), args)

    return handled(run)


def sync_main(argv: list[str]) -> int:
    """`rankboard sync DIR...`: runs kept in folders (RANKBOARD_MODE=offline, or a server that was away) uploaded into
    the server, each as one run; again, it stores nothing twice, and finishes a sync cut short (rankboard.sync)."""
    from . import sync  # here: `rankboard runs` never loads it

    top = Parser(prog="rankboard sync", description=sync.__doc__, parents=[common_flags()])
    top.add_argument("folders", type=Path, nargs="+", metavar="DIR",
                     help="a run's folder, or one holding runs' folders (./rankboard-offline)")  # fmt: skip

    def run() -> int:
        args = top.parse_args(argv)
        syncer, failed, done = sync.Syncer(client_for(args)), 0, []
        for key, kept in sync.kept_runs(args.folders).items():
            try:
                done.append(syncer.sync(key, kept))
            except ClientError as error:  # the others may still go: a run that ended meanwhile stops only itself
                print(f"rankboard: {key}: {error.message}", file=sys.stderr)
                failed += 1
            else:
                print(json.dumps(vars(done[-1])) if args.json else done[-1].sentence(), flush=True)
        return EXIT_ERROR if failed else 0

    return handled(run)


USAGE_COLUMNS = ("runs", "gpu_hours", "cpu_hours", "kwh", "cost", "unpriced_gpu_hours", "goodput")
SPANS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}  # --since 30d: minutes, hours, days, weeks


def usage_main(argv: list[str]) -> int:
    """`rankboard usage`: GPU-hours (or CPU-hours), kWh, cost, goodput and runs by user, tag or launcher over a period,
    as the server's Usage page shows them (GET /api/usage)."""
    top = Parser(prog="rankboard usage", description=usage_main.__doc__, parents=[common_flags()], epilog=EXIT_HELP)
    top.add_argument("--by", choices=["user", "tag", "launcher"], default="user", help="rows by (default user)")
    top.add_argument("--since", type=since, help="the period's start: 30d, 12h, 2w, 90m ago, or a date or time in ISO "
                     "8601 (2026-11-01); default: since the first run")  # fmt: skip
    top.add_argument("--until", help="its end, a date or time (exclusive); default: now")
    top.add_argument("--csv", action="store_true", help="the table as CSV with a header")

    def run() -> int:
        args = top.parse_args(argv)
        report = client_for(args).usage(by=args.by, start=args.since, end=args.until)
        if args.json:
            print(json.dumps(report))
        elif args.csv:
            writer = csv.writer(sys.stdout, lineterminator="\n")
            writer.writerow(("group", *USAGE_COLUMNS))
            writer.writerows([row["group"], *("" if row[c] is None else row[c] for c in USAGE_COLUMNS)]
                             for row in [*report["rows"], report["total"]])  # fmt: skip
        else:
            print_usage(report)
        return 0

    return handled(run)


def since(text: str) -> str:
    """--since as the API takes it: `30d` as the moment 30 days ago (UTC), a date or time as it is."""
    import datetime

    if text[:-1].isdigit() and text[-1:] in SPANS:
        ago = datetime.timedelta(seconds=int(text[:-1]) * SPANS[text[-1]])
        return (datetime.datetime.now(datetime.timezone.utc) - ago).isoformat(timespec="seconds")
    try:
        datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not 30d, 12h, 2w, 90m nor a date (2026-11-01)") from None
    return text


def print_usage(report: dict[str, Any]) -> None:
    """The usage table: a row a group, the total last; a dash where a figure is unknown."""
    rows = [*report["rows"], report["total"]]
    if not report["rows"]:
        print("no run held a GPU or a CPU process in this period")
        return
    width = max(len(str(row["group"])) for row in rows)
    print(f"{report['by']:<{width}}  {'runs':>5}  {'GPU-hours':>10}  {'CPU-hours':>10}  {'kWh':>9}  {'cost':>11}  "
          "goodput")  # fmt: skip
    for row in rows:
        kwh = "-" if row["kwh"] is None else f"{row['kwh']:,.2f}"
        cost = "-" if row["cost"] is None else f"${row['cost']:,.2f}"
        goodput = "-" if row["goodput"] is None else f"{100 * row['goodput']:.1f}%"
        print(f"{row['group']:<{width}}  {row['runs']:>5}  {row['gpu_hours']:>10,.2f}  {row['cpu_hours']:>10,.2f}  "
              f"{kwh:>9}  {cost:>11}  {goodput}")  # fmt: skip


def handled(work: Callable[[], int]) -> int:
    """Runs a command; errors are one line on stderr and a non-zero exit."""
    try:
        return work()
    except ClientError as error:
        print(f"rankboard: {error.message}", file=sys.stderr)
        return EXIT_TIMEOUT if isinstance(error, WaitTimedOut) else EXIT_ERROR
    except BrokenPipeError:  # `rankboard runs list | head`
        sys.stderr.close()
        return 0
    except OSError as error:  # a file it was told to read or write: --config, download -o
        print(f"rankboard: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line; `runs start` learns its option flags from the server's schema first."""
    if argv[:1] != ["start"]:
        return parser(None).parse_args(argv)
    where = Parser(add_help=False)
    where.add_argument("--url")
    where.add_argument("--token")
    known, _ = where.parse_known_args(argv)
    try:
        schema = client_for(known).run_options()
    except ClientError as error:
        if "-h" not in argv and "--help" not in argv:
            raise ClientError(f"{error.message} (runs start reads the run options from the server)") from None
        schema = {"unreachable": error.message}
    return parser(schema).parse_args(argv)


def client_for(args: argparse.Namespace) -> Client:
    """A client of the server the flags, environment or config file name, in that order."""
    saved = client_config()
    url = getattr(args, "url", None) or os.environ.get("RANKBOARD_URL") or saved.get("url") or DEFAULT_URL
    token = getattr(args, "token", None) or os.environ.get("RANKBOARD_TOKEN") or saved.get("token")
    return Client(url, token)


def config_path() -> Path:
    """~/.config/rankboard/client.toml, or under $XDG_CONFIG_HOME."""
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "rankboard" / "client.toml"


def client_config() -> dict[str, str]:
    """`url` and `token` from ~/.config/rankboard/client.toml, when it exists."""
    path = config_path()
    if not path.is_file():
        return {}
    return {k: str(v) for k, v in read_config(path).items() if k in CONFIG_KEYS}


def read_config(path: Path) -> dict[str, Any]:
    """A JSON or TOML file (by its suffix; TOML unless it ends .json) as a dict."""
    try:
        text = path.read_text()
        if path.suffix == ".json":
            found = json.loads(text)
        else:
            import tomllib

            found = tomllib.loads(text)
    except (OSError, ValueError) as error:  # tomllib's and json's errors are ValueErrors
        raise ClientError(f"cannot read {path}: {error}") from None
    if not isinstance(found, dict):
        raise ClientError(f"{path}: expected a table of options, got {type(found).__name__}")
    return found


def common_flags() -> Parser:
    """--url, --token and --json, which every command takes."""
    common = Parser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS, help=f"the server (RANKBOARD_URL; default {DEFAULT_URL})")
    common.add_argument("--token", default=argparse.SUPPRESS, help="an API token (RANKBOARD_TOKEN)")
    common.add_argument("--json", action="store_true", help="print the API's JSON")
    return common


def parser(schema: dict[str, Any] | None) -> argparse.ArgumentParser:
    """`rankboard runs` and its commands; `schema`: the server's RunCreate, for the flags of `start`."""
    common = common_flags()
    top = Parser(prog="rankboard runs", description=__doc__, epilog=EXIT_HELP,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = top.add_subparsers(dest="action", required=True)

    def command(name: str, handler: Any, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=help, description=help, epilog=EXIT_HELP)
        sub.set_defaults(handler=handler)
        return sub

    listing = command("list", list_runs, "runs, newest first")
    listing.add_argument("--status", choices=["queued", "starting", "running", "stopping", *EXIT_CODES])
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    listing.add_argument("--search", "-q", help="words each found in a run's name, tags, status, workload, launcher...")
    listing.add_argument("--filter", help="conditions on options and metrics: 'lr < 1e-3; val_loss.min < 0.5'")
    listing.add_argument("--sort", help="a field or metric.last|min|max; '-' first: descending (default -id)")
    listing.add_argument("--columns", help="extra columns, comma-separated: 'lr,val_loss.min'")
    listing.add_argument("--archived", choices=["hide", "only", "all"], help="archived runs (default: hidden)")
    tag = command("tag", tag_runs, "add a tag to runs (--remove: take it off)")
    tag.add_argument("tag")
    tag.add_argument("runs", type=int, nargs="+", metavar="run")
    tag.add_argument("--remove", action="store_true", help="take the tag off instead")
    note = command("note", note_run, "set a run's notes (replacing them)")
    note.add_argument("run", type=int)
    note.add_argument("notes")
    archive = command("archive", archive_runs, "archive runs: hidden from the default list (--undo: show them again)")
    archive.add_argument("runs", type=int, nargs="+", metavar="run")
    archive.add_argument("--undo", action="store_true", help="unarchive")
    delete = command("delete", delete_run, "delete a finished run and its metrics; asks first unless --yes")
    delete.add_argument("run", type=int)
    delete.add_argument("--files", action="store_true", help="its own log and checkpoint folders too")
    delete.add_argument("--yes", action="store_true", help="do not ask")
    start = command("start", start_run, "create a run (every option of the New-run form is a flag)")
    start_options(start, schema)
    command("get", get_run, "one run").add_argument("run", type=int)
    command("stop", stop_run, "stop a run gracefully").add_argument("run", type=int)
    command("resume", resume_run, "resume a stopped, failed or lost run from its newest snapshot").add_argument(
        "run", type=int
    )
    logs = command("logs", show_logs, "a rank's output: its last lines, or -f to follow until the run ends")
    logs.add_argument("run", type=int)
    logs.add_argument("--rank", default="0", help="a rank number, or `launcher` for torchrun's own (default 0)")
    logs.add_argument("--stream", choices=["stdout", "stderr"], default="stdout")
    logs.add_argument("--lines", type=int, default=200, help="how many of the last lines (default 200)")
    logs.add_argument("-f", "--follow", action="store_true", help="print new lines until the run has ended")
    metrics = command("metrics", show_metrics, "every point of one metric series")
    metrics.add_argument("run", type=int)
    metrics.add_argument("key", help="e.g. loss, lr, val_loss")
    metrics.add_argument("--csv", action="store_true", help="CSV with a header: step,rank,value,time")
    command("checkpoints", list_checkpoints, "a run's checkpoints").add_argument("run", type=int)
    download = command("download", download_checkpoint, "download a checkpoint, streamed to disk")
    download.add_argument("run", type=int)
    download.add_argument("checkpoint", help="its name, as `runs checkpoints` lists it")
    download.add_argument("-o", "--output", help="the file to write (default: the checkpoint's name, here)")
    export = command("export", export_runs, "runs' points and the runs with their config: a zip of two Parquet or "
                     "CSV files (points.*, runs.*), or one of them alone with --table; streamed to disk")  # fmt: skip
    export.add_argument("runs", type=int, nargs="+", metavar="run")
    export.add_argument("--format", choices=["parquet", "csv"], default="parquet", help="default parquet")
    export.add_argument("--table", choices=["points", "runs"], help="one table alone, not the zip of both")
    export.add_argument("-o", "--output", type=Path, help="the file to write (default: named by the runs, here)")
    return top


def start_options(start: argparse.ArgumentParser, schema: dict[str, Any] | None) -> None:
    """--config, --wait, and one flag per option of the server's schema."""
    start.add_argument("--config", type=Path, help="options from a JSON or TOML file; flags override it")
    start.add_argument("--wait", action="store_true", help="print progress until the run ends; exit by its end")
    start.add_argument("--timeout", type=float, help="with --wait: give up after this many seconds")
    start.add_argument("extra_args", nargs="*", metavar="-- SCRIPT_ARG", help="after `--`: the script's arguments")
    if schema is None:
        return
    if "unreachable" in schema:
        start.description = f"The run options come from the server's schema, so are not listed: {schema['unreachable']}"
        return
    options = start.add_argument_group("run options (from the server's schema; unset: the server's default)")
    for name, field in schema["properties"].items():
        flag = flag_for(field)
        if flag.get("type") in (int, float, str) and not flag["choices"]:
            flag["metavar"] = name.upper()
        spelled = name.replace("_", "-")
        spelled = f"run-{spelled}" if spelled in OWN_FLAGS else spelled  # a newer server's `timeout`: --run-timeout
        options.add_argument(f"--{spelled}", dest=f"option_{name}", default=argparse.SUPPRESS, **flag)


BOUNDS = (("exclusiveMinimum", ">"), ("minimum", ">="), ("exclusiveMaximum", "<"), ("maximum", "<="))


def flag_for(field: dict[str, Any]) -> dict[str, Any]:
    """argparse keywords for one JSON-schema property: its type, choices, and help with default and bounds."""
    kinds = [field, *field.get("anyOf", [])]
    types = {kind.get("type") for kind in kinds} - {None, "null"}
    enum = next((kind["enum"] for kind in kinds if "enum" in kind), None)
    bounds = [f"{word} {number(field[key])}" for key, word in BOUNDS if key in field]
    said = " ".join(field.get("description", "").split())
    help = f"{said} (default {json.dumps(field.get('default'))}{'; ' if bounds else ''}{', '.join(bounds)})"
    help = help.replace("%", "%%")
    if "boolean" in types:
        return {"action": argparse.BooleanOptionalAction, "help": help}
    if "array" in types:
        return {"action": "append", "metavar": "ARG", "help": f"{help}; repeat it, or give them after `--`"}
    if "object" in types:
        return {"action": "append", "metavar": "NAME=VALUE", "type": pair, "help": f"{help}; repeat it"}
    kind = int if "integer" in types else float if "number" in types else str
    return {"type": kind, "choices": enum, "help": help}


def number(value: float) -> str:
    """1, not the 1.0 a JSON schema may say of an integer's bound."""
    return str(int(value)) if float(value).is_integer() else str(value)


def pair(text: str) -> tuple[str, str]:
    """NAME=VALUE, as --nccl-env takes it."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def run_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The new run's options: the config file's, then the flags over them."""
    spec = read_config(args.config) if args.config else {}
    for key, value in vars(args).items():
        if key.startswith("option_"):
            spec[key.removeprefix("option_")] = dict(value) if is_pairs(value) else value
    if args.extra_args:
        spec["script_args"] = [*spec.get("script_args", []), *args.extra_args]
    return spec


def is_pairs(value: Any) -> bool:
    """True for what a NAME=VALUE flag collected (it becomes a JSON object)."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, tuple) for v in value)


def start_run(client: Client, args: argparse.Namespace) -> int:
    """`runs start`: the new run; with --wait, its progress until it ends, and its end as the exit code."""
    run = client.create(**run_spec(args))
    if not args.wait:
        print(json.dumps(run) if args.json else f"run {run['id']} {run['status']}: {run['name']}")
        return 0
    print(f"run {run['id']} {run['status']}: {run['name']}", file=sys.stderr, flush=True)
    final = client.wait(run["id"], args.timeout, on_poll=Progress(client).show)
    print(json.dumps(final) if args.json else f"run {final['id']} {final['status']}: {final['status_reason']}")
    return EXIT_CODES[final["status"]]


class Progress:
    """Prints a line on stderr each time the run's state or step changes: step/total and the newest loss."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.shown: tuple[str, int] | None = None
        self.loss_from = 0  # the step after the newest loss point read
        self.loss: float | None = None

    def show(self, run: dict[str, Any]) -> None:
        if (run["status"], run["step"]) == self.shown:
            return
        self.shown = (run["status"], run["step"])
        if run["step"] > 0:
            self.read_loss(run["id"])
        total = f"/{run['total_steps']}" if run["total_steps"] else ""
        loss = f"  loss {self.loss:.4g}" if self.loss is not None else ""
        print(f"run {run['id']} {run['status']}: step {run['step']}{total}{loss}", file=sys.stderr, flush=True)

    def read_loss(self, run_id: int) -> None:
        """Only the points since the last look, so that a long run costs no more per poll than a short one."""
        try:
            points = self.client.series(run_id, "loss", start_step=self.loss_from)
        except ClientError as error:
            if error.status == 404:
                return  # no loss yet, or a script that logs none: its steps alone show
            if error.status not in UNANSWERED:
                raise
            return  # the server went away between two requests: wait() waits for it, the loss shows next time
        if points:
            self.loss, self.loss_from = points[-1]["value"], points[-1]["step"] + 1


def list_runs(client: Client, args: argparse.Namespace) -> int:
    """`runs list`: one line a run (with its --columns' values and tags), or the JSON list."""
    view = {"q": args.search, "filter": args.filter, "sort": args.sort, "columns": args.columns,
            "archived": args.archived}  # fmt: skip
    table = client.table(status=args.status, limit=args.limit, **view)
    if args.json:
        print(json.dumps(table["items"] if not args.columns else table))
        return 0
    for run in table["items"]:
        total = f"/{run['total_steps']}" if run["total_steps"] else ""
        values = table.get("values", {}).get(str(run["id"]), {})
        shown = "".join(f"  {name}={cell(value)}" for name, value in values.items())
        tags = f"  [{', '.join(run['tags'])}]" if run.get("tags") else ""
        when = run["created_at"][:19]
        print(f"{run['id']:>6}  {run['status']:<9} step {run['step']}{total:<8} {when}  {run['name']}{shown}{tags}")
    return 0


def answer(question: str) -> str:
    """What the user typed, lowercased; nothing when there is no one to ask (stdin closed)."""
    try:
        return input(question).strip().lower()
    except EOFError:
        print(file=sys.stderr)
        return ""


def cell(value: Any) -> str:
    """A column's value: a metric to 6 significant digits; a dash for none."""
    if value is None:
        return "-"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def tag_runs(client: Client, args: argparse.Namespace) -> int:
    """`runs tag TAG RUN...`."""
    done = client.bulk(args.runs, "untag" if args.remove else "tag", args.tag)
    print(json.dumps(done) if args.json else f"{'untagged' if args.remove else 'tagged'} {len(done['done'])} runs")
    return 0


def note_run(client: Client, args: argparse.Namespace) -> int:
    """`runs note RUN TEXT`."""
    return show_run(client.label(args.run, notes=args.notes), args)


def archive_runs(client: Client, args: argparse.Namespace) -> int:
    """`runs archive RUN...`."""
    done = client.bulk(args.runs, "unarchive" if args.undo else "archive")
    print(json.dumps(done) if args.json else f"{'unarchived' if args.undo else 'archived'} {len(done['done'])} runs")
    return 0


def delete_run(client: Client, args: argparse.Namespace) -> int:
    """`runs delete RUN`: says what goes (points, folders and their size) and asks, unless --yes."""
    plan = client.delete(args.run, files=args.files, dry_run=True)
    folders = "".join(f"\n  {f['path']} ({f['bytes']} bytes)" for f in plan["folders"])
    if not args.yes:
        print(f"run {plan['run_id']} {plan['name']}: {plan['points']} metric points{folders}", file=sys.stderr)
        if answer("delete it? [y/N] ") not in ("y", "yes"):
            print("not deleted", file=sys.stderr)
            return EXIT_ERROR
    done = client.delete(args.run, files=args.files)
    print(
        json.dumps(done)
        if args.json
        else f"deleted run {done['run_id']}: {done['points']} points, {done['bytes']} bytes"
    )
    return 0


def get_run(client: Client, args: argparse.Namespace) -> int:
    """`runs get RUN`."""
    return show_run(client.get(args.run), args)


def stop_run(client: Client, args: argparse.Namespace) -> int:
    """`runs stop RUN`: asks it to stop; it ends `stopped` once its step is done and its checkpoint written."""
    return show_run(client.stop(args.run), args)


def resume_run(client: Client, args: argparse.Namespace) -> int:
    """`runs resume RUN`."""
    return show_run(client.resume(args.run), args)


def show_run(run: dict[str, Any], args: argparse.Namespace) -> int:
    """A run in two lines: name, state and why; step, epoch and loss."""
    if args.json:
        print(json.dumps(run))
        return 0
    total = f" of {run['total_steps']}" if run["total_steps"] else ""
    loss = f", final loss {run['final_loss']:.4g}" if isinstance(run.get("final_loss"), float) else ""
    print(f"run {run['id']} {run['name']}: {run['status']} ({run['status_reason'] or 'no reason given'})")
    created = run["created_at"][:16].replace("T", " ")  # the API's UTC time, to the minute
    epochs = run.get("epochs") or "?"  # none for a script's run, or one launched elsewhere
    print(f"  step {run['step']}{total}, epoch {run['epoch']}/{epochs}{loss}; created {created} UTC")
    return 0


def show_logs(client: Client, args: argparse.Namespace) -> int:
    """`runs logs RUN`: the last lines, or with -f each new one until the run has ended."""
    if args.follow:
        for line in client.follow_logs(args.run, rank=args.rank, stream=args.stream):
            print(line, flush=True)
        return 0
    for line in client.logs(args.run, rank=args.rank, stream=args.stream, lines=args.lines):
        print(line)
    return 0


def show_metrics(client: Client, args: argparse.Namespace) -> int:
    """`runs metrics RUN KEY`: every point, as lines, CSV or JSON."""
    points = client.series(args.run, args.key)
    if args.json:
        print(json.dumps(points))
    elif args.csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=["step", "rank", "value", "time"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(points)
    else:
        for point in points:
            print(f"{point['step']:>8}  rank {point['rank']}  {point['value']}")
    return 0


def list_checkpoints(client: Client, args: argparse.Namespace) -> int:
    """`runs checkpoints RUN`: one line a checkpoint, marked latest and best."""
    checkpoints = client.checkpoints(args.run)
    if args.json:
        print(json.dumps(checkpoints))
        return 0
    for c in checkpoints:
        marks = " ".join(mark for mark in ("latest", "best") if c.get(mark))
        loss = c["metrics"].get("loss")
        print(f"{c['name']}  step {c['step']}  {c['size']} bytes  loss {loss if loss is not None else '-'}  {marks}")
    return 0


def export_runs(client: Client, args: argparse.Namespace) -> int:
    """`runs export RUN...`: streamed from GET /api/export to a file, which appears only once whole."""
    query = urllib.parse.urlencode([*(("run", run) for run in args.runs), ("format", args.format)])
    named = f"rankboard-runs-{'-'.join(map(str, args.runs[:5]))}" + (f"-{args.table}.{args.format}" if args.table
                                                                      else ".zip")  # fmt: skip
    target: Path = args.output or Path(named)
    partial = target.with_name(f".{target.name}.part")
    path = f"/api/export{'/' + args.table if args.table else ''}?{query}"
    try:
        with client._open("GET", path, timeout=None) as answer, partial.open("wb") as file:
            shutil.copyfileobj(answer, file, 1 << 20)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, target)
    size = target.stat().st_size
    print(json.dumps({"path": str(target), "size": size}) if args.json else f"wrote {target} ({size:,} bytes)")
    return 0


def download_checkpoint(client: Client, args: argparse.Namespace) -> int:
    """`runs download RUN CHECKPOINT`: streamed to a file, which appears only once whole."""
    written = client.download(args.run, args.checkpoint, args.output)
    size = written.stat().st_size
    print(json.dumps({"path": str(written), "size": size}) if args.json else f"wrote {written} ({size} bytes)")
    return 0

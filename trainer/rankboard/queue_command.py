"""`rankboard queue`: the server's queue in order, with what each run waits for and when it may start; a waiting
run's priority (`queue priority RUN high`); and, for admins, the limits of users and groups (`queue limits`,
`queue limit USER --slots N --runs M`, `queue group NAME --members a,b --slots N`). Over the REST API only."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from .client import Client


def add_arguments(top: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """The subcommands, each with the `common` flags (--url, --token, --json); none: show the queue."""
    actions = top.add_subparsers(dest="action")

    def action(name: str, help: str) -> argparse.ArgumentParser:
        return actions.add_parser(name, parents=[common], help=help, description=help)

    priority = action("priority", "change a queued run's priority")
    priority.add_argument("run", type=int)
    priority.add_argument("priority", help="low, normal, high, or a number from -1000 to 1000")
    action("limits", "the limits of users and groups (admins)")
    limit = action("limit", "set (or --remove) a user's limit; USER * is every user's default")
    limit.add_argument("user")
    group = action("group", "make a group of users, or replace its members and limit (or --remove)")
    group.add_argument("name")
    group.add_argument("--members", default="", help="its users, comma-separated (replacing the members)")
    for each in (limit, group):
        each.add_argument("--slots", type=int, help="GPUs (or CPU slots) at once; left out: no limit")
        each.add_argument("--runs", type=int, help="runs at once; left out: no limit")
        each.add_argument("--remove", action="store_true", help="remove it instead")


def run(client: Client, args: argparse.Namespace) -> int:
    """Does what the command line asks and prints it, or its JSON with --json."""
    answer: dict[str, Any]
    if args.action == "priority":
        answer = client.set_priority(args.run, args.priority)
    elif args.action == "limit":
        answer = (client.remove_limit(args.user) if args.remove
                  else client.set_limit(args.user, max_slots=args.slots, max_runs=args.runs))  # fmt: skip
    elif args.action == "group":
        members = [name.strip() for name in args.members.split(",") if name.strip()]
        limits = {"max_slots": args.slots, "max_runs": args.runs}
        answer = client.remove_group(args.name) if args.remove else client.save_group(args.name, members=members,
                                                                                        **limits)  # fmt: skip
    else:
        answer = client.limits() if args.action == "limits" else client.queue()
    if args.json:
        print(json.dumps(answer))
    elif args.action in (None, "limits"):
        print("\n".join(show_queue(answer) if args.action is None else show_limits(answer)))
    elif args.action == "priority":
        print(f"run {answer['id']} {answer['name']}: priority {answer['priority']}")
    else:
        print("done")
    return 0


def show_queue(queue: dict[str, Any]) -> list[str]:
    """The queue as lines: this host's, in order; then Slurm's; then the runs holding slots."""
    unit = queue["unit"]
    lines = [f"{queue['free']} of {queue['capacity']} {unit} free"]
    rows: list[tuple[Any, ...]] = [(str(q["position"]), str(q["id"]), q["owner"], q["priority_name"], str(q["slots"]),
             duration(q["starts_in_s"]), q["waits_for"]) for q in queue["queued"]]  # fmt: skip
    lines += (
        table(("#", "run", "owner", "priority", unit, "starts in", "waits for"), rows) if rows else ["no run waits"]
    )
    if queue["elsewhere"]:
        lines += ["", "in Slurm's queue:"]
        rows = [(str(q["id"]), q["owner"], q["priority_name"], q["waits_for"]) for q in queue["elsewhere"]]
        lines += table(("run", "owner", "priority", "waits for"), rows)
    if queue["holding"]:
        lines += ["", f"holding {unit}:"]
        rows = [(str(h["id"]), h["owner"], h["priority_name"], str(h["slots"]), h["status"], duration(h["ends_in_s"]),
                 "yes" if h["preemptible"] else "no") for h in queue["holding"]]  # fmt: skip
        lines += table(("run", "owner", "priority", unit, "status", "ends in", "preemptible"), rows)
    return lines


def show_limits(limits: dict[str, Any]) -> list[str]:
    unit = limits["unit"]
    lines = table(("user", unit, "runs"), [(u["user"], count(u["max_slots"]), count(u["max_runs"]))
                                         for u in limits["users"]])  # fmt: skip
    groups = [(g["name"], ", ".join(g["members"]) or "-", count(g["max_slots"]), count(g["max_runs"]))
              for g in limits["groups"]]  # fmt: skip
    lines += ["", *table(("group", "members", unit, "runs"), groups)]
    return [*lines, "", f"operators may give a priority up to {limits['operator_priority_max']}"]


def table(header: tuple[str, ...], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Columns padded to their widest cell; the last one as it is."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in (header, *rows)]  # fmt: skip


def count(value: int | None) -> str:
    return "any" if value is None else str(value)


def duration(seconds: float | None) -> str:
    """~3m 05s, ~1h 02m, now; a dash where there is no estimate."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return "now"
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"~{hours}h {minutes:02d}m" if hours else f"~{minutes}m {secs:02d}s" if minutes else f"~{secs}s"

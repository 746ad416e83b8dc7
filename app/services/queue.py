"""The queue of this host's slots as people see it and shape it: its order, what each run waits for and when it may
start; a waiting run's priority; the limits of users and groups (admins). The decisions are app.services.scheduling's,
the very ones the supervisor's tick acts on (app.services.admission), made from what this module reads."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from app.core import priorities
from app.core.errors import FieldInvalid, LimitNotFound, RunNotActive, RunNotFound
from app.core.models import GroupMember, Run, RunStatus, UserGroup, UserLimit, utcnow
from app.core.settings import Settings
from app.launcher.launchers import Launchers, trains_builtin
from app.schemas.queue import (
    GroupIn,
    GroupOut,
    HoldingOut,
    LimitIn,
    LimitsOut,
    OwnerUseOut,
    QueuedOut,
    QueueOut,
    UserLimitOut,
)
from app.services import scheduling
from app.services.scheduling import Holding, Limit, Policy, Waiting
from app.store import audit
from app.store import queue as queue_store
from app.store import runs as run_store

GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
LIMITED_USER = re.compile(rf"^(\{scheduling.EVERYONE}|[A-Za-z0-9][A-Za-z0-9._@-]{{0,63}})$")  # a user's name, or *


def unit(launchers: Launchers) -> str:
    """What a slot of this host is, as people say it."""
    return "GPUs" if launchers.local.gpu_count else "CPU slots"


def host_launchers(launchers: Launchers) -> list[str]:
    """The launchers whose runs take this host's slots, and so wait in this queue."""
    return [launcher.name for launcher in launchers.watching() if launcher.host_slots]


def owner_of(run: Any) -> str:
    """Whose a run (or a queue row) is; one stored before runs kept an owner is its creator's."""
    return str(run.owner or run.created_by or "unknown")


def waiting_of(rows: Iterable[Sequence[Any]]) -> list[Waiting]:
    """The decision's view of queued runs, from the store's rows: (id, owner, priority, slots) first."""
    return [Waiting._make(row[:4]) for row in rows]


def holding_of(runs: Iterable[Run], *, now: datetime, interval: timedelta) -> list[Holding]:
    """The runs that hold slots, with whether each may be preempted now: a run of the built-in trainer (it checkpoints
    when asked to stop; a script may not), past its start-up, not marked otherwise, not preempted within `interval`."""
    return [
        Holding(run.id, owner_of(run), run.priority, len(run.devices or []) or run.nproc_per_node,
                stopping=run.status == RunStatus.stopping, preemptible=may_preempt(run, now=now, interval=interval))
        for run in runs
    ]  # fmt: skip


def may_preempt(run: Run, *, now: datetime, interval: timedelta) -> bool:
    recently = run.preempted_at is not None and now - run.preempted_at < interval
    return run.preemptible and run.status == RunStatus.running and trains_builtin(run) and not recently


def policy(db: Session, *, settings: Settings, launchers: Launchers, owners: Iterable[str], now: datetime) -> Policy:
    """The limits, groups and (with fair share) the recent use of `owners`, as the decision takes them."""
    users = {row.user_name: Limit(row.max_slots, row.max_runs) for row in queue_store.user_limit_rows(db)}
    groups, members = queue_store.group_rows(db)
    group_limits = {row.name: Limit(row.max_slots, row.max_runs) for row in groups}
    member_of: dict[str, list[str]] = defaultdict(list)
    for group, user in sorted(members):
        member_of[user].append(group)
    usage = None
    if settings.fair_share:  # (with one owner waiting, the order is the same without it: not asked for)
        since = now - timedelta(hours=settings.fair_share_window_h)
        waiting = sorted(set(owners))
        usage = queue_store.usage(db, owners=waiting, since=since, now=now) if len(waiting) > 1 else {}
    return Policy(capacity=len(launchers.local.slots), users=users, groups=group_limits, member_of=dict(member_of),
                  usage=usage, preemption=settings.preemption, unit=unit(launchers))  # fmt: skip


def ends_in(run: Run, *, now: datetime) -> float | None:
    """Seconds until a running run should end at its pace since its latest launch (as its page's ETA says)."""
    if run.status != RunStatus.running or run.started_at is None or not 0 < run.step < run.total_steps:
        return None
    return (now - run.started_at).total_seconds() * (run.total_steps - run.step) / run.step


def queue_view(db: Session, *, launchers: Launchers, settings: Settings) -> QueueOut:
    """The queue now: this host's in order, with reasons and estimates; the runs holding slots; Slurm's waiting."""
    now = utcnow()
    host = host_launchers(launchers)
    with db.begin():
        rows = queue_store.waiting_shown(db, launchers=host)
        live = queue_store.holding(db, launchers=host)
        elsewhere = queue_store.queued_elsewhere(db, launchers=host)
        waiting = waiting_of(rows)
        holding = holding_of(live, now=now, interval=timedelta(seconds=settings.preempt_interval_s))
        rules = policy(db, settings=settings, launchers=launchers, owners=[w.owner for w in waiting], now=now)
    decision = scheduling.decide(waiting, holding, rules)
    estimates = scheduling.start_estimates(decision, waiting, holding, policy=rules,
                                           ends_in={run.id: ends_in(run, now=now) for run in live})  # fmt: skip
    by_id = {row.id: row for row in rows}
    queued = [_queued(by_id[run_id], position, decision, estimates.get(run_id))
              for position, run_id in enumerate(decision.order, start=1)]  # fmt: skip
    return QueueOut(
        unit=rules.unit, capacity=rules.capacity, free=rules.capacity - sum(h.slots for h in holding),
        fair_share=settings.fair_share, preemption=settings.preemption, queued=queued,
        elsewhere=[_elsewhere(run) for run in elsewhere],
        holding=[_holding(run, held, now=now) for run, held in zip(live, holding, strict=True)],
        owners=_owners(holding, rules),
    )  # fmt: skip


def _queued(row: Any, position: int, decision: scheduling.Decision, starts_in: float | None) -> QueuedOut:
    return QueuedOut(
        id=row.id, name=row.name, owner=row.owner, priority=row.priority,
        priority_name=priorities.name(row.priority), slots=row.slots, position=position,
        waits_for="starts at the next tick" if row.id in decision.admitted else decision.waits[row.id],
        over_limit=row.id in decision.over_limit, starts_in_s=starts_in, created_at=row.created_at,
        launcher=row.launcher,
    )  # fmt: skip


def _elsewhere(run: Run) -> QueuedOut:
    """A run waiting in its scheduler's queue (or to be submitted to it): that scheduler's reason."""
    said = f"{run.job_state or 'submitted'}: {run.job_reason}" if run.job_reason else (run.job_state or "")
    waits = f"in Slurm's queue as job {run.job_id} ({said})" if run.job_id else "to be submitted at the next tick"
    return QueuedOut(
        id=run.id, name=run.name, owner=owner_of(run), priority=run.priority,
        priority_name=priorities.name(run.priority), slots=run.nproc_per_node * run.slurm_nodes, position=None,
        waits_for=waits, over_limit=False, starts_in_s=None, created_at=run.created_at, launcher=run.launcher,
    )  # fmt: skip


def _holding(run: Run, held: Holding, *, now: datetime) -> HoldingOut:
    return HoldingOut(id=run.id, name=run.name, owner=held.owner, priority=run.priority,
                      priority_name=priorities.name(run.priority), slots=held.slots, status=run.status.value,
                      ends_in_s=ends_in(run, now=now), preemptible=held.preemptible)  # fmt: skip


def _owners(holding: Sequence[Holding], rules: Policy) -> list[OwnerUseOut]:
    """Each user holding slots, with what they hold against their own limit."""
    slots: dict[str, int] = defaultdict(int)
    runs: dict[str, int] = defaultdict(int)
    for held in holding:
        slots[held.owner] += held.slots
        runs[held.owner] += 1
    found = []
    for owner in sorted(slots):
        limit = rules.user_limit(owner) or Limit()
        found.append(OwnerUseOut(owner=owner, slots=slots[owner], runs=runs[owner], max_slots=limit.slots,
                                 max_runs=limit.runs))  # fmt: skip
    return found


def positions(db: Session, *, launchers: Launchers, settings: Settings) -> dict[int, int]:
    """Each queued run's place in this host's queue (1: the next to start), for the runs list's badges; read in the
    caller's transaction."""
    now = utcnow()
    host = host_launchers(launchers)
    waiting = waiting_of(queue_store.waiting(db, launchers=host))
    if not waiting:
        return {}
    holding = holding_of(queue_store.holding(db, launchers=host), now=now,
                         interval=timedelta(seconds=settings.preempt_interval_s))  # fmt: skip
    rules = policy(db, settings=settings, launchers=launchers, owners={run.owner for run in waiting}, now=now)
    return {run_id: place for place, run_id in enumerate(scheduling.decide(waiting, holding, rules).order, start=1)}


def set_priority(db: Session, *, run_id: int, priority: int, admin: bool, settings: Settings, actor: str) -> Run:
    """Changes a queued run's priority (an operator up to the admin's limit); its place in the queue follows."""
    if refusal := priorities.refusal(priority, admin=admin, operator_max=settings.operator_priority_max):
        raise FieldInvalid("priority", refusal)
    with db.begin():
        run = run_store.get_run(db, run_id)
        if run is None:
            raise RunNotFound(run_id)
        run_store.reread_locked(db, run)  # a tick may be starting it
        if run.status != RunStatus.queued or run.job_id is not None:
            where = f"submitted to {run.launcher} as job {run.job_id}" if run.job_id else run.status.value
            raise RunNotActive(f"run {run_id} is {where}: a priority changes only while the run waits in the queue")
        before, run.priority = run.priority, priority
        audit.record(db, actor=actor, action="priority", run_id=run.id,
                     detail=f"{priorities.name(before)} -> {priorities.name(priority)}")  # fmt: skip
    return run


def limits(db: Session, *, launchers: Launchers, settings: Settings) -> LimitsOut:
    """Every user limit and group, for the admins' page and `rankboard queue limits`."""
    with db.begin():
        users = [UserLimitOut(user=row.user_name, max_slots=row.max_slots, max_runs=row.max_runs)
                 for row in queue_store.user_limits(db)]  # fmt: skip
        groups = [_group_out(group) for group in queue_store.groups(db)]
    return LimitsOut(unit=unit(launchers), users=users, groups=groups,
                     operator_priority_max=settings.operator_priority_max)  # fmt: skip


def set_user_limit(db: Session, *, user: str, limit: LimitIn, actor: str) -> UserLimitOut:
    """Sets one user's limit (`*`: everyone's without their own), replacing any it had."""
    if not LIMITED_USER.match(user):
        raise FieldInvalid("user", "a user's name (letters, digits, '.', '_', '@', '-'), or * for every user")
    with db.begin():
        row = queue_store.user_limit(db, user)
        if row is None:
            row = UserLimit(user_name=user)
            db.add(row)
        row.max_slots, row.max_runs = limit.max_slots, limit.max_runs
        audit.record(db, actor=actor, action="set limit", detail=f"{user}: {_limit_words(limit)}")
    return UserLimitOut(user=user, max_slots=limit.max_slots, max_runs=limit.max_runs)


def remove_user_limit(db: Session, *, user: str, actor: str) -> None:
    with db.begin():
        row = queue_store.user_limit(db, user)
        if row is None:
            raise LimitNotFound(f"{user} has no limit of their own")
        db.delete(row)
        audit.record(db, actor=actor, action="removed limit", detail=user)


def save_group(db: Session, *, name: str, group: GroupIn, actor: str) -> GroupOut:
    """Makes the group, or replaces its members and limit."""
    if not GROUP_NAME.match(name):
        raise FieldInvalid("name", "a group's name is 1-64 letters, digits, '.', '_' or '-', first a letter or digit")
    with db.begin():
        row = queue_store.group_by_name(db, name)
        if row is None:
            row = UserGroup(name=name)
            db.add(row)
            db.flush()
        else:
            queue_store.remove_members(db, row)
            db.expire(row, ["members"])
        row.max_slots, row.max_runs = group.max_slots, group.max_runs
        db.add_all(GroupMember(group_id=row.id, user_name=member) for member in sorted(set(group.members)))
        audit.record(db, actor=actor, action="saved group", detail=f"{name} ({', '.join(sorted(set(group.members)))})"
                     f": {_limit_words(group)}")  # fmt: skip
    return GroupOut(name=name, members=sorted(set(group.members)), max_slots=group.max_slots, max_runs=group.max_runs)


def remove_group(db: Session, *, name: str, actor: str) -> None:
    with db.begin():
        row = queue_store.group_by_name(db, name)
        if row is None:
            raise LimitNotFound(f"there is no group {name!r}")
        db.delete(row)
        audit.record(db, actor=actor, action="removed group", detail=name)


def _group_out(group: UserGroup) -> GroupOut:
    return GroupOut(name=group.name, members=group.member_names, max_slots=group.max_slots, max_runs=group.max_runs)


def _limit_words(limit: LimitIn) -> str:
    slots = "any slots" if limit.max_slots is None else f"{limit.max_slots} slots"
    runs = "any runs" if limit.max_runs is None else f"{limit.max_runs} runs"
    return f"{slots}, {runs} at once"

"""What the queue reads: the waiting runs as plain rows (not objects: a tick reads the whole queue twice a second),
the limits of users and groups, and each owner's recent use of the slots for fair share."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Row, bindparam, delete, func, literal, select
from sqlalchemy.orm import Session

from app.core.models import GroupMember, Run, RunStatus, UserGroup, UserLimit, UtcDateTime

# Built once: building a statement costs more than running it on a small table (bench/supervisor_tick.py). Table
# columns, run on the connection: a tick reads the whole queue twice a second, and the ORM's handling of each row cost
# more than the query (bench/queue_tick.py). (id, owner, priority, slots) is scheduling.Waiting, in its order.
RUNS = Run.__table__.c
_OWNER = func.coalesce(RUNS.owner, RUNS.created_by, "unknown").label("owner")
_QUEUED_HERE = (RUNS.status == RunStatus.queued, RUNS.job_id.is_(None),
                RUNS.launcher.in_(bindparam("launchers", expanding=True)))  # fmt: skip
_WAITING = select(RUNS.id, _OWNER, RUNS.priority, RUNS.nproc_per_node.label("slots")).where(*_QUEUED_HERE)
_SAID = select(RUNS.id, RUNS.status_reason).where(*_QUEUED_HERE, RUNS.status_reason.startswith(bindparam("said")))
_WAITING_SHOWN = (
    select(Run.id, _OWNER, Run.priority, Run.nproc_per_node.label("slots"), Run.launcher, Run.name, Run.created_at)
    .where(*_QUEUED_HERE)
    .order_by(Run.id)
)  # fmt: skip


def waiting(db: Session, *, launchers: Sequence[str]) -> list[tuple[int, str, int, int]]:
    """The queued runs of these launchers, which wait for this host's slots: (id, owner, priority, slots)."""
    return db.connection().execute(_WAITING, {"launchers": list(launchers)}).all()  # type: ignore[return-value]


def reasons_saying(db: Session, *, launchers: Sequence[str], said: str) -> dict[int, str]:
    """Of those runs, the reasons that begin with `said` (a limit's: a few runs), by run id."""
    rows = db.connection().execute(_SAID, {"launchers": list(launchers), "said": said})
    return {run_id: reason for run_id, reason in rows}


def waiting_shown(db: Session, *, launchers: Sequence[str]) -> Sequence[Row[Any]]:
    """As `waiting`, for a page: (id, owner, priority, slots, launcher, name, created_at)."""
    return db.execute(_WAITING_SHOWN, {"launchers": list(launchers)}).all()


def user_limit_rows(db: Session) -> Sequence[Row[Any]]:
    """(user_name, max_slots, max_runs) of every user limit."""
    return db.execute(select(UserLimit.user_name, UserLimit.max_slots, UserLimit.max_runs)).all()  # type: ignore[return-value]


def group_rows(db: Session) -> tuple[Sequence[Row[Any]], list[tuple[str, str]]]:
    """Every group's (name, max_slots, max_runs), and every membership's (group name, user name)."""
    groups = db.execute(select(UserGroup.name, UserGroup.max_slots, UserGroup.max_runs)).all()
    members = [
        (group, user) for group, user in db.execute(select(UserGroup.name, GroupMember.user_name).join(GroupMember))
    ]
    return groups, members  # type: ignore[return-value]


def user_limits(db: Session) -> Sequence[UserLimit]:
    return db.scalars(select(UserLimit).order_by(UserLimit.user_name)).all()


def user_limit(db: Session, name: str) -> UserLimit | None:
    return db.get(UserLimit, name)


def groups(db: Session) -> Sequence[UserGroup]:
    """Every group with its members (loaded with it: one more query for all of them)."""
    return db.scalars(select(UserGroup).order_by(UserGroup.name)).all()


def group_by_name(db: Session, name: str) -> UserGroup | None:
    return db.scalar(select(UserGroup).where(UserGroup.name == name))


def remove_members(db: Session, group: UserGroup) -> None:
    db.execute(delete(GroupMember).where(GroupMember.group_id == group.id))


def usage(db: Session, *, owners: Sequence[str], since: datetime, now: datetime) -> dict[str, float]:
    """Slot-hours each owner's runs held between `since` and `now`: each run's processes times the part of its
    latest launch (started_at to finished_at, or now while live) inside the window, summed in SQL per owner."""
    if not owners:
        return {}
    since_at, now_at = literal(since, UtcDateTime()), literal(now, UtcDateTime())
    ended = func.coalesce(Run.finished_at, now_at)
    hours: ColumnElement[Any]
    if db.get_bind().dialect.name == "postgresql":  # PostgreSQL's max and min of two are greatest and least
        hours = func.extract("epoch", func.least(ended, now_at) - func.greatest(Run.started_at, since_at)) / 3600.0
    else:  # SQLite's max and min of two are scalar; its times are text that julianday reads
        hours = (func.julianday(func.min(ended, now_at)) - func.julianday(func.max(Run.started_at, since_at))) * 24.0
    slots = func.coalesce(Run.world_size, Run.nproc_per_node)
    query = (
        select(Run.owner, func.sum(slots * hours))
        .where(Run.owner.in_(list(owners)), Run.started_at.is_not(None))
        .where(Run.finished_at.is_(None) | (Run.finished_at > since_at))
        .group_by(Run.owner)
    )
    return {str(owner): max(0.0, float(total or 0.0)) for owner, total in db.execute(query).all()}


def queued_elsewhere(db: Session, *, launchers: Sequence[str]) -> Sequence[Run]:
    """The queued runs of other launchers than these (Slurm's: waiting in its queue, or to be submitted)."""
    query = select(Run).where(Run.status == RunStatus.queued, Run.launcher.not_in(list(launchers)))
    return db.scalars(query.order_by(Run.id)).all()


def holding(db: Session, *, launchers: Sequence[str]) -> Sequence[Run]:
    """The runs of these launchers that hold processes (starting, running or stopping), oldest first."""
    live = [RunStatus.starting, RunStatus.running, RunStatus.stopping]
    query = select(Run).where(Run.status.in_(live), Run.launcher.in_(list(launchers)))
    return db.scalars(query.order_by(Run.id)).all()


def groups_of(db: Session, user: str) -> list[str]:
    """The names of the groups `user` is in."""
    query = select(UserGroup.name).join(GroupMember).where(GroupMember.user_name == user).order_by(UserGroup.name)
    return list(db.scalars(query))

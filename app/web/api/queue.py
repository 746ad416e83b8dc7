"""The queue: its order and reasons; a waiting run's priority; the limits of users and groups (admins only)."""

from __future__ import annotations

from fastapi import APIRouter

from app.core.errors import FieldInvalid, LimitNotFound, RunNotActive, RunNotFound
from app.core.models import Role, Run
from app.schemas.queue import (
    GroupIn,
    GroupOut,
    LimitIn,
    LimitsOut,
    PriorityIn,
    QueueOut,
    UserLimitOut,
)
from app.schemas.runs import RunDetail
from app.services import queue
from app.web.api import UNREADABLE_BODY, documented
from app.web.deps import CallerDep, LaunchersDep, SessionDep, SettingsDep
from app.web.params import GroupName, LimitUser, RunId

router = APIRouter(prefix="/api", tags=["queue"])


@router.get("/queue", response_model=QueueOut,
            summary="This host's queue in order: priority, owner, why each run waits, when it may start")  # fmt: skip
def show_queue(db: SessionDep, launchers: LaunchersDep, settings: SettingsDep) -> QueueOut:
    return queue.queue_view(db, launchers=launchers, settings=settings)


@router.post("/runs/{run_id}/priority", response_model=RunDetail,
             responses={**documented(RunNotFound, RunNotActive, FieldInvalid), **UNREADABLE_BODY},
             summary="Change a queued run's priority (an operator up to the admin's limit)")  # fmt: skip
def set_priority(run_id: RunId, body: PriorityIn, db: SessionDep, settings: SettingsDep, caller: CallerDep) -> Run:
    return queue.set_priority(db, run_id=run_id, priority=body.priority, admin=caller.role == Role.admin,
                              settings=settings, actor=caller.name)  # fmt: skip


@router.get("/queue/limits", response_model=LimitsOut, summary="The limits of users and groups (admins)")
def show_limits(db: SessionDep, launchers: LaunchersDep, settings: SettingsDep) -> LimitsOut:
    return queue.limits(db, launchers=launchers, settings=settings)


@router.put("/queue/limits/users/{user}", response_model=UserLimitOut, responses=UNREADABLE_BODY,
            summary="Set a user's limit of slots and runs at once; `*`: every user without their own")  # fmt: skip
def set_user_limit(user: LimitUser, body: LimitIn, db: SessionDep, caller: CallerDep) -> UserLimitOut:
    return queue.set_user_limit(db, user=user, limit=body, actor=caller.name)


@router.delete("/queue/limits/users/{user}", response_model=LimitsOut, responses=documented(LimitNotFound),
               summary="Remove a user's own limit; the limits left")  # fmt: skip
def remove_user_limit(user: LimitUser, db: SessionDep, launchers: LaunchersDep, settings: SettingsDep,
                      caller: CallerDep) -> LimitsOut:  # fmt: skip
    queue.remove_user_limit(db, user=user, actor=caller.name)
    return queue.limits(db, launchers=launchers, settings=settings)


@router.put("/queue/limits/groups/{group}", response_model=GroupOut,
            responses={**documented(FieldInvalid), **UNREADABLE_BODY},
            summary="Make a group of users, or replace its members and its limit")  # fmt: skip
def save_group(group: GroupName, body: GroupIn, db: SessionDep, caller: CallerDep) -> GroupOut:
    return queue.save_group(db, name=group, group=body, actor=caller.name)


@router.delete("/queue/limits/groups/{group}", response_model=LimitsOut, responses=documented(LimitNotFound),
               summary="Remove a group and its limit; the limits left")  # fmt: skip
def remove_group(group: GroupName, db: SessionDep, launchers: LaunchersDep, settings: SettingsDep,
                 caller: CallerDep) -> LimitsOut:  # fmt: skip
    queue.remove_group(db, name=group, actor=caller.name)
    return queue.limits(db, launchers=launchers, settings=settings)

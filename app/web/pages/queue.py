"""The queue page (its table polls itself), a waiting run's priority from it, and the admins' page of limits."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel, ValidationError

from app.core import priorities
from app.core.errors import FieldInvalid
from app.core.models import Role
from app.schemas.queue import GroupIn, LimitIn, PriorityIn
from app.services import queue
from app.web.deps import CallerDep, LaunchersDep, SessionDep, SettingsDep
from app.web.pages import page, templates_of
from app.web.params import GroupName, LimitUser
from app.web.templating import render_block

router = APIRouter(include_in_schema=False)
Parsed = TypeVar("Parsed", bound=BaseModel)
Count = Annotated[str, Form(max_length=12)]  # a limit as the form sends it: digits, or empty for none


@router.get("/queue", response_class=HTMLResponse)
def queue_page(request: Request, db: SessionDep, launchers: LaunchersDep, settings: SettingsDep) -> Response:
    """The queue in order; the page polls itself for its `queue_now` fragment."""
    context = {"queue": queue.queue_view(db, launchers=launchers, settings=settings),
               "priority_names": list(priorities.NAMES)}  # fmt: skip
    if request.headers.get("HX-Target") == "queue-now":
        return HTMLResponse(render_block(templates_of(request), "queue.html", "queue_now", context))
    return page(request, "queue.html", context)


@router.post("/queue/priority")
def set_priority(db: SessionDep, settings: SettingsDep, caller: CallerDep, run_id: Annotated[int, Form(ge=1)],
                 priority: Annotated[str, Form(max_length=10)]) -> Response:  # fmt: skip
    """A waiting run's new priority, from the form above the queue."""
    body = _parsed(PriorityIn, {"priority": priority})
    queue.set_priority(db, run_id=run_id, priority=body.priority, admin=caller.role == Role.admin,
                       settings=settings, actor=caller.name)  # fmt: skip
    return RedirectResponse("/queue", status_code=303)


@router.get("/queue/limits", response_class=HTMLResponse)
def limits_page(request: Request, db: SessionDep, launchers: LaunchersDep, settings: SettingsDep) -> Response:
    return page(request, "queue_limits.html", {"limits": queue.limits(db, launchers=launchers, settings=settings)})


@router.post("/queue/limits/users")
def set_user_limit(db: SessionDep, caller: CallerDep, user: Annotated[str, Form(max_length=64)],
                   max_slots: Count = "", max_runs: Count = "") -> Response:  # fmt: skip
    limit = _parsed(LimitIn, {"max_slots": max_slots or None, "max_runs": max_runs or None})
    queue.set_user_limit(db, user=user.strip(), limit=limit, actor=caller.name)
    return RedirectResponse("/queue/limits", status_code=303)


@router.post("/queue/limits/users/{user}/delete")
def remove_user_limit(user: LimitUser, db: SessionDep, caller: CallerDep) -> Response:
    queue.remove_user_limit(db, user=user, actor=caller.name)
    return RedirectResponse("/queue/limits", status_code=303)


@router.post("/queue/limits/groups")
def save_group(db: SessionDep, caller: CallerDep, name: Annotated[str, Form(max_length=64)],
               members: Annotated[str, Form(max_length=100_000)] = "", max_slots: Count = "",
               max_runs: Count = "") -> Response:  # fmt: skip
    names = members.replace(",", " ").split()
    group = _parsed(GroupIn, {"max_slots": max_slots or None, "max_runs": max_runs or None, "members": names})
    queue.save_group(db, name=name.strip(), group=group, actor=caller.name)
    return RedirectResponse("/queue/limits", status_code=303)


@router.post("/queue/limits/groups/{group}/delete")
def remove_group(group: GroupName, db: SessionDep, caller: CallerDep) -> Response:
    queue.remove_group(db, name=group, actor=caller.name)
    return RedirectResponse("/queue/limits", status_code=303)


def _parsed(model: type[Parsed], data: dict[str, Any]) -> Parsed:
    """The form's strings as the API's body; FieldInvalid naming the first wrong field (empty: no limit)."""
    try:
        return model.model_validate(data, strict=False)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "form"
        raise FieldInvalid(field, str(first["msg"]).removeprefix("Value error, ")) from None

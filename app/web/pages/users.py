"""The login page, logging out, and the admins' pages of users and API tokens. Each route calls one service."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.core.models import Role
from app.services import tokens, users
from app.web.deps import CallerDep, SessionDep, SettingsDep
from app.web.guard import SESSION_COOKIE, is_secure
from app.web.pages import FormValues, page
from app.web.params import NextPage, TokenId, UserName

router = APIRouter(include_in_schema=False)
ROLES = [role.value for role in Role]


def safe_next(target: str) -> str:
    """Only a path of this server: never another site (`//host`, `/\\host`) to send the user on to."""
    return target if target.startswith("/") and not target.startswith(("//", "/\\")) else "/"


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: NextPage = "/") -> Response:
    if not request.app.state.auth.on:  # nothing to log in to: the dashboard is open on loopback
        return RedirectResponse(safe_next(next), status_code=303)
    return page(request, "login.html", {"next": safe_next(next), "name": "", "error": None})


@router.post("/login")
def log_in(request: Request, db: SessionDep, settings: SettingsDep, values: FormValues) -> Response:
    """Checks the password; a new session (a fresh id at every login) in an HttpOnly, SameSite=Lax cookie."""
    client = request.client.host if request.client else "unknown"
    session_id = users.log_in(db, name=values.get("name", ""), password=values.get("password", ""), client=client,
                              throttle=request.app.state.login_throttle,
                              replaces=request.cookies.get(SESSION_COOKIE), settings=settings)  # fmt: skip
    response = RedirectResponse(safe_next(values.get("next", "/")), status_code=303)
    response.set_cookie(SESSION_COOKIE, session_id, max_age=int(settings.session_max_s), path="/", httponly=True,
                        samesite="lax", secure=is_secure(request, settings))  # fmt: skip
    return response


@router.post("/logout")
def log_out(request: Request, db: SessionDep, settings: SettingsDep) -> Response:
    users.log_out(db, session_id=request.cookies.get(SESSION_COOKIE, ""))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="lax",
                           secure=is_secure(request, settings))  # fmt: skip
    return response


@router.get("/users", response_class=HTMLResponse)
def users_page(request: Request, db: SessionDep) -> Response:
    return page(request, "users.html", {"users": users.list_users(db), "roles": ROLES, "made": None})


@router.post("/users", response_class=HTMLResponse)
def add_user(
    request: Request,
    db: SessionDep,
    caller: CallerDep,
    name: Annotated[str, Form(max_length=64)],
    role: Annotated[Role, Form()],
    password: Annotated[str, Form(max_length=1000)] = "",
) -> Response:
    """Adds the user and shows the password made for them (when none was given), this once."""
    made = users.add_user(db, name=name, role=role, password=password or None, actor=caller.name)
    return page(request, "users.html", {"users": users.list_users(db), "roles": ROLES, "made": made})


@router.post("/users/{user}/delete")
def remove_user(user: UserName, db: SessionDep, caller: CallerDep) -> Response:
    users.remove_user(db, name=user, actor=caller.name)
    return RedirectResponse("/users", status_code=303)


@router.get("/tokens", response_class=HTMLResponse)
def tokens_page(request: Request, db: SessionDep) -> Response:
    return page(request, "tokens.html", {"tokens": tokens.list_tokens(db), "roles": ROLES, "made": None})


@router.post("/tokens", response_class=HTMLResponse)
def create_token(
    request: Request,
    db: SessionDep,
    caller: CallerDep,
    name: Annotated[str, Form(max_length=64)],
    role: Annotated[Role, Form()],
    expires: Annotated[str, Form(max_length=20)] = "90d",
) -> Response:
    """Makes the token and shows its secret, this once."""
    made = tokens.create_token(db, name=name, role=role, expires=expires, owner=caller.user, actor=caller.name)
    return page(request, "tokens.html", {"tokens": tokens.list_tokens(db), "roles": ROLES, "made": made})


@router.post("/tokens/{token_id}/revoke")
def revoke_token(token_id: TokenId, db: SessionDep, caller: CallerDep) -> Response:
    tokens.revoke_token(db, token_id=token_id, actor=caller.name)
    return RedirectResponse("/tokens", status_code=303)

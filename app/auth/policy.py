"""The one place that says who a request's caller is and which role each request needs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from app.core.models import Role

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Open to anyone: the login page, the static files (vendored scripts and styles), the health check start-up scripts
# wait on, and the trainer's ingest, which proves itself with its run's own token (checked by the route).
PUBLIC = re.compile(r"^/(login|static/.*|api/health|favicon\.ico)$")
INGEST = re.compile(r"^/api/runs/\d+/(metrics|dumps/\d+)$")  # a rank's dump proves itself the same way
ADMIN_ONLY = re.compile(r"^(/api)?/(users|tokens|alerts|queue/limits)(/.*)?$")
ANY_USER_MAY_POST = frozenset({"/logout"})

Via = Literal["local", "session", "token", "proxy"]


@dataclass(frozen=True)
class Caller:
    """Who sent a request: `name` is what the audit trail records; `user` the user it acts for (None: no one logged
    in, or a token made for no user); `csrf` is the session's token (sessions only)."""

    name: str
    role: Role
    via: Via
    user: str | None = None
    csrf: str | None = None


# With no user configured the server listens on loopback only, and whoever reaches it may do everything, as before.
LOCAL = Caller("local", Role.admin, "local")
TOKEN_ACTOR = " (token "  # how an actor's name says a user's token: "ada (token ci)" (app.services.tokens)


def owner_of(actor: str) -> str:
    """The user an actor's name stands for, whose runs and limits its runs count in: "ada (token ci)" is ada; a token
    made for no user ("token ci") and "local" stand for themselves. User names hold no space (users.NAME)."""
    return actor.split(TOKEN_ACTOR, 1)[0] if actor.endswith(")") else actor


def is_public(method: str, path: str) -> bool:
    """True for what needs no login."""
    return bool(PUBLIC.match(path)) or (method == "POST" and bool(INGEST.match(path)))


def needed_role(method: str, path: str) -> Role:
    """Managing users and tokens needs an admin; any other change an operator; reading, a viewer."""
    if ADMIN_ONLY.match(path):
        return Role.admin
    if method in UNSAFE_METHODS and path not in ANY_USER_MAY_POST:
        return Role.operator
    return Role.viewer

"""Users and their logins: add and remove users, log in and out, and tell who a request's caller is."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from app.auth.passwords import hash_password, new_password, new_secret, sha256, verify_password
from app.auth.policy import Caller
from app.core.errors import Conflict, FieldInvalid, LoginThrottled, NotAuthenticated, UserNotFound
from app.core.models import LoginSession, Role, User, utcnow
from app.core.settings import Settings
from app.schemas.users import NewUserOut
from app.services import tokens
from app.services.login_throttle import LoginThrottle
from app.store import audit
from app.store import users as user_store

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
MIN_PASSWORD = 8
TOUCH_EVERY = timedelta(seconds=60)  # a session's last use is written at most this often: not a write per request


def auth_required(db: Session, *, settings: Settings) -> bool:
    """Authentication is on once a user exists, or an authenticating proxy is trusted."""
    return bool(settings.trusted_proxy) or user_store.any_user(db)


def ensure_first_admin(db: Session, *, settings: Settings) -> None:
    """With no user yet and RANKBOARD_ADMIN_PASSWORD set, makes the first admin with that password."""
    if settings.admin_password is None:
        return
    with db.begin():
        if user_store.any_user(db):
            return
    add_user(db, name=settings.admin_user, role=Role.admin, password=settings.admin_password.get_secret_value(),
             actor="RANKBOARD_ADMIN_PASSWORD")  # fmt: skip


def add_user(db: Session, *, name: str, role: Role, password: str | None, actor: str) -> NewUserOut:
    """Adds a user; without a password one is made, returned to be shown once."""
    if not NAME.match(name):
        raise FieldInvalid("name", "a user name is 1-64 letters, digits, '.', '_', '@' or '-', starting with a "
                           "letter or digit")  # fmt: skip
    made = new_password() if password is None else None
    secret = password if password is not None else made
    assert secret is not None
    if len(secret) < MIN_PASSWORD:
        raise FieldInvalid("password", f"a password has at least {MIN_PASSWORD} characters")
    with db.begin():
        if user_store.user_by_name(db, name) is not None:
            raise Conflict(f"a user named {name!r} already exists")
        db.add(User(name=name, role=role, password_hash=hash_password(secret)))
        audit.record(db, actor=actor, action="added user", detail=f"{name} ({role.value})")
    return NewUserOut(name=name, role=role, password=made)


def list_users(db: Session) -> Sequence[User]:
    return user_store.list_users(db)


def remove_user(db: Session, *, name: str, actor: str) -> None:
    """Removes a user, their logins and their tokens; the last admin stays, so someone can still manage users."""
    with db.begin():
        user = user_store.user_by_name(db, name)
        if user is None:
            raise UserNotFound(name)
        if user.role == Role.admin and user_store.count_admins(db) == 1:
            raise Conflict(f"{name} is the last admin; add another admin first")
        db.delete(user)
        audit.record(db, actor=actor, action="removed user", detail=name)


def log_in(db: Session, *, name: str, password: str, client: str, throttle: LoginThrottle, replaces: str | None,
           settings: Settings) -> str:  # fmt: skip
    """A new session's id for the cookie (any session the browser had is ended: a fresh id at each login)."""
    keys = (f"user:{name}", f"addr:{client}")
    with db.begin():
        wait = throttle.wait_s(db, (keys[0], 1), (keys[1], 4))
        if wait:
            raise LoginThrottled(wait)
        user = user_store.user_by_name(db, name)
        if not verify_password(password, user.password_hash if user else None) or user is None:
            throttle.failed(db, keys)  # committed: the refusal is raised once the block ends
            user = None
        else:
            if replaces:
                user_store.delete_session(db, sha256(replaces))
            now = utcnow()  # the sessions past their expiry go now: nothing else would delete them
            user_store.delete_sessions_before(db, created_before=now - timedelta(seconds=settings.session_max_s),
                                              seen_before=now - timedelta(seconds=settings.session_idle_s))  # fmt: skip
            session_id = new_secret()
            db.add(LoginSession(id_hash=sha256(session_id), user_id=user.id))
    if user is None:
        raise NotAuthenticated("wrong user name or password")
    return session_id


def log_out(db: Session, *, session_id: str) -> None:
    with db.begin():
        user_store.delete_session(db, sha256(session_id))


def csrf_token(session_id: str) -> str:
    """The session's CSRF token: derived from its id, so nothing more is stored, and no one can go back from it."""
    return sha256(f"csrf:{session_id}")


def resolve(db: Session, *, settings: Settings, session_id: str | None, bearer: str | None,
            proxy_user: str | None) -> Caller | None:  # fmt: skip
    """The caller these credentials name (a bearer token first, then a proxy's header, then a session), or None."""
    with db.begin():
        if bearer is not None:
            return tokens.caller(db, secret=bearer)
        if proxy_user is not None:
            user = user_store.user_by_name(db, proxy_user)
            role = user.role if user else Role(settings.proxy_role)
            return Caller(proxy_user, role, "proxy", user=proxy_user)
        if session_id is not None:
            return _session_caller(db, session_id=session_id, settings=settings)
    return None


def _session_caller(db: Session, *, session_id: str, settings: Settings) -> Caller | None:
    session = user_store.session_by_hash(db, sha256(session_id))
    if session is None:
        return None
    now = utcnow()
    if _expired(session, now=now, settings=settings):
        db.delete(session)
        return None
    if now - session.last_seen_at > min(TOUCH_EVERY, timedelta(seconds=settings.session_idle_s / 10)):
        session.last_seen_at = now
    user = session.user
    return Caller(user.name, user.role, "session", user=user.name, csrf=csrf_token(session_id))


def _expired(session: LoginSession, *, now: datetime, settings: Settings) -> bool:
    return (now - session.created_at > timedelta(seconds=settings.session_max_s)
            or now - session.last_seen_at > timedelta(seconds=settings.session_idle_s))  # fmt: skip

"""API tokens for automation: made with a role and an expiry, shown once, stored as SHA-256, revocable."""

from __future__ import annotations

import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.orm import Session

from app.auth.passwords import new_secret, sha256
from app.auth.policy import Caller
from app.core.errors import FieldInvalid, TokenNotFound, UserNotFound
from app.core.models import ROLE_ORDER, ApiToken, Role, utcnow
from app.store import audit
from app.store import users as user_store

PREFIX = "rbt_"  # a token says what it is, to a person and to secret scanners
EXPIRY = re.compile(r"^(\d{1,5})([hdw])$")
UNITS = {"h": timedelta(hours=1), "d": timedelta(days=1), "w": timedelta(weeks=1)}
LONGEST = timedelta(days=3660)
TOUCH_EVERY = timedelta(seconds=60)  # last use is written at most this often: not a write per request


@dataclass(frozen=True)
class NewToken:
    """A token just made: `secret` is shown this once."""

    token: ApiToken
    secret: str


def parse_expiry(text: str) -> timedelta:
    """'90d', '12h' or '2w' as a time span; raises FieldInvalid naming `expires`."""
    match = EXPIRY.match(text.strip())
    if not match or not timedelta(0) < int(match[1]) * UNITS[match[2]] <= LONGEST:
        raise FieldInvalid("expires", f"{text!r}: write a number of hours, days or weeks, e.g. 12h, 90d, 2w "
                           "(at most 10 years)")  # fmt: skip
    return int(match[1]) * UNITS[match[2]]


def create_token(db: Session, *, name: str, role: Role, expires: str, owner: str | None, actor: str) -> NewToken:
    """Makes a token for `owner` (None: for no user, from the CLI) that acts with `role` until it expires."""
    lifetime = parse_expiry(expires)
    if not name.strip() or len(name) > 64:
        raise FieldInvalid("name", "a token's name is 1-64 characters")
    secret = new_secret(PREFIX)
    with db.begin():
        user = user_store.user_by_name(db, owner) if owner is not None else None
        if owner is not None and user is None:
            raise UserNotFound(owner)
        token = ApiToken(name=name.strip(), token_hash=sha256(secret), role=role, user_id=user.id if user else None,
                         expires_at=utcnow() + lifetime)  # fmt: skip
        db.add(token)
        audit.record(db, actor=actor, action="created token", detail=f"{token.name} ({role.value}, {expires})")
    return NewToken(token, secret)


def list_tokens(db: Session) -> Sequence[ApiToken]:
    return user_store.list_tokens(db)


def revoke_token(db: Session, *, token_id: int, actor: str) -> ApiToken:
    with db.begin():
        token = db.get(ApiToken, token_id)
        if token is None:
            raise TokenNotFound(token_id)
        if token.revoked_at is None:
            token.revoked_at = utcnow()
            audit.record(db, actor=actor, action="revoked token", detail=token.name)
    return token


def caller(db: Session, *, secret: str) -> Caller | None:
    """The caller a bearer token stands for, inside the caller's transaction; None for an unknown, expired or
    revoked one. A token acts with its own role, never more than its owner's."""
    token = user_store.token_by_hash(db, sha256(secret))
    # The lookup found a row by its hash; comparing the hash again in constant time costs nothing and keeps the
    # answer from depending on how much of it matched, whatever the database's index does.
    if token is None or not hmac.compare_digest(token.token_hash, sha256(secret)):
        return None
    now = utcnow()
    if token.revoked_at is not None or token.expires_at <= now:
        return None
    if token.last_used_at is None or now - token.last_used_at > TOUCH_EVERY:
        token.last_used_at = now
    role = token.role
    if token.user is not None:
        role = min(role, token.user.role, key=ROLE_ORDER.index)
        return Caller(f"{token.user.name} (token {token.name})", role, "token", user=token.user.name)
    return Caller(f"token {token.name}", role, "token")

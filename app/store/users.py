"""Users, their login sessions and API tokens."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, exists, func, select
from sqlalchemy.orm import Session

from app.core.models import ApiToken, LoginFailure, LoginSession, Role, User


def any_user(db: Session) -> bool:
    return bool(db.scalar(select(exists().where(User.id.is_not(None)))))


def user_by_name(db: Session, name: str) -> User | None:
    return db.scalar(select(User).where(User.name == name))


def list_users(db: Session) -> Sequence[User]:
    return db.scalars(select(User).order_by(User.name)).all()


def count_admins(db: Session) -> int:
    return db.scalar(select(func.count()).select_from(User).where(User.role == Role.admin)) or 0


def session_by_hash(db: Session, id_hash: str) -> LoginSession | None:
    return db.get(LoginSession, id_hash)


def delete_session(db: Session, id_hash: str) -> None:
    db.execute(delete(LoginSession).where(LoginSession.id_hash == id_hash))


def delete_sessions_before(db: Session, *, created_before: datetime, seen_before: datetime) -> None:
    """Removes the sessions past their absolute or idle expiry."""
    db.execute(
        delete(LoginSession).where(
            (LoginSession.created_at < created_before) | (LoginSession.last_seen_at < seen_before)
        )
    )


def token_by_hash(db: Session, token_hash: str) -> ApiToken | None:
    return db.scalar(select(ApiToken).where(ApiToken.token_hash == token_hash))


def list_tokens(db: Session) -> Sequence[ApiToken]:
    return db.scalars(select(ApiToken).order_by(ApiToken.id.desc())).all()


def login_failure_at(db: Session, *, key: str, since: datetime, nth: int) -> datetime | None:
    """The time of the key's `nth` newest failed login after `since`; None when it has fewer."""
    newest = select(LoginFailure.at).where(LoginFailure.key == key, LoginFailure.at > since)
    return db.scalar(newest.order_by(LoginFailure.at.desc()).offset(nth - 1).limit(1))


def add_login_failures(db: Session, *, keys: Sequence[str], at: datetime, forget_before: datetime) -> None:
    """Records a failed login against each key, and forgets the failures of any key from before `forget_before`."""
    db.execute(delete(LoginFailure).where(LoginFailure.at < forget_before))
    db.add_all([LoginFailure(key=key, at=at) for key in keys])

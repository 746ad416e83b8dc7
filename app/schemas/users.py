"""Users, their roles, and API tokens; and who the caller is."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from app.core.models import ApiToken, Role
from app.core.request_body import Body


class CallerOut(BaseModel):
    name: str
    role: Role
    via: str = Field(description="session, token, proxy, or local (authentication is off).")


class UserIn(Body):
    name: str = Field(max_length=64)
    role: Role = Field(strict=False)  # its name, as JSON writes an enum
    password: str | None = Field(default=None, description="Left out: one is made and answered, this once.")


class UserOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    role: Role
    created_at: datetime


class NewUserOut(BaseModel):
    """A user just added, and the password made for them (null when one was given): shown once, never stored."""

    name: str
    role: Role
    password: str | None = Field(description="The password made for the user, shown this once; null if given.")


class TokenIn(Body):
    name: str = Field(max_length=64)
    role: Role = Field(strict=False)
    expires: str = Field(default="90d", description="Its lifetime: hours, days or weeks, e.g. 12h, 90d, 2w.")


class TokenOut(BaseModel):
    id: int
    name: str
    role: Role
    owner: str | None = Field(description="The user who made it; null when made from the command line.")
    created_at: datetime
    expires_at: datetime
    last_used_at: datetime | None = Field(description="Written at most once a minute.")
    revoked_at: datetime | None

    @classmethod
    def of(cls, token: ApiToken) -> TokenOut:
        return cls(id=token.id, name=token.name, role=token.role, owner=token.user.name if token.user else None,
                   created_at=token.created_at, expires_at=token.expires_at, last_used_at=token.last_used_at,
                   revoked_at=token.revoked_at)  # fmt: skip


class NewTokenOut(TokenOut):
    token: str = Field(description="Send it as `Authorization: Bearer <token>`; shown this once, stored hashed.")

"""Users and API tokens over the API (admins only, app.auth.policy), and who the caller is."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.core.errors import Conflict, FieldInvalid, TokenNotFound, UserNotFound
from app.core.models import User
from app.schemas.users import CallerOut, NewTokenOut, NewUserOut, TokenIn, TokenOut, UserIn, UserOut
from app.services import tokens, users
from app.web.api import UNREADABLE_BODY, documented
from app.web.deps import CallerDep, SessionDep
from app.web.params import TokenId, UserName

router = APIRouter(prefix="/api", tags=["users"])


@router.get("/me", response_model=CallerOut, summary="Who you are to this server")
def me(caller: CallerDep) -> CallerOut:
    return CallerOut(name=caller.name, role=caller.role, via=caller.via)


@router.get("/users", response_model=list[UserOut], summary="The users")
def list_users(db: SessionDep) -> list[User]:
    return list(users.list_users(db))


@router.post("/users", status_code=201, response_model=NewUserOut,
             responses={**documented(Conflict, FieldInvalid), **UNREADABLE_BODY},
             summary="Add a user (this turns authentication on)")  # fmt: skip
def add_user(body: UserIn, db: SessionDep, caller: CallerDep) -> NewUserOut:
    return users.add_user(db, name=body.name, role=body.role, password=body.password, actor=caller.name)


@router.delete("/users/{user}", status_code=204, responses=documented(UserNotFound, Conflict),
               summary="Remove a user, their logins and tokens")  # fmt: skip
def remove_user(user: UserName, db: SessionDep, caller: CallerDep) -> Response:
    users.remove_user(db, name=user, actor=caller.name)
    return Response(status_code=204)


@router.get("/tokens", response_model=list[TokenOut], summary="API tokens, with last use and expiry")
def list_tokens(db: SessionDep) -> list[TokenOut]:
    return [TokenOut.of(token) for token in tokens.list_tokens(db)]


@router.post("/tokens", status_code=201, response_model=NewTokenOut,
             responses={**documented(FieldInvalid, UserNotFound), **UNREADABLE_BODY},
             summary="Make an API token; its secret is answered this once")  # fmt: skip
def create_token(body: TokenIn, db: SessionDep, caller: CallerDep) -> NewTokenOut:
    made = tokens.create_token(db, name=body.name, role=body.role, expires=body.expires, owner=caller.user,
                               actor=caller.name)  # fmt: skip
    return NewTokenOut(**TokenOut.of(made.token).model_dump(), token=made.secret)


@router.delete("/tokens/{token_id}", response_model=TokenOut, responses=documented(TokenNotFound),
               summary="Revoke an API token")  # fmt: skip
def revoke_token(token_id: TokenId, db: SessionDep, caller: CallerDep) -> TokenOut:
    return TokenOut.of(tokens.revoke_token(db, token_id=token_id, actor=caller.name))

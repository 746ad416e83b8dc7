"""The REST API under /api: everything the pages do, as JSON, documented at /docs."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from app.auth.policy import is_public
from app.core.errors import NotAllowed, NotAuthenticated, RankboardError
from app.schemas.common import ErrorOut
from app.web.guard import SESSION_COOKIE


def documented(*errors: type[RankboardError]) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route that raises these domain errors: each status, `{"detail": str}`.

    A 422 is left to FastAPI, which documents its validation-error list for every route with parameters; app.main
    answers domain 422s in that same shape.
    """
    reasons: dict[int, list[str]] = {}
    for error in errors:
        reasons.setdefault(error.status_code, []).append((error.__doc__ or error.__name__).strip().split("\n")[0])
    return {
        status: {"model": ErrorOut, "description": " Or: ".join(texts)}
        for status, texts in sorted(reasons.items())
        if status != 422
    }


# FastAPI answers 400 itself for a body it cannot read as text (not UTF-8); JSON it cannot parse is a 422.
UNREADABLE_BODY: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "The body is not UTF-8 text."}
}


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that reads its body itself (so FastAPI does not document it): the model's
    JSON schema with its definitions written in place, since a `$ref` in the document would be read from its root."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            return inline(definitions[ref.rsplit("/", 1)[1]]) if ref else {k: inline(v) for k, v in node.items()}
        return [inline(item) for item in node] if isinstance(node, list) else node

    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline(schema)}}}}


def guarded() -> dict[int | str, dict[str, Any]]:
    """What app.web.guard may answer before any route runs, for the routes that need a caller."""
    return documented(NotAuthenticated, NotAllowed)


SECURITY_SCHEMES = {
    "apiToken": {"type": "http", "scheme": "bearer", "description": "An API token (`rankboard tokens create`), "
                 "needed once the server has a user; without one, whoever reaches it (loopback) may do everything."},
    "session": {"type": "apiKey", "in": "cookie", "name": SESSION_COOKIE, "description": "A logged-in browser's."},
    "runToken": {"type": "http", "scheme": "bearer", "description": "The run's own token: the launcher gives it to "
                 "its trainer (RANKBOARD_TOKEN); a process of a run launched elsewhere gets one when it joins."},
}  # fmt: skip
_PARAMETER = re.compile(r"\{[^}]+\}")


def with_security(document: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document with what each operation needs, as app.auth.policy decides it (the guard is middleware,
    which FastAPI does not see), so that a generated client sends a token: an API token or a session, the run's own
    token for a trainer's ingest, or nothing."""
    document.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
    for path, operations in document["paths"].items():
        concrete = _PARAMETER.sub("1", path)
        for method, operation in operations.items():
            if not is_public(method.upper(), concrete):
                operation["security"] = [{"apiToken": []}, {"session": []}]
            elif path.startswith("/api/runs/"):  # the ingest of metrics and dumps
                operation["security"] = [{"runToken": []}]
            else:
                operation["security"] = []
    return document

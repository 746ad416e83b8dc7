"""Domain errors, each with the HTTP status it becomes; `app.main` turns them into responses in one place."""

from __future__ import annotations


class RankboardError(Exception):
    """Something the user asked for cannot be done; the message says why in their words."""

    status_code = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RunNotFound(RankboardError):
    """No run has that id."""

    status_code = 404

    def __init__(self, run_id: int) -> None:
        super().__init__(f"run {run_id} does not exist")


class RunNotActive(RankboardError):
    """The run is in a state where this cannot happen (stopping a finished run, metrics for a finished run)."""

    status_code = 409


class InvalidToken(RankboardError):
    """The trainer's bearer token is missing or is not the one its run was launched with."""

    status_code = 401


class FieldInvalid(RankboardError):
    """One field of a request is wrong; reported like a validation error, naming the field (a parameter's name, or
    a body field's), and the message names it too, for pages."""

    status_code = 422

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class FormInvalid(RankboardError):
    """A submitted form has wrong fields: `errors` maps each field to what is wrong; `values` is what was sent."""

    status_code = 422

    def __init__(self, errors: dict[str, str], values: dict[str, str]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors = errors
        self.values = values


class PathTooLong(FieldInvalid):
    """A path longer than a file system takes: a name in it over 255 bytes, or over 4096 bytes in all."""


class PathOutsideRoot(RankboardError):
    """The path leads outside the shared folder (absolute, `..`, a link that leaves it), or holds NUL or `\\`."""

    status_code = 400


class PathNotFound(RankboardError):
    """No such file, folder, checkpoint or log."""

    status_code = 404


class NotACheckpoint(FieldInvalid):
    """A file that cannot be read as a checkpoint (corrupt, something else, too big or slow to load safely)."""

    def __init__(self, message: str, field: str = "path") -> None:
        super().__init__(field, message)


class MethodNotAllowed(RankboardError):
    """The path takes other methods; the response's Allow header lists them."""

    status_code = 405


class SchemaMismatch(RankboardError):
    """The database's schema is not the one this code was written for; raised at start-up, never per request."""

    status_code = 500


class SeriesNotFound(RankboardError):
    """The run has no metric of that key; the message lists those it has (a typo is the usual cause)."""

    status_code = 404

    def __init__(self, run_id: int, key: str, keys: list[str]) -> None:
        listed = ", ".join(keys[:30]) + (f" and {len(keys) - 30} more" if len(keys) > 30 else "")
        super().__init__(f"run {run_id} has no metric {key!r}; its metrics: {listed or 'none yet'}")


class NotAuthenticated(RankboardError):
    """No valid credentials: log in, or send `Authorization: Bearer <token>`."""

    status_code = 401


class NotAllowed(RankboardError):
    """The caller's role may not do this."""

    status_code = 403


class LoginThrottled(RankboardError):
    """Too many failed logins for this name or address: wait `retry_after` seconds."""

    status_code = 429

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many failed logins; try again in {retry_after} s")
        self.retry_after = retry_after


class UserNotFound(RankboardError):
    """No user has that name."""

    status_code = 404

    def __init__(self, name: str) -> None:
        super().__init__(f"no user is named {name!r}")


class TokenNotFound(RankboardError):
    """No API token has that id."""

    status_code = 404

    def __init__(self, token_id: int) -> None:
        super().__init__(f"API token {token_id} does not exist")


class Conflict(RankboardError):
    """The change would clash with what is stored: a user name taken, the last admin removed."""

    status_code = 409


class LimitNotFound(RankboardError):
    """No such user limit or group of the queue."""

    status_code = 404

"""A small client of Rankboard's REST API, for scripts, pipelines and notebooks; `rankboard runs ...` uses it too.

It needs only the standard library (pandas for `series_frame`, when installed), so that importing it pulls in none of
the server's packages, and a command built on it starts quickly.

    from rankboard.client import Client
    client = Client("http://127.0.0.1:8000")
    run = client.wait(client.create(name="sweep-1", epochs=1)["id"])
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from http.client import HTTPException, HTTPResponse
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"
FINAL = ("succeeded", "failed", "stopped", "lost")
SERIES_PAGE = 10_000  # the API's largest page of a series
UNANSWERED = (None, 502, 503, 504)  # no answer, or a proxy's while the server behind it restarts

# Named here, outside the class: inside it `list` is the method that lists runs.
Record = dict[str, Any]  # a run, a point, a checkpoint: the API's JSON object as it came
Records = list[Record]
Lines = list[str]


class NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an error, not followed: urllib would send the token on to wherever it points."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


OPENER = urllib.request.build_opener(NoRedirects)


class ClientError(Exception):
    """A request did not do what was asked; `message` says why in one line, `status` is the HTTP status (None: the
    server was not reached, or did not answer in time)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class WaitTimedOut(ClientError):
    """`wait` gave up: the run had not ended within its timeout."""


class Client:
    """Rankboard's REST API at `url`; `token` (an API token, `rbt_...`) is sent as `Authorization: Bearer`."""

    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def create(self, **options: Any) -> Record:
        """Creates a run with the New-run form's options (`name`, `epochs`, `script`...); it starts when it fits."""
        return self._json("POST", "/api/runs", body=options)

    def get(self, run_id: int) -> Record:
        """One run, with its lifecycle events."""
        return self._json("GET", f"/api/runs/{run_id}")

    def list(self, *, status: str | None = None, limit: int = 50, offset: int = 0, **view: str | None) -> Records:
        """Runs, newest first; `view`: the runs table's `q`, `filter`, `sort`, `columns` and `archived`."""
        return self.table(status=status, limit=limit, offset=offset, **view)["items"]

    def table(self, *, status: str | None = None, limit: int = 50, offset: int = 0, **view: str | None) -> Record:
        """A page of the runs table: `items`, `total`, and with `columns` each run's `values`."""
        query = {"status": status, "limit": limit, "offset": offset, **view}
        return self._json("GET", "/api/runs", query=query)

    def label(self, run_id: int, **labels: Any) -> Record:
        """Sets a run's `tags` (replacing them), `notes` or `archived`."""
        return self._json("PATCH", f"/api/runs/{run_id}", body=labels)

    def delete(self, run_id: int, *, files: bool = False, dry_run: bool = False) -> Record:
        """Deletes a finished run and its metrics; `files`: its own folders too; `dry_run`: only says what would go."""
        query = {"files": str(files).lower(), "dry_run": str(dry_run).lower()}
        return self._json("DELETE", f"/api/runs/{run_id}", query=query)

    def bulk(self, run_ids: Sequence[int], action: str, tag: str | None = None) -> Record:
        """`tag`, `untag`, `archive`, `unarchive` or `delete` many runs."""
        return self._json("POST", "/api/runs/bulk", body={"runs": list(run_ids), "action": action, "tag": tag})

    def stop(self, run_id: int) -> Record:
        """Asks a run to stop gracefully; it ends `stopped`."""
        return self._json("POST", f"/api/runs/{run_id}/stop")

    def resume(self, run_id: int) -> Record:
        """Resumes a stopped, failed or lost run from its newest snapshot, as the same run."""
        return self._json("POST", f"/api/runs/{run_id}/resume")

    def queue(self) -> Record:
        """This host's queue in order: each run's priority, owner, what it waits for, when it may start."""
        return self._json("GET", "/api/queue")

    def set_priority(self, run_id: int, priority: int | str) -> Record:
        """A queued run's new priority: low, normal, high or a number (an operator up to the admin's limit)."""
        return self._json("POST", f"/api/runs/{run_id}/priority", body={"priority": priority})

    def limits(self) -> Record:
        """The limits of users and groups (an admin's)."""
        return self._json("GET", "/api/queue/limits")

    def set_limit(self, user: str, *, max_slots: int | None = None, max_runs: int | None = None) -> Record:
        """A user's limit of GPUs (or CPU slots) and runs at once; `*`: every user without one of their own."""
        body = {"max_slots": max_slots, "max_runs": max_runs}
        return self._json("PUT", f"/api/queue/limits/users/{urllib.parse.quote(user, safe='')}", body=body)

    def remove_limit(self, user: str) -> Record:
        return self._json("DELETE", f"/api/queue/limits/users/{urllib.parse.quote(user, safe='')}")

    def save_group(self, name: str, *, members: Sequence[str], max_slots: int | None = None,
                   max_runs: int | None = None) -> Record:  # fmt: skip
        """Makes a group of users, or replaces its members and its limit (all of theirs counted together)."""
        body = {"members": list(members), "max_slots": max_slots, "max_runs": max_runs}
        return self._json("PUT", f"/api/queue/limits/groups/{urllib.parse.quote(name, safe='')}", body=body)

    def remove_group(self, name: str) -> Record:
        return self._json("DELETE", f"/api/queue/limits/groups/{urllib.parse.quote(name, safe='')}")

    def usage(self, *, by: str = "user", start: str | None = None, end: str | None = None) -> Record:
        """GPU-hours, kWh, cost, goodput and runs by user, tag or launcher over [start, end), and per ISO week."""
        return self._json("GET", "/api/usage", query={"by": by, "from": start, "to": end})

    def wait(
        self,
        run_id: int,
        timeout: float | None = None,
        *,
        interval: float = 1.0,
        patience: float = 120.0,
        on_poll: Callable[[Record], None] | None = None,
    ) -> Record:
        """The run once it has ended (succeeded, failed, stopped or lost); `on_poll` sees it at each look. A server
        that does not answer for less than `patience` seconds (a restart, an upgrade) is waited for."""
        deadline = None if timeout is None else time.monotonic() + timeout
        silent_since: float | None = None
        while True:
            try:
                run = self.get(run_id)
            except ClientError as error:
                silent_since = silent_since or time.monotonic()
                if error.status not in UNANSWERED or time.monotonic() - silent_since > patience:
                    raise
                time.sleep(interval)
                continue
            silent_since = None
            if on_poll is not None:
                on_poll(run)
            if run["status"] in FINAL:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimedOut(f"run {run_id} is still {run['status']} after {timeout:g} s")
            time.sleep(interval)

    def series(self, run_id: int, key: str, *, start_step: int = 0) -> Records:
        """Every point of a metric (`step`, `rank`, `value`, `time`), page after page."""
        points: Records = []
        query: Record = {"start_step": start_step, "start_rank": 0, "limit": SERIES_PAGE}
        path = f"/api/runs/{run_id}/metrics/{urllib.parse.quote(key)}"
        while True:
            page = self._json("GET", path, query=query)
            points.extend(page["points"])
            if page["next_step"] is None:
                return points
            query |= {"start_step": page["next_step"], "start_rank": page["next_rank"] or 0}

    def series_frame(self, run_id: int, key: str) -> Any:
        """The series as a pandas DataFrame (columns step, rank, value, time); needs pandas."""
        try:
            import pandas
        except ImportError:
            raise ClientError("series_frame needs pandas (pip install pandas); series() gives a list") from None
        return pandas.DataFrame(self.series(run_id, key), columns=["step", "rank", "value", "time"])

    def metric_keys(self, run_id: int) -> Lines:
        """The metric keys a run has reported."""
        return self._json("GET", f"/api/runs/{run_id}/metrics")

    def logs(self, run_id: int, *, rank: int | str = 0, stream: str = "stdout", lines: int = 200) -> Lines:
        """The last lines of one rank's stdout or stderr (`rank="launcher"`: torchrun's own output)."""
        return self._json("GET", f"/api/runs/{run_id}/logs/{rank}/{stream}", query={"lines": lines})["lines"]

    def follow_logs(self, run_id: int, *, rank: int | str = 0, stream: str = "stdout") -> Iterator[str]:
        """The log's last lines, then each new one as it is written, until the run has ended and all was read."""
        self.get(run_id)  # unknown run, bad token: a clear error before the stream
        query = urllib.parse.urlencode({"rank": rank, "stream": stream})
        with self._open("GET", f"/runs/{run_id}/logs/stream?{query}", timeout=None) as answer:
            try:
                for event, data in _server_events(answer):
                    if event == "reset":
                        yield from json.loads(data)["lines"]
                    elif event == "lines":
                        yield from json.loads(data)
                    elif event == "end":
                        return
            except (OSError, HTTPException) as error:
                raise ClientError(f"the log stream from {self.url} broke off: {error}") from None
        raise ClientError(f"the log stream from {self.url} ended before run {run_id} did")

    def checkpoints(self, run_id: int) -> Records:
        """A run's checkpoints: name, path, step, size, metrics, latest, best."""
        return self._json("GET", f"/api/runs/{run_id}/checkpoints")

    def download(self, run_id: int, checkpoint: str, to: str | Path | None = None) -> Path:
        """Streams a checkpoint to `to` (default: its own name, here); written whole or not at all."""
        found = self._json("GET", f"/api/runs/{run_id}/checkpoints/{urllib.parse.quote(checkpoint)}")
        target = Path(to) if to is not None else Path(Path(found["path"]).name)
        partial = target.with_name(f".{target.name}.part")
        query = urllib.parse.urlencode({"path": found["path"]})
        try:
            file = partial.open("wb")  # a folder that is not there, or not writable: said before any download
        except OSError as error:
            raise ClientError(f"cannot write {target}: {error.strerror}") from None
        with file:
            try:
                with self._open("GET", f"/api/files/download?{query}", timeout=self.timeout) as answer:
                    shutil.copyfileobj(answer, file, 1 << 20)
            except (OSError, HTTPException) as error:
                partial.unlink()
                raise ClientError(f"the download of {checkpoint} broke off: {error}") from None
            except BaseException:
                partial.unlink()
                raise
        os.replace(partial, target)
        return target

    def run_options(self) -> Record:
        """The JSON schema of a new run's options (RunCreate), from the server's OpenAPI document."""
        document = self._json("GET", "/openapi.json")
        return document["components"]["schemas"]["RunCreate"]

    def _json(self, method: str, path: str, *, query: Record | None = None, body: Any = None) -> Any:
        if query:
            path += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        with self._open(method, path, body=body, timeout=self.timeout) as answer:
            try:
                return json.load(answer)
            except (OSError, HTTPException) as error:
                raise ClientError(f"the answer from {self.url} broke off: {error}") from None
            except ValueError:
                raise ClientError(f"{self.url}{path} did not answer JSON: is it a Rankboard server?") from None

    def _open(self, method: str, path: str, *, body: Any = None, timeout: float | None) -> HTTPResponse:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            return OPENER.open(request, timeout=timeout)
        except urllib.error.HTTPError as error:
            with error:
                if 300 <= error.code < 400:
                    moved = f"{self.url}{path.split('?')[0]} redirects to {error.headers.get('Location')}"
                    raise ClientError(f"{error.code}: {moved}; give that URL", error.code) from None
                raise ClientError(_error_message(error.code, error.read()), error.code) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise ClientError(f"cannot reach {self.url}: {reason}") from None


def _error_message(status: int, body: bytes) -> str:
    """The server's `detail` in one line: a 422 names each wrong field and what is wrong with it."""
    try:
        detail = json.loads(body)["detail"]
    except (ValueError, KeyError, TypeError):
        detail = body.decode(errors="replace").strip()[:200] or "no detail"
    if isinstance(detail, list):
        detail = "; ".join(_field_error(error) for error in detail)
    hint = " (an API token is needed: --token, RANKBOARD_TOKEN, or Client(token=...))" if status == 401 else ""
    return f"{status}: {' '.join(str(detail).split())}{hint}"


def _field_error(error: Any) -> str:
    if not isinstance(error, dict):
        return str(error)
    where = [str(part) for part in error.get("loc", []) if part not in ("body", "query", "path")]
    return f"{'.'.join(where) or 'request'}: {error.get('msg', 'invalid')}"


def _server_events(answer: HTTPResponse) -> Iterator[tuple[str, str]]:
    """(event, data) of a text/event-stream, one per blank-line-ended message."""
    event, data = "message", Lines()
    for raw in answer:
        line = raw.decode(errors="replace").rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data)
            elif event == "end":
                yield event, ""
            event, data = "message", Lines()
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))

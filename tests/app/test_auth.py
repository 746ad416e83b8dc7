"""Who may do what: with a user configured, every route (read from the app's own router table) refuses a caller
without credentials, every change is refused to a viewer, every form refuses a post from another site or without
the session's CSRF token; with none, the server still checks Host and Origin. Sessions, API tokens, the ingest token,
the audit trail and the proxy header are checked as a user meets them, through the real app over a SQLite file."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from pydantic import SecretStr

from app.auth.passwords import sha256 as hash_token
from app.core.models import Role, Run, RunStatus
from app.core.settings import Settings
from app.main import create_app
from app.services import tokens, users
from tests.app.conftest import batch

ADMIN_PASSWORD = "admin-pass-0451"
PASSWORDS = {"olga": "operator-pass-9", "vera": "viewer-pass-77"}
INGEST_TOKEN = "ingest-t0ken-of-run-1"
EVIL = "http://evil.example"
PUBLIC = {("GET", "/login"), ("POST", "/login"), ("GET", "/api/health"), ("POST", "/api/runs/{run_id}/metrics"),
          ("POST", "/api/runs/{run_id}/dumps/{request}")}  # fmt: skip
UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}


@dataclass
class Guarded:
    """A server with authentication on: an admin (from RANKBOARD_ADMIN_PASSWORD), an operator, a viewer, a bearer
    token for each role, and a queued run whose ingest token is INGEST_TOKEN."""

    app: FastAPI
    client: TestClient
    settings: Settings
    bearer: dict[Role, str]
    run_id: int

    def headers(self, role: Role) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.bearer[role]}"}


def make_settings(root: Path, **extra: Any) -> Settings:
    return Settings(data_dir=root / "data", shared_dir=root / "shared", supervise_interval_s=3600, slots=2, **extra)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    settings = make_settings(tmp_path_factory.mktemp("guarded"), admin_password=SecretStr(ADMIN_PASSWORD))
    with TestClient(create_app(settings)) as client:
        app: Any = client.app
        bearer = {}
        with app.state.sessions() as db:
            users.add_user(db, name="olga", role=Role.operator, password=PASSWORDS["olga"], actor="test")
            users.add_user(db, name="vera", role=Role.viewer, password=PASSWORDS["vera"], actor="test")
            for role in Role:
                bearer[role] = tokens.create_token(db, name=f"ci-{role.value}", role=role, expires="1d",
                                                   owner="admin", actor="test").secret  # fmt: skip
        run_id = client.post(
            "/api/runs", json={"name": "guarded"}, headers={"Authorization": f"Bearer {bearer[Role.operator]}"}
        ).json()["id"]
        with app.state.sessions() as db, db.begin():
            run = db.get(Run, run_id)
            run.status, run.token_hash = RunStatus.running, hash_token(INGEST_TOKEN)
        yield Guarded(app, client, settings, bearer, run_id)


def log_in(app: FastAPI, name: str, password: str, base_url: str = "http://testserver") -> tuple[TestClient, str]:
    """A browser's client logged in as `name`, and the CSRF token its pages carry."""
    browser = TestClient(app, base_url=base_url)
    answer = browser.post("/login", data={"name": name, "password": password, "next": "/"}, follow_redirects=False)
    assert answer.status_code == 303, answer.text[:300]
    found = re.search(r'data-csrf="([0-9a-f]{64})"', browser.get("/").text)
    assert found is not None
    return browser, found[1]


# --- the router table -------------------------------------------------------------------------------------------


def routes(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, path) the app answers: pages, fragments, streams, downloads, the API, FastAPI's own."""
    found = {
        (method, route.path_format)
        for route in iter_route_contexts(app.routes)
        if route.path_format is not None
        for method in (route.methods or ())
        if method != "HEAD"
    }
    return sorted(found)


def url(path: str, run_id: int) -> str:
    fill = {"run_id": run_id, "key": "loss", "name": "step-00000001.pt", "rank": "0", "stream": "stdout",
            "user": "nobody", "group": "nobody", "token_id": 99999, "request": 1, "table": "points"}  # fmt: skip
    return path.format(**fill)


def send(client: TestClient, method: str, path: str, **kwargs: Any) -> Any:
    """One request; of a stream, only its answer's status and headers."""
    with client.stream(method, path, **kwargs) as answer:
        if not answer.headers.get("content-type", "").startswith("text/event-stream"):
            answer.read()
        return answer


def test_the_router_table_is_read_whole(guarded: Guarded) -> None:
    table = routes(guarded.app)
    assert len(table) > 40
    assert {("GET", "/runs/{run_id}/stream"), ("GET", "/api/files/download"), ("GET", "/openapi.json"),
            ("DELETE", "/runs/{run_id}/checkpoints"), ("POST", "/tokens"),
            ("DELETE", "/api/users/{user}")} <= set(table)  # fmt: skip


def test_every_route_refuses_a_caller_without_credentials(guarded: Guarded) -> None:
    stranger = TestClient(guarded.app)
    for method, path in routes(guarded.app):
        if (method, path) in PUBLIC:
            continue
        answer = send(stranger, method, url(path, guarded.run_id))
        assert answer.status_code == 401, (method, path, answer.status_code)
        assert answer.headers["www-authenticate"] == "Bearer"
        if method == "GET" and not path.startswith(("/api", "/openapi")):  # a browser is sent to log in, and back
            page = send(stranger, method, url(path, guarded.run_id), headers={"Accept": "text/html"},
                        follow_redirects=False)  # fmt: skip
            assert page.status_code == 303 and page.headers["location"].startswith("/login?next=%2F"), (path, page)
    assert (
        guarded.client.get(f"/api/runs/{guarded.run_id}", headers=guarded.headers(Role.viewer)).json()["status"]
        == "running"
    )


def test_what_needs_no_login(guarded: Guarded) -> None:
    stranger = TestClient(guarded.app)
    assert stranger.get("/api/health").json()["status"] == "ok"
    assert "Log in" in stranger.get("/login").text
    assert stranger.get("/static/app.css").status_code == 200
    assert stranger.get("/static/vendor/htmx-2.0.11.min.js").status_code == 200


def test_every_change_is_refused_to_a_viewer_and_every_read_allowed(guarded: Guarded) -> None:
    viewer = TestClient(guarded.app, headers=guarded.headers(Role.viewer))
    browser, csrf = log_in(guarded.app, "vera", PASSWORDS["vera"])
    for method, path in routes(guarded.app):
        if (method, path) in PUBLIC or path == "/logout":
            continue
        admin_only = re.match(r"^(/api)?/(users|tokens|alerts|queue/limits)", path) is not None
        answer = send(viewer, method, url(path, guarded.run_id))
        if method in UNSAFE or admin_only:
            assert answer.status_code == 403, (method, path, answer.status_code)
            assert "admin (token ci-viewer) has the role viewer" in answer.text
            page = send(browser, method, url(path, guarded.run_id), headers={"X-CSRF-Token": csrf})
            assert page.status_code == 403 and "vera has the role viewer" in page.text, (method, path)
        else:
            assert answer.status_code not in (401, 403), (method, path, answer.status_code, answer.text[:200])
    assert (
        guarded.client.get(f"/api/runs/{guarded.run_id}", headers=guarded.headers(Role.viewer)).json()["status"]
        == "running"
    )


def test_an_operator_may_change_runs_but_not_users_or_tokens(guarded: Guarded) -> None:
    operator = TestClient(guarded.app, headers=guarded.headers(Role.operator))
    for method, path in routes(guarded.app):
        if method not in UNSAFE or (method, path) in PUBLIC or path == "/logout":
            continue
        answer = send(operator, method, url(path, 99999))  # no such run: a 404 once the guard let it through
        if re.match(r"^(/api)?/(users|tokens|alerts|queue/limits)", path):
            assert answer.status_code == 403, (method, path)
        else:
            assert answer.status_code not in (401, 403), (method, path, answer.status_code, answer.text[:200])


def test_a_token_acts_with_no_more_than_its_owners_role(guarded: Guarded) -> None:
    with guarded.app.state.sessions() as db:  # type: ignore[attr-defined]
        secret = tokens.create_token(db, name="wide", role=Role.admin, expires="1h", owner="vera", actor="t").secret
    answer = guarded.client.get("/api/me", headers={"Authorization": f"Bearer {secret}"})
    assert answer.json() == {"name": "vera (token wide)", "role": "viewer", "via": "token"}


# --- cross-site requests and CSRF --------------------------------------------------------------------------------


def form_routes(app: FastAPI) -> list[tuple[str, str]]:
    return [(m, p) for m, p in routes(app) if m in UNSAFE and not p.startswith("/api")]


def test_every_form_route_refuses_a_post_from_another_site_or_without_the_csrf_token(guarded: Guarded) -> None:
    browser, csrf = log_in(guarded.app, "admin", ADMIN_PASSWORD)
    checked = 0
    for method, path in form_routes(guarded.app):
        target = url(path, guarded.run_id)
        foreign = send(browser, method, target, headers={"X-CSRF-Token": csrf, "Origin": EVIL})
        assert foreign.status_code == 403 and "another site" in foreign.text, (method, path, foreign.status_code)
        by_referer = send(browser, method, target, headers={"X-CSRF-Token": csrf, "Referer": f"{EVIL}/page"})
        assert by_referer.status_code == 403, (method, path)
        if path == "/login":
            continue  # no session yet, so no token: Origin is its guard
        without = send(browser, method, target)
        assert without.status_code == 403 and "CSRF token" in without.text, (method, path, without.status_code)
        wrong = send(browser, method, target, data={"csrf_token": "0" * 64})
        assert wrong.status_code == 403, (method, path)
        checked += 1
    assert checked >= 8
    run = guarded.client.get(f"/api/runs/{guarded.run_id}", headers=guarded.headers(Role.viewer)).json()
    assert run["status"] == "running" and [e["action"] for e in run["audit"]] == ["created"]


def test_a_logged_in_page_changes_with_its_token_as_a_header_or_a_hidden_field(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, admin_password=SecretStr(ADMIN_PASSWORD))
    app = create_app(settings)
    browser, csrf = log_in(app, "admin", ADMIN_PASSWORD)
    page = browser.get("/runs/new").text
    assert f'name="csrf_token" value="{csrf}"' in page and f'hx-headers=\'{{"X-CSRF-Token": "{csrf}"}}\'' in page
    created = browser.post("/runs", data={"name": "from the form", "csrf_token": csrf},
                           headers={"Origin": "http://testserver"}, follow_redirects=False)  # fmt: skip
    assert created.status_code == 303
    run_id = int(created.headers["location"].rsplit("/", 1)[1])
    stopped = browser.post(f"/runs/{run_id}/stop", headers={"X-CSRF-Token": csrf, "HX-Request": "true"})
    assert stopped.status_code == 200 and ">stopped</span>" in stopped.text
    assert "stopped by <strong>admin</strong>" in stopped.text and "created by <strong>admin</strong>" in stopped.text


def test_without_users_the_dashboard_is_open_on_loopback_but_refuses_other_sites(client: TestClient) -> None:
    assert client.get("/", headers={"Host": "127.0.0.1:8000"}).status_code == 200
    assert client.get("/api/runs", headers={"Host": "localhost:8000"}).status_code == 200
    assert client.get("/api/runs", headers={"Host": "[::1]:8000"}).status_code == 200
    for headers in ({"Origin": EVIL}, {"Referer": f"{EVIL}/x"}, {"Origin": "null"},
                    {"Origin": "http://127.0.0.1:9999", "Host": "127.0.0.1:8000"}):  # fmt: skip
        refused = client.post("/runs", data={"name": "forged"}, headers=headers, follow_redirects=False)
        assert refused.status_code == 403, headers
        assert client.post("/api/runs", json={"name": "forged"}, headers=headers).status_code == 403
    assert client.get("/api/runs").json()["total"] == 0
    same_site = {"Origin": "http://127.0.0.1:8000", "Host": "127.0.0.1:8000"}
    assert client.post("/runs", data={"name": "mine"}, headers=same_site, follow_redirects=False).status_code == 303
    assert client.post("/api/runs", json={"name": "by curl"}).status_code == 201  # no Origin: not a browser page
    run = client.get("/api/runs").json()["items"][0]
    assert run["created_by"] == "local"


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example", "10.0.0.5"])
def test_a_wrong_host_gets_400(client: TestClient, host: str) -> None:
    for path in ("/", "/api/runs", "/static/app.css", "/api/health"):
        answer = client.get(path, headers={"Host": host})
        assert answer.status_code == 400 and "RANKBOARD_ALLOWED_HOSTS" in answer.text, (host, path)


def test_an_extra_host_name_is_allowed_by_the_setting(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path, allowed_hosts=["dash.example.org"]))
    assert TestClient(app).get("/api/health", headers={"Host": "dash.example.org:8000"}).status_code == 200
    assert TestClient(app).get("/api/health", headers={"Host": "other.example.org"}).status_code == 400
    # Behind a proxy that rewrites Host, a page of the listed name may still post; another site may not.
    proxied = {"Host": "127.0.0.1:8000", "Origin": "https://dash.example.org"}
    assert TestClient(app).post("/api/runs", json={"name": "via proxy"}, headers=proxied).status_code == 201
    foreign = {"Host": "127.0.0.1:8000", "Origin": "https://dash.example.org.evil.example"}
    assert TestClient(app).post("/api/runs", json={"name": "forged"}, headers=foreign).status_code == 403


# --- sessions -----------------------------------------------------------------------------------------------------


def session_cookie(answer: Any) -> str:
    return next(
        value for name, value in answer.headers.multi_items() if name == "set-cookie" and "rankboard_session" in value
    )


def test_the_session_cookie_is_httponly_lax_and_secure_over_https(guarded: Guarded) -> None:
    for base, secure in (("http://testserver", False), ("https://testserver", True)):
        browser = TestClient(guarded.app, base_url=base)
        answer = browser.post("/login", data={"name": "vera", "password": PASSWORDS["vera"]}, follow_redirects=False)
        cookie = session_cookie(answer).lower()
        assert "httponly" in cookie and "samesite=lax" in cookie and "path=/" in cookie
        assert ("; secure" in cookie) == secure


def test_a_login_gets_a_new_session_and_logging_out_ends_it(guarded: Guarded) -> None:
    browser, csrf = log_in(guarded.app, "olga", PASSWORDS["olga"])
    first = browser.cookies["rankboard_session"]
    again = browser.post("/login", data={"name": "olga", "password": PASSWORDS["olga"]}, follow_redirects=False)
    second = browser.cookies["rankboard_session"]
    assert again.status_code == 303 and second != first
    old = TestClient(guarded.app, cookies={"rankboard_session": first})
    assert old.get("/api/me").status_code == 401  # rotated: the id from before the login no longer works
    csrf = re.search(r'data-csrf="([0-9a-f]{64})"', browser.get("/").text)[1]  # type: ignore[index]
    assert browser.get("/api/me").json()["name"] == "olga"
    out = browser.post("/logout", headers={"X-CSRF-Token": csrf}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert 'rankboard_session=""' in session_cookie(out) or "max-age=0" in session_cookie(out).lower()
    assert TestClient(guarded.app, cookies={"rankboard_session": second}).get("/api/me").status_code == 401


def test_a_wrong_password_is_refused_on_the_login_page(guarded: Guarded) -> None:
    answer = TestClient(guarded.app).post("/login", data={"name": "vera", "password": "guess", "next": "/host"})
    assert answer.status_code == 401 and "wrong user name or password" in answer.text
    assert 'value="/host"' in answer.text and "rankboard_session" not in answer.headers.get("set-cookie", "")


def test_a_session_ends_when_idle_but_lasts_while_used(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path, admin_password=SecretStr(ADMIN_PASSWORD), session_idle_s=1.0))
    browser, _csrf = log_in(app, "admin", ADMIN_PASSWORD)
    for _ in range(6):  # used every 0.3 s for 1.8 s: past the idle time since login, never idle that long
        time.sleep(0.3)
        assert browser.get("/api/me").status_code == 200
    time.sleep(1.3)
    assert browser.get("/api/me").status_code == 401
    assert browser.get("/", headers={"Accept": "text/html"}, follow_redirects=False).status_code == 303


def test_a_session_ends_at_its_absolute_expiry_however_used(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path, admin_password=SecretStr(ADMIN_PASSWORD), session_max_s=2.0))
    browser, _csrf = log_in(app, "admin", ADMIN_PASSWORD)
    fresh = browser.get("/api/me").status_code
    answers, until = [], time.monotonic() + 2.5  # used every 0.3 s all along: that does not keep it alive
    while time.monotonic() < until:
        time.sleep(0.3)
        answers.append(browser.get("/api/me").status_code)
    assert fresh == 200 and answers[-1] == 401


def test_failed_logins_are_rate_limited(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path, admin_password=SecretStr(ADMIN_PASSWORD), login_attempts=3))
    browser = TestClient(app)
    for _ in range(3):
        assert browser.post("/login", data={"name": "admin", "password": "nope-nope"}).status_code == 401
    throttled = browser.post("/login", data={"name": "admin", "password": ADMIN_PASSWORD}, follow_redirects=False)
    assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) > 0
    assert "too many failed logins" in throttled.text and "rankboard_session" not in browser.cookies


def test_failed_logins_count_across_the_server_processes_on_one_database(tmp_path: Path) -> None:
    """As two workers of `serve --workers 2`: the failures one process saw hold the login back on the other, for
    that name and for that address; another name from another address still logs in."""
    settings = make_settings(tmp_path, admin_password=SecretStr(ADMIN_PASSWORD), login_attempts=2)
    first, second = TestClient(create_app(settings)), TestClient(create_app(settings))
    with first.app.state.sessions() as db:  # type: ignore[attr-defined]
        users.add_user(db, name="olga", role=Role.operator, password=PASSWORDS["olga"], actor="test")
    for _ in range(2):
        assert first.post("/login", data={"name": "admin", "password": "nope-nope"}).status_code == 401
    throttled = second.post("/login", data={"name": "admin", "password": ADMIN_PASSWORD}, follow_redirects=False)
    assert throttled.status_code == 429 and "rankboard_session" not in second.cookies
    elsewhere = TestClient(second.app, client=("10.0.0.7", 50000))
    assert elsewhere.post("/login", data={"name": "olga", "password": PASSWORDS["olga"]},
                          follow_redirects=False).status_code == 303  # fmt: skip


# --- API tokens -----------------------------------------------------------------------------------------------------


def test_a_token_is_shown_once_listed_with_its_use_and_revocable(guarded: Guarded) -> None:
    admin = TestClient(guarded.app, headers=guarded.headers(Role.admin))
    made = admin.post("/api/tokens", json={"name": "nightly", "role": "operator", "expires": "90d"})
    assert made.status_code == 201 and made.json()["token"].startswith("rbt_")
    secret, token_id = made.json()["token"], made.json()["id"]
    listed = {t["id"]: t for t in admin.get("/api/tokens").json()}
    assert "token" not in listed[token_id] and listed[token_id]["last_used_at"] is None
    assert listed[token_id]["owner"] == "admin"
    mine = TestClient(guarded.app, headers={"Authorization": f"Bearer {secret}"})
    assert mine.get("/api/me").json() == {"name": "admin (token nightly)", "role": "operator", "via": "token"}
    listed = {t["id"]: t for t in admin.get("/api/tokens").json()}
    assert (
        listed[token_id]["last_used_at"] is not None and listed[token_id]["expires_at"] > listed[token_id]["created_at"]
    )
    assert admin.delete(f"/api/tokens/{token_id}").json()["revoked_at"] is not None
    assert mine.get("/api/me").status_code == 401
    page = TestClient(guarded.app, headers=guarded.headers(Role.admin)).get("/tokens").text
    assert "nightly" in page and "revoked" in page and secret not in page


def test_an_expired_token_is_refused(guarded: Guarded) -> None:
    from app.core.models import ApiToken, utcnow

    with guarded.app.state.sessions() as db:  # type: ignore[attr-defined]
        made = tokens.create_token(db, name="old", role=Role.viewer, expires="1h", owner=None, actor="t")
        with db.begin():
            db.get(ApiToken, made.token.id).expires_at = utcnow()  # type: ignore[union-attr]
    assert guarded.client.get("/api/me", headers={"Authorization": f"Bearer {made.secret}"}).status_code == 401


@pytest.mark.parametrize("expires", ["0d", "90", "forever", "99999w"])
def test_a_token_expiry_must_be_a_span(guarded: Guarded, expires: str) -> None:
    answer = guarded.client.post("/api/tokens", json={"name": "x", "role": "viewer", "expires": expires},
                                 headers=guarded.headers(Role.admin))  # fmt: skip
    assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["body", "expires"]


# --- the per-run ingest token ---------------------------------------------------------------------------------------


def test_the_ingest_token_posts_its_runs_metrics_and_nothing_else(guarded: Guarded) -> None:
    trainer = TestClient(guarded.app, headers={"Authorization": f"Bearer {INGEST_TOKEN}"})
    run_id = guarded.run_id
    assert trainer.post(f"/api/runs/{run_id}/metrics", json=batch(1, 2)).json()["stored"] == 2
    other = guarded.client.post("/api/runs", json={"name": "other"}, headers=guarded.headers(Role.operator)).json()[
        "id"
    ]
    with guarded.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, other).status = RunStatus.running  # type: ignore[union-attr]
    assert trainer.post(f"/api/runs/{other}/metrics", json=batch(1)).status_code == 401
    for method, path in (("GET", f"/api/runs/{run_id}"), ("GET", "/api/runs"), ("POST", f"/api/runs/{run_id}/stop"),
                         ("GET", f"/api/runs/{run_id}/metrics/loss"), ("GET", "/api/files"), ("GET", "/")):  # fmt: skip
        assert trainer.request(method, path).status_code == 401, path
    with guarded.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, run_id).status = RunStatus.succeeded  # type: ignore[union-attr]  # as the supervisor ends it
    ended = trainer.post(f"/api/runs/{run_id}/metrics", json=batch(3))
    assert ended.status_code == 409 and "takes no more metrics" in ended.json()["detail"]
    with guarded.app.state.sessions() as db, db.begin():  # type: ignore[attr-defined]
        db.get(Run, run_id).status = RunStatus.running  # type: ignore[union-attr]


# --- the audit trail, the headers, the proxy -------------------------------------------------------------------------


def test_the_audit_trail_says_who_did_what_on_the_run_page_and_in_the_api(guarded: Guarded) -> None:
    operator = TestClient(guarded.app, headers=guarded.headers(Role.operator))
    run_id = operator.post("/api/runs", json={"name": "audited"}).json()["id"]
    browser, csrf = log_in(guarded.app, "olga", PASSWORDS["olga"])
    assert (
        browser.post(f"/runs/{run_id}/stop", headers={"X-CSRF-Token": csrf}, follow_redirects=False).status_code == 303
    )
    run = operator.get(f"/api/runs/{run_id}").json()
    assert run["created_by"] == "admin (token ci-operator)"
    assert [(a["action"], a["actor"]) for a in run["audit"]] == [
        ("created", "admin (token ci-operator)"),
        ("stopped", "olga"),
    ]
    page = browser.get(f"/runs/{run_id}").text
    assert (
        "created by <strong>admin (token ci-operator)</strong>" in page and "stopped by <strong>olga</strong>" in page
    )


def test_every_answer_carries_the_security_headers(guarded: Guarded) -> None:
    admin = TestClient(guarded.app, headers=guarded.headers(Role.admin))
    for path in ("/", "/docs", "/api/runs", "/static/app.css", "/nowhere", "/login", f"/runs/{guarded.run_id}"):
        for client in (admin, TestClient(guarded.app)):
            headers = client.get(path).headers
            assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY", path
            csp = headers["content-security-policy"]
            assert "script-src 'self';" in csp and "style-src 'self';" in csp and "frame-ancestors 'none'" in csp


def test_no_page_has_an_inline_script_or_style(guarded: Guarded) -> None:
    admin = TestClient(guarded.app, headers=guarded.headers(Role.admin))
    for path in (
        "/",
        "/runs/new",
        f"/runs/{guarded.run_id}",
        "/host",
        "/files",
        "/docs",
        "/users",
        "/tokens",
        "/login",
    ):
        html = admin.get(path).text
        assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) == [], path
        assert "<style" not in html and " style=" not in html, path


def test_a_proxy_header_is_believed_only_from_the_trusted_proxy(tmp_path: Path) -> None:
    trusted = create_app(make_settings(tmp_path / "a", trusted_proxy=["testclient"]))  # TestClient's address
    assert TestClient(trusted).get("/api/me", headers={"X-Forwarded-User": "carol"}).json() == {
        "name": "carol", "role": "viewer", "via": "proxy"}  # fmt: skip
    assert TestClient(trusted).get("/api/me", headers={"Remote-User": "dan"}).json()["name"] == "dan"
    assert TestClient(trusted).get("/api/me").status_code == 401
    elsewhere = create_app(make_settings(tmp_path / "b", trusted_proxy=["10.1.2.3"],
                                         admin_password=SecretStr(ADMIN_PASSWORD)))  # fmt: skip
    assert TestClient(elsewhere).get("/api/me", headers={"X-Forwarded-User": "admin"}).status_code == 401


def test_streams_and_downloads_work_for_a_logged_in_browser(guarded: Guarded) -> None:
    browser, _csrf = log_in(guarded.app, "vera", PASSWORDS["vera"])
    folder = guarded.settings.shared / "datasets"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notes.txt").write_text("shared notes\n")
    stream = send(browser, "GET", f"/runs/{guarded.run_id}/stream")
    assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
    logs = send(browser, "GET", f"/runs/{guarded.run_id}/logs/stream")
    assert logs.status_code == 200 and logs.headers["content-type"].startswith("text/event-stream")
    download = browser.get("/api/files/download", params={"path": "datasets/notes.txt"})
    assert download.status_code == 200 and download.text == "shared notes\n"
    assert TestClient(guarded.app).get("/api/files/download", params={"path": "datasets/notes.txt"}).status_code == 401


def test_a_malformed_csrf_token_is_refused_not_a_crash(guarded: Guarded) -> None:
    browser, _csrf = log_in(guarded.app, "olga", PASSWORDS["olga"])
    for sent in ("é" * 64, "", "x"):
        answer = browser.post(f"/runs/{guarded.run_id}/stop", headers={"X-CSRF-Token": sent.encode()})
        assert answer.status_code == 403, sent

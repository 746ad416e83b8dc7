"""The guard in front of every request: Host allow-list, same-site Origin for changes, the caller and the role the
request needs, the session's CSRF token, and the security headers of every response.

A plain ASGI middleware rather than a route dependency, so that nothing escapes it: FastAPI's own /openapi.json,
the static files, the streams and any route added later all pass through it before they run.
"""

from __future__ import annotations

import hmac
import socket
import time
from collections.abc import Callable
from urllib.parse import parse_qs, quote, urlsplit

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response
from sqlalchemy.orm import Session, sessionmaker
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.auth.policy import LOCAL, UNSAFE_METHODS, Caller, is_public, needed_role
from app.core.errors import NotAllowed, NotAuthenticated, RankboardError
from app.core.settings import Settings
from app.services import users

SESSION_COOKIE = "rankboard_session"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
RECHECK_S = 1.0  # while no user exists, how often to look again (a user added from the CLI turns auth on)
MAX_FORM = 1 << 20  # a form read here for its CSRF field; the app's forms are a few KiB
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", CSP.encode()),
    (b"referrer-policy", b"same-origin"),
]

Refuse = Callable[[Request, RankboardError], Response]


class BadHost(RankboardError):
    """The Host header names a host this server does not answer to (DNS rebinding, or a name not configured)."""

    status_code = 400


def allowed_hosts(settings: Settings) -> set[str]:
    """The names a request's Host may have: loopback, the bind address, this machine's names when bound to all
    addresses, the public URL's host, and RANKBOARD_ALLOWED_HOSTS."""
    hosts = {"127.0.0.1", "localhost", "::1", *(host.lower().strip("[]") for host in settings.allowed_hosts)}
    if settings.host in ("0.0.0.0", "::", ""):
        hosts |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    else:
        hosts.add(settings.host.lower().strip("[]"))
    if settings.public_url and (public := urlsplit(settings.public_url).hostname):
        hosts.add(public.lower())
    return hosts


class AuthSwitch:
    """Whether authentication is on. Once on it stays on (the last admin cannot be removed); while off, the
    database is asked again at most once a second, so a request costs no query."""

    def __init__(self, sessions: sessionmaker[Session], settings: Settings) -> None:
        self.sessions, self.settings = sessions, settings
        self.on, self._checked = self._ask(), time.monotonic()

    async def is_on(self) -> bool:
        if not self.on and time.monotonic() - self._checked >= RECHECK_S:
            self._checked = time.monotonic()
            self.on = await run_in_threadpool(self._ask)
        return self.on

    def _ask(self) -> bool:
        with self.sessions() as db:
            return users.auth_required(db, settings=self.settings)


class Guard:
    """The ASGI middleware; `refuse` is app.main's one mapping of domain errors to responses."""

    def __init__(self, app: ASGIApp, *, settings: Settings, sessions: sessionmaker[Session], switch: AuthSwitch,
                 refuse: Refuse) -> None:  # fmt: skip
        self.app, self.settings, self.sessions, self.switch, self.refuse = app, settings, sessions, switch, refuse
        self.hosts = allowed_hosts(settings)
        self.named_hosts = {host.lower().strip("[]") for host in settings.allowed_hosts} - {"*"}
        self.any_host = "*" in settings.allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = with_security_headers(send)
        request = Request(scope, receive)
        refusal = self.check_host(request) or self.check_origin(request)
        if refusal is not None:
            await self.refuse(request, refusal)(scope, receive, send)
            return
        method, path = request.method, request.url.path
        if is_public(method, path):
            await self.app(scope, receive, send)
            return
        caller = await self.caller(request)
        answer, receive = await self.check(request, caller, receive)
        if answer is not None:
            await answer(scope, receive, send)
            return
        scope.setdefault("state", {})["caller"] = caller
        await self.app(scope, receive, send)

    def check_host(self, request: Request) -> RankboardError | None:
        host = request.headers.get("host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        name = name.lower().strip("[]")
        if self.any_host or name in self.hosts:
            return None
        return BadHost(f"this server does not answer to the host {host!r}; if that is its name, add it to "
                       "RANKBOARD_ALLOWED_HOSTS")  # fmt: skip

    def check_origin(self, request: Request) -> RankboardError | None:
        """A change may come from this server's own pages or from a client that names no page (curl, a script);
        never from another site's page (its browser says which with Origin, or Referer)."""
        if request.method not in UNSAFE_METHODS:
            return None
        source = request.headers.get("origin") or request.headers.get("referer")
        if source is None:
            return None
        origin = urlsplit(source)
        if source != "null" and origin.netloc.lower() == request.headers.get("host", "").lower():
            return None
        # Behind a proxy that rewrites Host, the page's own name is one the admin listed.
        if origin.hostname and origin.hostname.lower() in self.named_hosts:
            return None
        return NotAllowed(f"a change sent from another site ({source}) is refused")

    async def caller(self, request: Request) -> Caller | None:
        """Who sent the request; everyone is LOCAL while authentication is off; None: no valid credentials."""
        if not await self.switch.is_on():
            return LOCAL
        authorization = request.headers.get("authorization", "")
        scheme, _, bearer = authorization.partition(" ")
        proxied = None
        if request.client is not None and request.client.host in self.settings.trusted_proxy:
            proxied = request.headers.get("x-forwarded-user") or request.headers.get("remote-user")
        session_id = request.cookies.get(SESSION_COOKIE)
        token = bearer.strip() if scheme.lower() == "bearer" and bearer.strip() else None
        if token is None and proxied is None and session_id is None:
            return None

        def resolve() -> Caller | None:
            with self.sessions() as db:
                return users.resolve(db, settings=self.settings, session_id=session_id, proxy_user=proxied,
                                     bearer=token)  # fmt: skip

        return await run_in_threadpool(resolve)

    async def check(self, request: Request, caller: Caller | None,
                    receive: Receive) -> tuple[Response | None, Receive]:  # fmt: skip
        """A refusal for this caller (None: it may go on), and how the app reads the body (replayed, if read)."""
        if caller is None:
            return self.login_required(request), receive
        needed = needed_role(request.method, request.url.path)
        if not caller.role.allows(needed):
            refusal = NotAllowed(f"{caller.name} has the role {caller.role.value}; this needs {needed.value}")
            return self.refuse(request, refusal), receive
        if request.method not in UNSAFE_METHODS:
            return None, receive
        if caller.via == "proxy" and not (request.headers.get("origin") or request.headers.get("referer")):
            refusal = NotAllowed("a change through the proxy must come from this server's page (no Origin)")
            return self.refuse(request, refusal), receive
        if caller.csrf is None:
            return None, receive
        sent, receive = await csrf_sent(request, receive)
        if sent is None or not hmac.compare_digest(sent.encode(), caller.csrf.encode()):
            message = "the CSRF token is missing or wrong: reload the page and try again"
            return self.refuse(request, NotAllowed(message)), receive
        return None, receive

    def login_required(self, request: Request) -> Response:
        """A page asked for without a login goes to the login page (and back after); anything else gets a 401."""
        path = request.url.path
        target = path + (f"?{request.url.query}" if request.url.query else "")
        login = f"/login?next={quote(target, safe='')}"
        wants_page = request.method == "GET" and "text/html" in request.headers.get("accept", "")
        if wants_page and not path.startswith("/api") and not request.headers.get("hx-request"):
            return RedirectResponse(login, status_code=303)
        message = "log in, or send Authorization: Bearer <token> (rankboard tokens create)"
        response = self.refuse(request, NotAuthenticated(message))
        response.headers["WWW-Authenticate"] = "Bearer"
        if request.headers.get("hx-request"):
            response.headers["HX-Redirect"] = login
        return response


async def csrf_sent(request: Request, receive: Receive) -> tuple[str | None, Receive]:
    """The CSRF token the request carries: its header, else a form's hidden field (the body is then replayed)."""
    header = request.headers.get(CSRF_HEADER)
    if header is not None:
        return header, receive
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return None, receive
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > MAX_FORM:
            return None, receive  # not one of this app's forms: refused without it
        if not message.get("more_body", False):
            break
    field = parse_qs(body.decode("latin-1")).get(CSRF_FIELD, [None])[0]
    return field, replay(body)


def replay(body: bytes) -> Receive:
    """A `receive` that hands the app the body already read, then waits as the real one would."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    return receive


def with_security_headers(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            present = {name.lower() for name, _ in Headers(raw=message["headers"]).raw}
            message["headers"] = [*message["headers"], *(h for h in SECURITY_HEADERS if h[0] not in present)]
        await send(message)

    return sending


def is_secure(request: Request, settings: Settings) -> bool:
    """Over https: the request's own scheme, or a trusted proxy's X-Forwarded-Proto."""
    from_proxy = request.client is not None and request.client.host in settings.trusted_proxy
    return request.url.scheme == "https" or (from_proxy and request.headers.get("x-forwarded-proto") == "https")


def refuse_bind(settings: Settings, *, auth_on: bool) -> str | None:
    """Why the server must not start: a non-loopback address with no authentication; None when it may."""
    if settings.binds_loopback or auth_on:
        return None
    return (f"refusing to listen on {settings.host}: with no user, anyone who reaches the port could run commands "
            "as you. Turn authentication on first: `rankboard users add NAME --role admin`, or set "
            "RANKBOARD_ADMIN_PASSWORD (or RANKBOARD_TRUSTED_PROXY behind an authenticating proxy); or serve on "
            "127.0.0.1.")  # fmt: skip

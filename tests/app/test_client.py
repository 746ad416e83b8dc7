"""The API client against a real local HTTP server that redirects: the token goes nowhere it was not sent to."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from rankboard.client import Client, ClientError


class Redirecting(BaseHTTPRequestHandler):
    """Answers every request with a 307 to /moved on itself, and records each request's Authorization header."""

    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        self.send_response(307)
        self.send_header("Location", f"http://{self.headers['Host']}/moved")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def redirecting() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_redirect_is_an_error_naming_where_and_the_token_is_not_sent_on(redirecting: str) -> None:
    Redirecting.seen.clear()
    with pytest.raises(ClientError) as refused:
        Client(redirecting, "rbt_secret").get(1)
    assert refused.value.status == 307
    assert refused.value.message == f"307: {redirecting}/api/runs/1 redirects to {redirecting}/moved; give that URL"
    assert Redirecting.seen == [("/api/runs/1", "Bearer rbt_secret")]  # once, and /moved never asked for

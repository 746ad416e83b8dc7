"""The client's tests' server, where a module does not define its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live import LiveServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    # Runs here are opened, never launched; /metrics counts the batches the server took.
    server = LiveServer(tmp_path, RANKBOARD_SUPERVISE_INTERVAL_S="3600", RANKBOARD_PROMETHEUS="1")
    server.start()
    yield server
    server.stop()

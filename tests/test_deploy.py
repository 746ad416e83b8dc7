"""docker-compose.yml is valid (no Docker engine runs here, so it is validated, not run)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="scripts/test installs docker-compose")
def test_compose_file_is_valid() -> None:
    result = subprocess.run(["docker-compose", "-f", str(REPO / "docker-compose.yml"), "config", "-q"],
                            capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert result.returncode == 0, result.stderr

"""The `rankboard` command, as a user types it."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from app import __version__
from app.cli import main


def test_version_prints_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"rankboard {__version__}\n"


def test_the_installed_command_answers_version() -> None:
    """The console script, and pip's record of the package, say the version app/__init__.py holds."""
    rankboard = f"{sys.prefix}/bin/rankboard"  # the console script pip made for this venv
    result = subprocess.run([rankboard, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"rankboard {__version__}" == f"rankboard {metadata.version('rankboard')}"


@pytest.mark.parametrize(("cpus", "problem"), [("0-x", "'0-x' is not a CPU number or range"),
                                               ("4096", "CPUs 4096 are not among this server's")])  # fmt: skip
def test_serve_refuses_a_bad_setting_naming_its_variable_and_the_problem(
    cpus: str, problem: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RANKBOARD_SERVER_CPUS", cpus)
    assert main(["serve"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"rankboard: RANKBOARD_SERVER_CPUS: {problem}")

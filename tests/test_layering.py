"""The trainer runs on compute nodes without the server: it never imports `app`, and `app` imports only its wire."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def imported_modules(folder: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (REPO / folder).rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        found[str(path.relative_to(REPO))] = names
    return found


def test_trainer_never_imports_app() -> None:
    offenders = {f: n for f, n in imported_modules("trainer").items() if any(m.split(".")[0] == "app" for m in n)}
    assert offenders == {}


def test_app_imports_only_the_trainers_wire_module() -> None:
    # And trainer.gpu: the Host page reads the server's own GPUs through the one NVML interface the trainer's
    # sampler uses (and its fake, in CI), rather than a second copy of it. It needs nothing beyond the wire module.
    allowed = {"trainer", "trainer.wire", "trainer.gpu"}
    offenders = {
        f: {m for m in n if m.split(".")[0] == "trainer"} - allowed for f, n in imported_modules("app").items()
    }
    assert {f: n for f, n in offenders.items() if n} == {}


def test_wire_needs_only_the_standard_library() -> None:
    imported = {m.split(".")[0] for m in imported_modules("trainer")["trainer/wire.py"]}
    assert imported - sys.stdlib_module_names == set()


def test_no_command_line_goes_through_a_shell() -> None:
    for folder in ("app", "trainer"):
        for path in (REPO / folder).rglob("*.py"):
            source = path.read_text()
            assert "shell=True" not in source and "os.system(" not in source, path


def test_the_api_client_needs_only_the_standard_library() -> None:
    """`app.client` and `rankboard runs` run where only the client is wanted (a laptop, a notebook, a CI job), and
    start fast: the standard library, the client, and pandas when a DataFrame is asked for."""
    modules = imported_modules("app")
    for name in ("app/client.py", "app/runs_cli.py"):
        third_party = {m.split(".")[0] for m in modules[name]} - set(sys.stdlib_module_names)
        assert third_party - {"app", "pandas"} == set(), name
        assert {m for m in modules[name] if m.split(".")[0] == "app" and not m.startswith("app.client")} == set()

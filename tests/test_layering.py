"""The layout's rules: the trainer and its client run on compute nodes without the server, so they never import
`app`; the client never imports the built-in program; `app` imports only the client's wire (and its GPU reader)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
CLIENT = "trainer/rankboard/"


def imported_modules(folder: str) -> dict[str, set[str]]:
    """Per file below `folder`, every module it imports (absolute: a relative import is within its own package)."""
    found: dict[str, set[str]] = {}
    for path in (REPO / folder).rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        found[str(path.relative_to(REPO))] = names
    return found


def roots(names: set[str]) -> set[str]:
    return {name.split(".")[0] for name in names}


def test_the_trainer_and_its_client_never_import_the_server() -> None:
    offenders = {f: n for f, n in imported_modules("trainer").items() if "app" in roots(n)}
    assert offenders == {}


def test_the_client_never_imports_the_built_in_program_and_needs_only_the_standard_library() -> None:
    """A user's script imports `rankboard` without the built-in trainer; torch only where the script has it (read from
    sys.modules), NVML's bindings and psutil when it samples GPUs, pandas when a DataFrame is asked for."""
    optional = {"pynvml", "psutil", "pandas"}
    for name, imported in imported_modules("trainer").items():
        if name.startswith(CLIENT):
            assert roots(imported) - set(sys.stdlib_module_names) - optional - {"rankboard"} == set(), name


def test_the_built_in_program_reports_through_the_client_like_any_script() -> None:
    for name, imported in imported_modules("trainer").items():
        if not name.startswith(CLIENT):
            assert not any(m.startswith(("trainer.report", "trainer.wire", "trainer.rankboard")) for m in imported), (
                name
            )


def test_app_imports_only_the_clients_wire_and_gpu_reader() -> None:
    # rankboard.gpu: the Host page reads the server's own GPUs through the one NVML interface the trainer's sampler
    # uses (and its fake, in CI), rather than a second copy of it. app/cli.py hands `rankboard runs` to the client's.
    allowed = {"rankboard", "rankboard.wire", "rankboard.gpu", "rankboard.cli"}
    offenders = {f: {m for m in n if roots({m}) & {"trainer", "rankboard"}} - allowed
                 for f, n in imported_modules("app").items()}  # fmt: skip
    assert {f: n for f, n in offenders.items() if n} == {}


def test_wire_needs_only_the_standard_library() -> None:
    assert roots(imported_modules("trainer")[CLIENT + "wire.py"]) - set(sys.stdlib_module_names) == set()


def test_no_command_line_goes_through_a_shell() -> None:
    for folder in ("app", "trainer"):
        for path in (REPO / folder).rglob("*.py"):
            source = path.read_text()
            assert "shell=True" not in source and "os.system(" not in source, path


def test_mypy_checks_every_module_of_the_built_in_program() -> None:
    """pyproject.toml lists them, since crawling `trainer` would check the client a second time (trainer.rankboard)."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["modules"])
    present = {
        f"trainer.{path.stem}" for path in (REPO / "trainer").glob("*.py") if path.stem not in ("__init__", "__main__")
    }
    assert listed == present | {"trainer"}

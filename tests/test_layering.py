"""The layout's rules: the trainer and its client run on compute nodes without the server, so they never import
`app`; the client never imports the built-in program; `app` imports only the client's wire (and its GPU reader)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
import typing
from pathlib import Path

import tomllib
from fastapi.routing import APIRoute
from starlette.responses import Response

from app.web import api as web_api
from app.web import pages as web_pages

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
            allowed = optional | EXTRAS.get(name.removeprefix(CLIENT).split("/")[0], set())
            assert roots(imported) - set(sys.stdlib_module_names) - allowed - {"rankboard"} == set(), name


# The client's subpackages that stand on another library, each installed by an extra (`pip install rankboard[...]`)
# and imported only by who uses it: `import rankboard` needs none of them.
EXTRAS = {
    "importers": {"tensorboard", "mlflow", "wandb"},
    "integrations": {"torch", "lightning", "transformers", "accelerate"},
}


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


def module_name(path: Path, root: Path) -> str:
    """A file's module as Python imports it: trainer/rankboard/ is the installed `rankboard`."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[:2] == ["trainer", "rankboard"]:
        parts = parts[1:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, folders: tuple[str, ...]) -> dict[str, set[str]]:
    """Each module below `folders` and the modules of that tree it imports, anywhere in it: an import inside a function
    (made there to dodge a circle at import time) is an edge all the same."""
    files = {module_name(path, root): path for folder in folders for path in (root / folder).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
                module = ".".join(part for part in (base, node.module or "") if part)
                wanted = [module, *(f"{module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for imported in wanted:  # the longest prefix that is a module of the tree: `from a import b` may be a.b
                parts = imported.split(".")
                while parts and ".".join(parts) not in files:
                    parts.pop()
                if parts and ".".join(parts) != name:
                    edges.add(".".join(parts))
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import one another, round a circle of any length."""
    reach = {}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo.extend(graph.get(module, ()))
        reach[start] = seen
    groups = {tuple(sorted(other for other in reach[m] if m in reach[other])) for m in graph if m in reach[m]}
    return sorted(list(group) for group in groups)


def test_no_module_imports_one_that_imports_it_back() -> None:
    """Layers point one way: a circle, lazy or not, means two modules are one concern split badly."""
    assert circles(import_graph(REPO, ("app", "trainer"))) == []


def test_a_circle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    package = tmp_path / "app" / "things"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from app.things import b\n")
    (package / "b.py").write_text("def later():\n    from . import c\n")
    (package / "c.py").write_text("import app.things.a\n")
    (package / "d.py").write_text("from app.things.a import x\n")  # imports into the circle, is not part of it
    assert circles(import_graph(tmp_path, ("app",))) == [["app.things.a", "app.things.b", "app.things.c"]]


# app/'s folders (and its two top modules), lowest first; the folders of one rank know nothing of each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("",),  # app/__init__.py: the version, nothing else
    ("core",),
    ("schemas",),
    ("store", "launcher", "auth"),
    ("services",),
    ("workers", "web"),
    ("main",),
    ("cli",),
)


def layer(module: str) -> str:
    """The folder of app/ a module is in (`app.services.lifecycle.tick`: services), or main, cli; "" for `app`."""
    return module.split(".")[1] if "." in module else ""


def rank(module: str) -> int:
    """Its layer's place in LAYERS, lowest 0; -1 for a folder that LAYERS does not place."""
    return next((i for i, names in enumerate(LAYERS) if layer(module) in names), -1)


def imports_up(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Per module, what it imports from a layer above its own, or from another folder of its own rank."""
    found = {}
    for module, imported in graph.items():
        wrong = {other for other in imported if layer(other) != layer(module) and rank(other) >= rank(module)}
        if wrong:
            found[module] = wrong
    return found


def test_each_layer_imports_only_the_layers_below_it() -> None:
    """app/ imports downward only: app (its version) < core < schemas < store, launcher, auth < services < workers,
    web < main < cli. The store runs SQL over core's models; launchers own processes; auth decides who may; services
    decide, with the store, the launchers and auth; workers (the supervisor's tick) and web (routes, pages) call
    services; main builds the app from all of them, and cli serves it. An import inside a function counts."""
    graph = import_graph(REPO, ("app",))
    assert {module for module in graph if rank(module) < 0} == set(), "a new folder of app/ needs its place in LAYERS"
    assert imports_up(graph) == {}


def test_an_import_up_the_layers_is_found(tmp_path: Path) -> None:
    for folder in ("core", "services", "store", "launcher"):
        (tmp_path / "app" / folder).mkdir(parents=True)
        (tmp_path / "app" / folder / "__init__.py").write_text("")
    (tmp_path / "app" / "services" / "runs.py").write_text("from app.core import models\n")  # down: fine
    (tmp_path / "app" / "core" / "models.py").write_text("def later():\n    from app.services import runs\n")
    (tmp_path / "app" / "store" / "runs.py").write_text("import app.launcher\n")  # a sibling of its own rank
    assert imports_up(import_graph(tmp_path, ("app",))) == {
        "app.core.models": {"app.services", "app.services.runs"},
        "app.store.runs": {"app.launcher"},
    }


def type_leaves(annotation: object) -> list[object]:
    """The classes an annotation names: `list[A] | None` is [A, NoneType]."""
    args = typing.get_args(annotation)
    return [leaf for arg in args for leaf in type_leaves(arg)] if args else [annotation]


def api_routes() -> list[APIRoute]:
    """Every documented route of the API, from the routers of app/web/api/ and app/web/pages/ (the logs API is
    registered with the log pages)."""
    found = []
    for package in (web_api, web_pages):
        for info in pkgutil.iter_modules(package.__path__):
            router = getattr(importlib.import_module(f"{package.__name__}.{info.name}"), "router", None)
            found += [r for r in getattr(router, "routes", []) if isinstance(r, APIRoute) and r.include_in_schema]
    return found


def test_every_api_answer_is_a_shape_of_app_schemas() -> None:
    """One home per shape: a route's response model is a model of app/schemas/, and what it returns is that model, a
    database row the model reads, or a plain Response; never a service's own dataclass, nor a model written beside
    the route."""
    wrong = {}
    for route in api_routes():
        models = type_leaves(route.response_model)
        returned = type_leaves(typing.get_type_hints(route.endpoint).get("return"))
        bad = [m for m in models if m is not None and not (_a_schema(m) or _module(m) == "builtins")]
        bad += [t for t in returned if not _answerable(t)]
        if bad:
            wrong[f"{sorted(route.methods)} {route.path}"] = bad
    assert wrong == {}


def _module(kind: object) -> str:
    return str(getattr(kind, "__module__", ""))


def _a_schema(kind: object) -> bool:
    return _module(kind).startswith("app.schemas.")


def _answerable(kind: object) -> bool:
    """A shape of app/schemas/, a database row or a builtin (str, None) a response model reads, or a Response."""
    if isinstance(kind, type) and issubclass(kind, Response):
        return True
    return _a_schema(kind) or _module(kind) in ("app.core.models", "builtins")


# Objects other than runs whose `status` the services set (an alert's delivery).
OTHER_STATUSES = {"delivery"}
TRANSITIONS = "app/services/lifecycle/transitions.py"


def status_writes(path: Path) -> list[str]:
    """Where a file sets a run's status other than through transitions.move: an assignment to `.status` (or its
    reason), a Run made with one, an event written by hand, an UPDATE of runs that sets it."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            found += [f"line {node.lineno}: sets {ast.unparse(target)}" for target in _status_targets(node)]
        elif isinstance(node, ast.Call):
            named, keywords = ast.unparse(node.func), {keyword.arg for keyword in node.keywords}
            if named == "Run" and keywords & {"status", "status_reason"}:
                found.append(f"line {node.lineno}: makes a Run with a status")
            elif named == "RunEvent":
                found.append(f"line {node.lineno}: writes a run's event")
            elif named.endswith(".values") and "status" in keywords and "update(Run)" in source:
                found.append(f"line {node.lineno}: updates runs' status")
    return found


def _status_targets(node: ast.Assign | ast.AugAssign | ast.AnnAssign) -> list[ast.Attribute]:
    """The `x.status` and `x.status_reason` an assignment sets (in a tuple too), but for OTHER_STATUSES."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    flat = [element for target in targets for element in (target.elts if isinstance(target, ast.Tuple) else [target])]
    return [
        target
        for target in flat
        if isinstance(target, ast.Attribute)
        and target.attr in ("status", "status_reason")
        and not (isinstance(target.value, ast.Name) and target.value.id in OTHER_STATUSES)
    ]


def test_only_the_lifecycle_writes_a_runs_status() -> None:
    """One function moves a run between statuses, against the table of allowed moves (app.services.lifecycle)."""
    writers = {str(path.relative_to(REPO)): status_writes(path) for path in (REPO / "app").rglob("*.py")}
    assert {name: where for name, where in writers.items() if where and name != TRANSITIONS} == {}
    assert status_writes(REPO / TRANSITIONS), "the writer itself is found: the check sees a write"

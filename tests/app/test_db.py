"""The schema comes from migrations only; the server creates a fresh one and refuses one it does not know."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.command import downgrade
from alembic.command import upgrade as upgrade_to
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient
from sqlalchemy import JSON, Connection, column, insert, table, text

from app.core.db import alembic_config, make_engine, prepare_schema, schema_head, upgrade
from app.core.errors import SchemaMismatch
from app.core.models import Base
from app.core.settings import Settings
from app.main import create_app


def test_migrations_build_exactly_the_schema_the_models_describe(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    with make_engine(url).connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []


def test_every_connection_gets_wal_foreign_keys_and_a_busy_timeout(tmp_path: Path) -> None:
    with make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}").connect() as connection:
        pragmas = {
            name: connection.execute(text(f"PRAGMA {name}")).scalar()
            for name in ("journal_mode", "foreign_keys", "busy_timeout")
        }
    assert pragmas == {"journal_mode": "wal", "foreign_keys": 1, "busy_timeout": 30000}


def test_a_fresh_database_is_created_and_a_second_start_reuses_it(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, shared_dir=tmp_path / "shared")
    create_app(settings)
    create_app(settings)
    with make_engine(settings.sqlalchemy_url).connect() as connection:
        version = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    assert version == ScriptDirectory.from_config(alembic_config(settings.sqlalchemy_url)).get_current_head()


def test_the_newest_migration_read_from_the_files_is_alembics_head() -> None:
    assert schema_head() == ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def test_a_start_on_a_current_schema_loads_no_migration_code(tmp_path: Path) -> None:
    """Alembic and its scripts (each migration a module) load only to change a schema or to explain one that is
    not current: a server's start on a current one reads the version row and the files' revision lines."""
    upgrade(f"sqlite:///{tmp_path / 'rankboard.db'}")
    start = (
        "import sys; from pathlib import Path; from app.core.settings import Settings; from app.main import create_app;"
        f" folder = Path({str(tmp_path)!r}); create_app(Settings(data_dir=folder, shared_dir=folder / 'shared'));"
        " print(sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'migrations')))"
    )
    done = subprocess.run([sys.executable, "-c", start], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_an_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(SchemaMismatch, match="unknown to this Rankboard"):
        prepare_schema(engine, url)


def test_tables_without_a_schema_version_are_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE runs (id INTEGER PRIMARY KEY)"))
    with pytest.raises(SchemaMismatch, match="no Rankboard schema version"):
        prepare_schema(engine, url)


def test_an_older_schema_is_refused_until_upgraded_and_the_upgrade_keeps_the_runs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to(alembic_config(url), "0001")
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO runs (name, status, status_reason, created_at, workload, nproc_per_node, epochs, batch_size,"
            " lr, checkpoint_every, seed, epoch, step, total_steps, samples_per_s, trainer_finished)"
            " VALUES ('old', 'succeeded', '', '2026-01-01 00:00:00', 'mlp', 2, 1, 64, 0.001, 1, 0, 1, 10, 10, 0, 1)"
        ))  # fmt: skip
    with pytest.raises(SchemaMismatch, match="rankboard db upgrade"):
        prepare_schema(engine, url)
    upgrade(url)
    prepare_schema(engine, url)
    with engine.connect() as connection:
        name, config = connection.execute(text("SELECT name, config FROM runs")).one()
    options = json.loads(config)  # the options added since 0001 at their defaults, in the run's config document
    assert name == "old" and (options["epochs"], options["keep_last"], options["best_metric"]) == (1, 0, "loss")
    assert options["init_from"] == "" and options["lr"] == 0.001


BEFORE_CONFIG = "0016_recent_head"
OLD_OPTIONS = {  # the option columns before 0017, at RunCreate's defaults then
    "epochs": 10, "batch_size": 64, "lr": 0.001, "checkpoint_every": 1, "seed": 0, "keep_last": 0, "keep_best": 0,
    "best_metric": "loss", "init_from": None, "init_optimizer": False, "optimizer": "adamw", "lr_schedule": "constant",
    "warmup_steps": 0, "weight_decay": 0.0, "grad_clip": 0.0, "grad_accum": 1, "precision": "off",
    "sync_batchnorm": False, "find_unused_parameters": False, "bucket_cap_mb": 25, "gradient_as_bucket_view": False,
    "val_every": 0, "checkpoint_unit": "epoch", "pg_timeout_s": 60, "stop_on_nonfinite": False,
    "fingerprint_every": 100, "desync_checks": False, "preflight": "warn",
}  # fmt: skip
PLACEHOLDERS = {"epochs": 0, "batch_size": 0, "lr": 0.0, "checkpoint_every": 0, "seed": 0}  # a run launched elsewhere's
JSON_COLUMNS = ("config", "script_args", "nccl_env")


def old_runs(count: int) -> list[dict[str, Any]]:
    """Runs as a store before 0017 kept them: built-in runs with options of their own (a fingerprint every 0 steps,
    a checkpoint to start from), runs of a script (RunCreate's defaults stored as their options) and runs launched
    elsewhere (placeholder options, what the script reported in `config`), in turn."""
    rng, rows = random.Random(17), []
    for i in range(count):
        row: dict[str, Any] = {"name": f"old-{i}", "status": "succeeded", "status_reason": "",
                               "created_at": datetime(2026, 1, 1), "nproc_per_node": 2, "workload": "mlp",
                               "epoch": 1, "step": 10, "total_steps": 10, "samples_per_s": 1.5,
                               "trainer_finished": True, **OLD_OPTIONS, "script_args": [], "nccl_env": {},
                               "script": None, "launcher": "local", "external_key": None, "config": None}  # fmt: skip
        if i % 3 == 0:
            started = rng.random() < 0.3
            row |= {"lr": rng.choice([1e-4, 3e-4, 1e-3, 3e-3]), "batch_size": rng.choice([32, 128]),
                    "optimizer": rng.choice(["adamw", "sgd"]), "fingerprint_every": rng.choice([0, 50]),
                    "desync_checks": rng.random() < 0.5, "init_from": "checkpoints/run-1/step-00000010.pt" if started
                    else None, "init_optimizer": started}  # fmt: skip
        elif i % 3 == 1:
            row |= {"workload": "script", "script": "/shared/train.py", "script_args": ["--lr", str(i)],
                    "desync_checks": rng.random() < 0.5}  # fmt: skip
        else:
            row |= {
                **PLACEHOLDERS,
                "workload": "external",
                "launcher": "external",
                "external_key": f"job-{i}",
                "script_args": None,
                "nccl_env": None,
                "config": {"lr": rng.choice([1e-4, 1e-2]), "layers": i},
            }
        rows.append(row)
    return rows


def runs_as_stored(connection: Connection) -> dict[str, dict[str, Any]]:
    """Each run's workload, option columns, script arguments and config, by name."""
    names = ["name", "workload", *OLD_OPTIONS, *JSON_COLUMNS]
    rows = connection.execute(text(f"SELECT {', '.join(names)} FROM runs")).mappings()
    return {row["name"]: {k: json.loads(v) if k in JSON_COLUMNS and isinstance(v, str) else v for k, v in row.items()}
            for row in rows}  # fmt: skip


def assert_the_config_migration_keeps_every_run(url: str, tmp_path: Path, count: int) -> None:
    """A populated store converts in place: every run kept, its options in its config document, a run launched
    elsewhere without its placeholders; the runs table filters the result; and a downgrade gives back the store."""
    upgrade_to(alembic_config(url), BEFORE_CONFIG)
    rows = old_runs(count)
    engine = make_engine(url)
    with engine.begin() as connection:
        runs = table(
            "runs", *(column(name, JSON(none_as_null=True) if name in JSON_COLUMNS else None) for name in rows[0])
        )
        connection.execute(insert(runs), rows)
        before = runs_as_stored(connection)
    upgrade(url)
    settings = Settings(data_dir=tmp_path / "data", shared_dir=tmp_path / "shared", database_url=url,
                        supervise_interval_s=3600)  # fmt: skip
    with TestClient(create_app(settings)) as client:
        shown = read_all_runs(client)
        assert sorted(shown) == sorted(before)  # every run kept
        for name, run in shown.items():
            assert run["config"] == expected_document(before[name]), name
            assert run["epochs"] == (None if run["launcher"] == "external" or run["script"] else before[name]["epochs"])
        # A built-in run's lr and what a script launched elsewhere reported; a script's arguments are no option.
        lrs = {name: expected_document(run).get("lr") for name, run in before.items()}
        assert set(read_all_runs(client, filter="lr < 1e-3")) == {name for name, lr in lrs.items() if lr and lr < 1e-3}
    downgrade(alembic_config(url), BEFORE_CONFIG)
    with engine.connect() as connection:
        assert runs_as_stored(connection) == before
        assert connection.scalar(text("SELECT COUNT(*) FROM runs WHERE config IS NULL")) == count - count // 3
    engine.dispose()


def expected_document(old: dict[str, Any]) -> dict[str, Any]:
    if old["workload"] == "external":
        return old["config"]  # type: ignore[no-any-return]
    if old["workload"] == "script":
        return {"script_args": old["script_args"], "desync_checks": old["desync_checks"]}
    return {name: "" if name == "init_from" and value is None else value for name, value in
            ((name, old[name]) for name in OLD_OPTIONS)}  # fmt: skip


def read_all_runs(client: TestClient, **params: str) -> dict[str, dict[str, Any]]:
    """Every run the API lists for this view, by name, page after page."""
    found: dict[str, dict[str, Any]] = {}
    while True:
        page = client.get("/api/runs", params={**params, "limit": 500, "offset": len(found)}).json()
        found |= {run["name"]: run for run in page["items"]}
        if len(found) >= page["total"]:
            return found


def test_a_populated_store_moves_its_options_into_config_documents_in_place_and_back(tmp_path: Path) -> None:
    assert_the_config_migration_keeps_every_run(f"sqlite:///{tmp_path / 'old.db'}", tmp_path, count=2500)

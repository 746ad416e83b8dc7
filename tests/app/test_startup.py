"""What a server's start loads: numpy is the store's, imported when points are first read or written, not at start."""

from __future__ import annotations

import subprocess
import sys

# The modules of the points' store and of the charts, which every route reaches through its services.
STORE = ("app.store.chunks", "app.store.charts", "app.store.metrics", "app.store.comm", "app.store.health",
         "app.services.charts", "app.services.metrics")  # fmt: skip


def loaded_after(code: str) -> str:
    """Runs `code` in a fresh interpreter; what it prints."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_the_store_imports_numpy_only_when_points_are_first_coded() -> None:
    imports = "; ".join(f"import {module}" for module in STORE)
    assert loaded_after(f"import sys; {imports}; print('numpy' in sys.modules)") == "False"
    first_use = (
        f"import sys; {imports}; from app.store import chunks;"
        " c = chunks.Column.of([0, 1], [1.0, 2.0], [0.5, 1.5]); blob = chunks.encode(c.steps, c.values, c.times,"
        " samples=True);"
        " print('numpy' in sys.modules, chunks.decode(blob, 2).values.tolist())"
    )
    assert loaded_after(first_use) == "True [1.0, 2.0]"

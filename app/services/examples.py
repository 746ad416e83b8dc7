"""The example scripts shipped with Rankboard, offered as runnable scripts in the shared folder."""

from __future__ import annotations

import shutil
from pathlib import Path

# Beside app/, in the source tree and in an installed wheel alike (pyproject.toml ships it).
EXAMPLES_DIR = Path(__file__).resolve().parent.parent.parent / "examples"
SCRIPTS = "scripts"  # the folder of the shared storage they are copied into


def offer_examples(shared: Path) -> list[Path]:
    """On the first start on a shared folder, copies the shipped examples into its `scripts/`, so that a run can
    name `scripts/ddp_train.py` out of the box; returns what it copied. A `scripts/` that exists is the user's: it
    is never written to again, so an edited or deleted example stays as the user left it."""
    target = shared / SCRIPTS
    if target.exists() or not EXAMPLES_DIR.is_dir():
        return []
    target.mkdir(parents=True)
    return [Path(shutil.copy2(script, target / script.name)) for script in sorted(EXAMPLES_DIR.glob("*.py"))]

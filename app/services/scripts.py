"""The training scripts a run may name, as the New-run form offers them: the Python files in the shared folder's
`scripts/` and in the configured scripts folder. Never a file outside those roots: a link that leads out of its
root is left out, as `runs.checked_script` would refuse it."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from app.services.examples import SCRIPTS

MAX_SCRIPTS = 200  # a picker, not a file browser: a folder of thousands is typed into instead
MAX_DEPTH = 3  # scripts/ and three levels of folders below it


def offered_scripts(roots: Sequence[Path]) -> list[str]:
    """What the form's script field may be set to, sorted: paths relative to the shared folder (the first root) for
    its `scripts/`, absolute paths for the other roots; at most MAX_SCRIPTS."""
    shared, *others = roots
    found = [str(path.relative_to(shared)) for path in _python_files(shared, shared / SCRIPTS)]
    for root in others:
        found += [str(path) for path in _python_files(root, root)]
    return found[:MAX_SCRIPTS]


def _python_files(root: Path, folder: Path) -> list[Path]:
    """The *.py files below `folder` (within MAX_DEPTH) whose real path stays inside `root`, sorted."""
    real_root = root.resolve()
    found = []
    for path in _walk(folder, depth=0):
        if path.suffix == ".py" and path.resolve().is_relative_to(real_root) and path.is_file():
            found.append(path)
            if len(found) >= MAX_SCRIPTS:
                break
    return sorted(found)


def _walk(folder: Path, *, depth: int) -> Iterator[Path]:
    """The entries below `folder`, skipping hidden and cache folders and not following links to folders."""
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError:  # missing, unreadable, or not a folder: nothing offered from it
        return
    for entry in entries:
        if entry.name.startswith((".", "__")):
            continue
        if entry.is_dir(follow_symlinks=False):
            if depth < MAX_DEPTH:
                yield from _walk(Path(entry.path), depth=depth + 1)
        else:
            yield Path(entry.path)

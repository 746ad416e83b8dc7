"""The scripts the New-run form offers: the Python files of the shared folder's scripts/ and of the scripts folder,
never a file outside those roots, each as the form posts it and as a run accepts it."""

from __future__ import annotations

from pathlib import Path

from app.services.runs import checked_script
from app.services.scripts import offered_scripts


def test_offered_are_the_python_files_inside_the_roots_and_nothing_a_link_leads_out_to(tmp_path: Path) -> None:
    shared, own, outside = tmp_path / "shared", tmp_path / "team-scripts", tmp_path / "elsewhere"
    for folder in (shared / "scripts" / "nlp", shared / "scripts" / ".git", shared / "scripts" / "__pycache__",
                   shared / "checkpoints", own, outside):  # fmt: skip
        folder.mkdir(parents=True)
    scripts = shared / "scripts"
    for path in (scripts / "train.py", scripts / "nlp" / "gpt.py", scripts / "notes.txt", scripts / ".git" / "hook.py",
                 scripts / "__pycache__" / "train.py", shared / "checkpoints" / "not_a_script.py", own / "resnet.py",
                 outside / "secret.py"):  # fmt: skip
        path.write_text("print('hi')\n")
    (scripts / "leak.py").symlink_to(outside / "secret.py")  # a link that leads out of the root
    (scripts / "away").symlink_to(outside, target_is_directory=True)
    (own / "same.py").symlink_to(own / "resnet.py")  # a link that stays inside: offered

    roots = [shared.resolve(), own.resolve()]
    offered = offered_scripts(roots)
    assert offered == ["scripts/nlp/gpt.py", "scripts/train.py", str(own.resolve() / "resnet.py"),
                       str(own.resolve() / "same.py")]  # fmt: skip
    assert all(checked_script(roots, script) for script in offered)  # each one a run accepts


def test_nothing_is_offered_where_the_folders_are_missing(tmp_path: Path) -> None:
    assert offered_scripts([tmp_path / "no-shared", tmp_path / "no-scripts"]) == []

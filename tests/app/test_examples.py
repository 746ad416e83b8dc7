"""The shipped example scripts are offered in the shared folder's scripts/ on the first start, and only then."""

from __future__ import annotations

from app.core.settings import Settings
from app.main import create_app
from app.services.examples import EXAMPLES_DIR


def test_the_first_start_offers_the_examples_and_later_ones_leave_the_users_scripts_alone(settings: Settings) -> None:
    create_app(settings)
    scripts = settings.shared / "scripts"
    shipped = sorted(path.name for path in EXAMPLES_DIR.glob("*.py"))
    assert "ddp_train.py" in shipped and sorted(path.name for path in scripts.iterdir()) == shipped
    assert (scripts / "ddp_train.py").read_bytes() == (EXAMPLES_DIR / "ddp_train.py").read_bytes()

    (scripts / "ddp_train.py").write_text("# my own version\n")
    (scripts / "mine.py").write_text("print('mine')\n")
    create_app(settings)
    assert (scripts / "ddp_train.py").read_text() == "# my own version\n"
    (scripts / "ddp_train.py").unlink()
    create_app(settings)
    assert sorted(path.name for path in scripts.iterdir()) == ["mine.py"]  # deleted stays deleted

"""The client needs none of the libraries its extras bring: a training script on a bare node imports it."""

from __future__ import annotations

import subprocess
import sys

# An import of any of them fails in the child, as where none is installed (they are here, for the other tests).
BLOCKED = ("lightning", "pytorch_lightning", "transformers", "accelerate", "tensorboard", "mlflow", "wandb")
CHILD = f"""
import sys
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Missing())
import rankboard, rankboard.report, rankboard.client, rankboard.cli, rankboard.integrations, rankboard.importers
import rankboard.importers.upload, rankboard.importers.command
try:
    import rankboard.integrations.lightning
except ModuleNotFoundError as error:
    print("lightning:", error.name)
"""


def test_the_client_and_its_commands_import_with_none_of_the_extras_installed() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "lightning: lightning"  # an integration says which package it needs

"""Rankboard's client, for what runs outside the server; the standard library only (torch where a script has it).

- `rankboard.report`: what a training script imports to send its metrics (`report.log({"loss": x}, step=s)`),
  its GPUs' samples (`rankboard.gpu`), its stacks when asked (`rankboard.forensics`), and, for a job launched
  elsewhere, its run (`report.init`, `rankboard.external`).
- `rankboard.Client` and `rankboard runs ...` (`rankboard.cli`): the REST API, from a laptop, a notebook or a CI job.
- `rankboard.wire`: the contract with the server, the one module the server imports (with `rankboard.gpu`, for the
  Host page).

Its folder is `trainer/rankboard/`, installed as `rankboard` (pyproject.toml); the built-in DDP program, `trainer`,
imports it like any script. Its modules import each other relatively.
"""

from .client import Client, ClientError, WaitTimedOut

__all__ = ["Client", "ClientError", "WaitTimedOut"]

"""Rankboard's trainer: runs on the compute nodes under torchrun and needs only torch and the standard library.

`python -m trainer --help` lists the options. `trainer.report` sends a script's own metrics to the dashboard; it is
installed a second time as `rankboard.report` (pyproject.toml maps the package `rankboard` to this folder), for a
script beside a `trainer.py` of its own, so the client's modules import each other relatively;
`trainer.wire` is the contract with the server, and the only module the server imports. Nothing is imported here,
so that importing `trainer.wire` does not pull in torch.
"""

"""Rankboard's built-in DDP program: `python -m trainer` under torchrun, needing only torch and the standard library.

`python -m trainer --help` lists the options. It reports through the client, `rankboard` (the folder
`trainer/rankboard/`, installed under its own name), exactly as a user's own script does: `from rankboard import
report`. Nothing is imported here, so that importing a module of this package does not pull in torch.
"""

"""Rankboard's server: runs, metrics, checkpoints, and the pages and API that show them."""

# The one version number: pyproject.toml reads it from here, so a source checkout run without installing (a
# compute node's shared copy, a container's) knows it as well as an installed wheel does.
__version__ = "0.1.0"

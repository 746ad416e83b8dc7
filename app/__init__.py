"""Rankboard's server: runs, metrics, checkpoints, and the pages and API that show them."""

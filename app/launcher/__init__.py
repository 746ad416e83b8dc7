"""Launchers own the processes of runs: start them, stop them, and tell how they ended."""

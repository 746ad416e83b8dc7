"""Sizes and durations as a person reads them on a page or in a message."""

from __future__ import annotations

from datetime import timedelta


def duration(value: timedelta | float | None) -> str:
    """1h 02m, 3m 07s or 12s: what a person reads at a glance."""
    if value is None:
        return "–"
    seconds = int(value.total_seconds() if isinstance(value, timedelta) else value)
    hours, rest = divmod(max(seconds, 0), 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def metric(value: float | None) -> str:
    """A metric's value in a table: four significant digits; a dash for none (NaN is stored as none)."""
    return "–" if value is None else f"{value:.4g}"


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"

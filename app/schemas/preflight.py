"""The preflight check's result, as the API and the run page show it: the trainer writes it as `wire.Preflight`
(trainer/preflight.py), whose fields these are, read back by app/services/preflight.py."""

from __future__ import annotations

from pydantic import BaseModel


class Mismatch(BaseModel):
    """One rank's value of a fingerprint field that differs from the most common one."""

    field: str
    rank: int
    value: str
    common: str


class Preflight(BaseModel):
    """Every rank's fingerprint and all-reduce bus bandwidth (GB/s; None with one rank), and what stands out."""

    fingerprints: list[dict[str, str]]
    bus_gbps: list[float | None]
    bytes: int
    mismatches: list[Mismatch]
    slow_ranks: list[int]
    seconds: float
    at: float  # unix time
    refused: bool = False

    @property
    def ok(self) -> bool:
        """Whether every rank matched the others and none was far slower."""
        return not self.mismatches and not self.slow_ranks

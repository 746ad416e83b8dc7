"""Faults the tests inject into the built-in trainer (wire.ENV_TEST_FAULT), to show what the dashboard then says."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from rankboard import wire


@dataclass(frozen=True)
class Fault:
    """A fault the tests inject into the built-in trainer through wire.ENV_TEST_FAULT: `hang:rank=1:step=5` blocks
    rank 1 forever before the all-reduce of step 5; `nan:rank=1:step=5` makes its loss NaN there;
    `slow_data:rank=1:step=5:ms=40` makes its data loading 40 ms slower from step 5 on; `perturb:rank=1:step=5`
    changes one of its parameters after step 5 (its replica diverges)."""

    kind: str
    rank: int
    step: int
    ms: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Fault | None:
        """The fault the environment asks for, or None (always, outside the tests)."""
        spec = environ.get(wire.ENV_TEST_FAULT)
        if not spec:
            return None
        kind, *fields = spec.split(":")
        values = dict(field.split("=", 1) for field in fields)
        return cls(kind, int(values["rank"]), int(values["step"]), int(values.get("ms", 0)))

    def hits(self, kind: str, *, rank: int, step: int) -> bool:
        """Whether this fault strikes this rank at this step."""
        return self.kind == kind and self.rank == rank and self.step == step

    def data_delay_s(self, *, rank: int, step: int) -> float:
        """How much longer this rank's data loading takes at this step."""
        slow = self.kind == "slow_data" and self.rank == rank and step >= self.step
        return self.ms / 1000 if slow else 0.0


def hang_forever() -> None:
    """Block this rank for good, outside any collective, as a rank stuck in its data loading would."""
    threading.Event().wait()

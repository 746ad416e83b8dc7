"""The queue: its order and what each run waits for; a waiting run's priority; the limits of users and groups."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, Field, StringConstraints

from app.core.request_body import Body
from app.schemas.runs import Priority

# A user's name as app.services.users allows it.
UserName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")]
Count = Annotated[int, Field(ge=0, le=100_000)]


class QueuedOut(BaseModel):
    """A queued run: its place, whose it is, how urgent, what it asks for, why it waits and when it may start."""

    id: int
    name: str
    owner: str
    priority: int
    priority_name: str = Field(description="low, normal, high, or the number.")
    slots: int = Field(description="The GPUs (or CPU process slots) it asks for on this host.")
    position: int | None = Field(description="1 for the next to start on this host; null where another scheduler "
                                 "(Slurm) queues it.")  # fmt: skip
    waits_for: str = Field(description="Why it waits, in a person's words; a scheduler's reason for its job.")
    over_limit: bool = Field(description="Its owner's (or a group's) limit holds it, not the room on the host.")
    starts_in_s: float | None = Field(description="An estimate from the running runs' ETAs; null where none can be "
                                      "made (it waits for a queued run to end, or for a limit).")  # fmt: skip
    created_at: datetime
    launcher: str


class HoldingOut(BaseModel):
    """A run that holds slots of this host now."""

    id: int
    name: str
    owner: str
    priority: int
    priority_name: str
    slots: int
    status: str
    ends_in_s: float | None = Field(description="Its ETA from its steps so far; null where it has none.")
    preemptible: bool = Field(description="A higher-priority run could ask it to stop now.")


class OwnerUseOut(BaseModel):
    """What one user holds now, against their limit (null: none)."""

    owner: str
    slots: int
    runs: int
    max_slots: int | None
    max_runs: int | None


class QueueOut(BaseModel):
    unit: str = Field(description="What a slot is on this host: GPUs, or CPU slots.")
    capacity: int
    free: int
    fair_share: bool
    preemption: bool
    queued: list[QueuedOut] = Field(description="This host's queue, in the order runs will start.")
    elsewhere: list[QueuedOut] = Field(description="Runs waiting in another scheduler's queue (Slurm's).")
    holding: list[HoldingOut]
    owners: list[OwnerUseOut]


class PriorityIn(Body):
    priority: Priority


class LimitIn(Body):
    max_slots: Count | None = Field(default=None, description="GPUs (or CPU slots) at once; null: no limit.")
    max_runs: Count | None = Field(default=None, description="Runs at once; null: no limit.")


class UserLimitOut(BaseModel):
    user: str
    max_slots: int | None
    max_runs: int | None


class GroupIn(LimitIn):
    members: list[UserName] = Field(default_factory=list, max_length=10_000)


class GroupOut(BaseModel):
    name: str
    members: list[str]
    max_slots: int | None
    max_runs: int | None


class LimitsOut(BaseModel):
    unit: str
    users: list[UserLimitOut]
    groups: list[GroupOut]
    operator_priority_max: int = Field(description="The highest priority an operator may give; admins any.")

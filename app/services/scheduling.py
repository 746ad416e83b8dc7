"""Who goes next on this host's slots, as pure functions of plain values: the queue's order (priority, then fair share,
then age), each user's and each group's limits, and which lower-priority runs are asked to stop to make room.

The supervisor's tick acts on `decide`; the queue page and `rankboard queue` show the same decision, with
`start_estimates`. Nothing here reads the database or the clock, so that tests can check it against a brute-force
reference over thousands of random clusters (tests/app/test_scheduling.py).

The rules, in the order they apply to the queue:
- A run over its owner's limit, or over a limit of a group its owner is in, waits with that reason and holds up no
  one: the runs behind it go on (the limits count the slots and runs held now and admitted before it this tick).
- Of the rest, runs start in order while they fit. The first that does not fit is the head: nothing behind it
  starts, so that a large run is never starved by smaller ones that keep slipping past it.
- When the head waits for slots that only lower-priority runs hold (beyond those already stopping), some of them
  are asked to stop: taken from the lowest priority up and, within one, newest first, choosing the set that reaches
  least far along that order (so the fewest and least important runs go; a run whose slots are not needed stays).
  Nothing is asked to stop when even all of them would not make room.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

EVERYONE = "*"  # the user limit of every user without one of their own
PREEMPTED = "preempted by run"  # how a preempted run's events begin: its stop, then its requeue (services.goodput)


class Waiting(NamedTuple):
    """A queued run: whose it is, how urgent, and how many of this host's slots (GPUs, or CPU slots) it asks for.
    (A named tuple: a tick makes one per queued run, 1,000 of them twice a second.)"""

    id: int
    owner: str
    priority: int
    slots: int


class Holding(NamedTuple):
    """A run holding slots now. `stopping`: asked to stop, its slots come free soon. `preemptible`: a higher-priority
    run may ask it to stop now (it checkpoints at a stop, is not marked otherwise, was not preempted lately)."""

    id: int
    owner: str
    priority: int
    slots: int
    stopping: bool = False
    preemptible: bool = False


@dataclass(frozen=True)
class Limit:
    """At most this many slots and runs at once; None: no such limit."""

    slots: int | None = None
    runs: int | None = None


@dataclass(frozen=True)
class Policy:
    """What the decision depends on besides the runs. `member_of`: each user's groups; `usage`: each owner's recent
    slot-hours where fair share is on (among equal priorities the smallest goes first), else None; `unit`: what a
    slot is, as the reasons say it ("GPUs", "CPU slots")."""

    capacity: int
    users: Mapping[str, Limit] = field(default_factory=dict)
    groups: Mapping[str, Limit] = field(default_factory=dict)
    member_of: Mapping[str, Sequence[str]] = field(default_factory=dict)
    usage: Mapping[str, float] | None = None
    preemption: bool = True
    unit: str = "slots"

    def user_limit(self, owner: str) -> Limit | None:
        return self.users.get(owner, self.users.get(EVERYONE))


@dataclass(frozen=True)
class Decision:
    """One tick's decision: the queue in order, the runs to start, the runs to ask to stop (for `head`, the first run
    that waits for room), and why each run that does not start waits (`over_limit`: those held by a limit)."""

    order: tuple[int, ...]
    admitted: tuple[int, ...]
    preempted: tuple[int, ...]
    head: int | None
    waits: Mapping[int, str]
    over_limit: frozenset[int]


def queue_order(waiting: Sequence[Waiting], policy: Policy) -> list[Waiting]:
    """Priority first; among equals, with fair share, the owner with the fewest recent slot-hours; then the oldest."""
    usage = policy.usage
    return sorted(waiting, key=lambda run: (-run.priority, usage.get(run.owner, 0.0) if usage else 0.0, run.id))


def decide(waiting: Sequence[Waiting], holding: Sequence[Holding], policy: Policy) -> Decision:
    """What to start and what to ask to stop now (see the module's rules)."""
    queue = queue_order(waiting, policy)
    tally = _Tally(policy, holding)
    free = policy.capacity - sum(run.slots for run in holding)
    admitted: list[int] = []
    waits: dict[int, str] = {}
    over_limit: set[int] = set()
    head: Waiting | None = None
    for run in queue:
        refusal = tally.refusal(run)
        if refusal is not None:
            waits[run.id] = refusal
            over_limit.add(run.id)
        elif head is None and run.slots <= free:
            admitted.append(run.id)
            free -= run.slots
            tally.add(run)
        elif head is None:
            head = run
        else:
            waits[run.id] = f"waiting behind run {head.id}"
    preempted: tuple[int, ...] = ()
    if head is not None:
        preempted = victims(head, holding, free=free, policy=policy)
        waits[head.id] = _head_reason(head, holding, preempted, free=free, unit=policy.unit)
    return Decision(tuple(run.id for run in queue), tuple(admitted), preempted, head.id if head else None, waits,
                    frozenset(over_limit))  # fmt: skip


def victims(head: Waiting, holding: Sequence[Holding], *, free: int, policy: Policy) -> tuple[int, ...]:
    """The runs to ask to stop so that `head` fits once they have: none while the stopping runs will make room
    already, or when all lower-priority preemptible runs together would not. Among the candidates in victim order
    (lowest priority first, newest first), the set that reaches least far along it: the last candidate that must go,
    then, for what it leaves, the last one of those before it that must, and so on."""
    if not policy.preemption:
        return ()
    need = head.slots - free - sum(run.slots for run in holding if run.stopping)
    candidates = sorted(
        (run for run in holding if run.preemptible and not run.stopping and run.priority < head.priority),
        key=lambda run: (run.priority, -run.id),
    )
    chosen: list[int] = []
    while need > 0:
        reach = _shortest_prefix(candidates, need)
        if reach is None:
            return ()
        last = candidates[reach]
        chosen.append(last.id)
        need -= last.slots
        candidates = candidates[:reach]
    return tuple(reversed(chosen))  # in victim order


def _shortest_prefix(candidates: Sequence[Holding], need: int) -> int | None:
    """The index of the last candidate of the shortest prefix that holds `need` slots; None if none does."""
    total = 0
    for index, run in enumerate(candidates):
        total += run.slots
        if total >= need:
            return index
    return None


def start_estimates(
    decision: Decision, waiting: Sequence[Waiting], holding: Sequence[Holding], *, ends_in: Mapping[int, float | None],
    policy: Policy,
) -> dict[int, float | None]:  # fmt: skip
    """Seconds from now until each queued run may start, from when the runs holding slots should end (`ends_in` by
    run; None: unknown). Stopping and preempted runs free theirs now. Runs start in the queue's order, within their
    limits; one started here holds its slots for as long as it takes, which is not known: from the first run that
    must wait for a queued one there is no estimate (None), nor for a run that its limits hold then."""
    stopping = {run.id for run in holding if run.stopping} | set(decision.preempted)
    ends = {run.id: 0.0 if run.id in stopping else ends_in.get(run.id) for run in holding}
    releases = sorted(((end, run.id) for run in holding if (end := ends[run.id]) is not None), reverse=True)
    held = {run.id: run for run in holding}
    by_id = {run.id: run for run in waiting}
    tally = _Tally(policy, holding)
    free, at, blocked = policy.capacity - sum(run.slots for run in holding), 0.0, False
    found: dict[int, float | None] = {}
    for run_id in decision.order:
        run = by_id[run_id]
        if blocked or tally.refusal(run) is not None:
            found[run_id] = None
            continue
        while free < run.slots and releases:
            when, ended = releases.pop()
            at, free = max(at, when), free + held[ended].slots
            tally.remove(held[ended])
        if free < run.slots:
            found[run_id], blocked = None, True
            continue
        found[run_id] = 0.0 if run_id in decision.admitted else at
        free -= run.slots
        tally.add(run)
    return found


class _Tally:
    """Slots and runs held per owner and per group, as the decision goes down the queue."""

    def __init__(self, policy: Policy, holding: Sequence[Holding]) -> None:
        self.policy = policy
        self.slots: dict[str, int] = defaultdict(int)
        self.runs: dict[str, int] = defaultdict(int)
        self.group_slots: dict[str, int] = defaultdict(int)
        self.group_runs: dict[str, int] = defaultdict(int)
        # Each (owner, slots)'s answer until the next run is counted: past the head of a long queue, nothing is, and
        # its runs are a few sizes of a few owners.
        self.said: dict[tuple[str, int], str | None] = {}
        for run in holding:
            self.add(run)

    def add(self, run: Waiting | Holding, sign: int = 1) -> None:
        self.said.clear()
        self.slots[run.owner] += sign * run.slots
        self.runs[run.owner] += sign
        for group in self.policy.member_of.get(run.owner, ()):
            self.group_slots[group] += sign * run.slots
            self.group_runs[group] += sign

    def remove(self, run: Holding) -> None:
        self.add(run, sign=-1)

    def refusal(self, run: Waiting) -> str | None:
        """Why `run` may not start now for a limit (its owner's first, then its groups' by name); None if it may."""
        key = (run.owner, run.slots)
        if key not in self.said:
            self.said[key] = self._refusal(run)
        return self.said[key]

    def _refusal(self, run: Waiting) -> str | None:
        unit = self.policy.unit
        mine = self.policy.user_limit(run.owner)
        if mine is not None and (why := _over(mine, run, self.slots[run.owner], self.runs[run.owner],
                                              who=run.owner, unit=unit)):  # fmt: skip
            return why
        for group in sorted(self.policy.member_of.get(run.owner, ())):
            limit = self.policy.groups.get(group)
            if limit is not None and (why := _over(limit, run, self.group_slots[group], self.group_runs[group],
                                                   who=f"group {group}", unit=unit)):  # fmt: skip
                return why
        return None


def _over(limit: Limit, run: Waiting, slots: int, runs: int, *, who: str, unit: str) -> str | None:
    """The reason a run waits for this limit, or None when it is within it."""
    if limit.slots is not None and run.slots > limit.slots:
        return f"waiting: it asks for {count(run.slots, unit)}, more than {who}'s limit of {limit.slots}"
    if limit.slots is not None and slots + run.slots > limit.slots:
        return f"waiting: {who} uses {slots} of {count(limit.slots, unit)} allowed"
    if limit.runs is not None and runs + 1 > limit.runs:
        return f"waiting: {who} runs {runs} of {count(limit.runs, 'runs')} allowed at once"
    return None


def _head_reason(head: Waiting, holding: Sequence[Holding], preempted: Sequence[int], *, free: int,
                 unit: str) -> str:  # fmt: skip
    """Why the first run that does not fit waits: for the runs asked to stop for it, for those stopping, for room."""
    if preempted:
        return f"waiting for {_runs(preempted)} to stop: preempted to make room for it"
    stopping = [run.id for run in holding if run.stopping]
    if stopping and free + sum(run.slots for run in holding if run.stopping) >= head.slots:
        return f"waiting for {_runs(stopping)} to stop"
    return f"waiting for {count(head.slots, unit)}: {free} free"


def _runs(ids: Sequence[int]) -> str:
    return f"run {ids[0]}" if len(ids) == 1 else "runs " + ", ".join(str(i) for i in sorted(ids))


def count(n: int, unit: str) -> str:
    """`2 GPUs`, `1 GPU`, `1 CPU slot`: a number with its unit, singular for one."""
    return f"{n} {unit.removesuffix('s') if n == 1 else unit}"

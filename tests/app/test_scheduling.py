"""The queue's decisions over a simulated cluster: a table of runs, priorities, users, groups, limits and slots ->
what starts and what is asked to stop at a tick. Checked against a brute-force reference that tries every subset of
the queue and of the running runs, over thousands of seeded random clusters; and, case by case, in a person's words."""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Iterable, Sequence

from app.services.scheduling import (
    EVERYONE,
    Decision,
    Holding,
    Limit,
    Policy,
    Waiting,
    decide,
    start_estimates,
)

CASES = 3000
USERS = ("ada", "bo", "cy", "di")
GROUPS = ("vision", "nlp")
PRIORITIES = (-100, 0, 0, 0, 5, 100)


def random_limit(rng: random.Random, most: int) -> Limit | None:
    if rng.random() < 0.4:
        return None
    slots = rng.choice([None, rng.randint(0, most)])
    runs = rng.choice([None, rng.randint(0, 3)])
    return Limit(slots=slots, runs=runs)


def random_cluster(rng: random.Random) -> tuple[list[Waiting], list[Holding], Policy]:
    """Up to 8 slots, partly held by up to 6 runs; up to 7 queued runs of up to 4 users in up to 2 groups."""
    capacity = rng.randint(1, 8)
    users = USERS[: rng.randint(1, len(USERS))]
    holding, left, ids = [], capacity, iter(rng.sample(range(1, 100), 20))
    for _ in range(rng.randint(0, 6)):
        if left == 0:
            break
        slots = rng.randint(1, left)
        left -= slots
        holding.append(Holding(next(ids), rng.choice(users), rng.choice(PRIORITIES), slots,
                               stopping=rng.random() < 0.15, preemptible=rng.random() < 0.7))  # fmt: skip
    waiting = [Waiting(next(ids), rng.choice(users), rng.choice(PRIORITIES), rng.randint(1, capacity))
               for _ in range(rng.randint(0, 7))]  # fmt: skip
    user_limits = {user: limit for user in (*users, EVERYONE) if (limit := random_limit(rng, capacity))}
    group_limits = {group: limit for group in GROUPS if (limit := random_limit(rng, capacity))}
    member_of = {user: tuple(g for g in GROUPS if rng.random() < 0.4) for user in users}
    usage = {user: float(rng.choice([0, 1, 1, 5])) for user in users} if rng.random() < 0.5 else None
    policy = Policy(capacity=capacity, users=user_limits, groups=group_limits, member_of=member_of, usage=usage,
                    preemption=rng.random() < 0.8)  # fmt: skip
    return waiting, holding, policy


# The reference: the rules as constraints on a set, and the set found by trying them all.


def reference_order(waiting: Sequence[Waiting], policy: Policy) -> list[Waiting]:
    def before(a: Waiting, b: Waiting) -> int:
        if a.priority != b.priority:
            return -1 if a.priority > b.priority else 1
        used = policy.usage or {}
        if used.get(a.owner, 0.0) != used.get(b.owner, 0.0):
            return -1 if used.get(a.owner, 0.0) < used.get(b.owner, 0.0) else 1
        return -1 if a.id < b.id else 1

    return sorted(waiting, key=functools.cmp_to_key(before))


def within_limits(chosen: Iterable[Waiting], holding: Sequence[Holding], policy: Policy) -> bool:
    """Every user and group that `chosen` adds runs to stays within its limits, counting what it holds already."""
    chosen = list(chosen)
    for _who, members, limit in subjects(policy):
        added = [run for run in chosen if run.owner in members]
        if not added or limit is None:
            continue
        held = [run for run in holding if run.owner in members]
        if limit.slots is not None and sum(r.slots for r in [*held, *added]) > limit.slots:
            return False
        if limit.runs is not None and len(held) + len(added) > limit.runs:
            return False
    return True


def subjects(policy: Policy) -> list[tuple[str, set[str], Limit | None]]:
    users = set(USERS)
    found: list[tuple[str, set[str], Limit | None]] = [
        (user, {user}, policy.users.get(user, policy.users.get(EVERYONE))) for user in users
    ]
    for group, limit in policy.groups.items():
        found.append((group, {user for user in users if group in policy.member_of.get(user, ())}, limit))
    return found


def reference_decision(
    waiting: Sequence[Waiting], holding: Sequence[Holding], policy: Policy
) -> tuple[list[int], set[int], set[int], int | None]:
    """(the queue's order, what starts, what waits for a limit, the head), by enumeration: of every set that fits
    the free slots, keeps every limit, and lets no run past the first one left out within its limits, the one that
    starts the runs earliest in the queue (the greatest in the queue's order, read as a binary number)."""
    order = reference_order(waiting, policy)
    free = policy.capacity - sum(r.slots for r in holding)
    best: tuple[int, ...] | None = None
    for bits in itertools.product((0, 1), repeat=len(order)):
        chosen = [run for run, bit in zip(order, bits, strict=True) if bit]
        if sum(r.slots for r in chosen) > free or not within_limits(chosen, holding, policy):
            continue
        if overtakes(order, bits, holding, policy):
            continue
        best = bits if best is None or bits > best else best
    assert best is not None  # the empty set is always allowed
    chosen = [run for run, bit in zip(order, best, strict=True) if bit]
    over, head = set(), None
    for index, run in enumerate(order):
        if best[index]:
            continue
        before = [r for r, bit in zip(order[:index], best[:index], strict=True) if bit]
        if not within_limits([*before, run], holding, policy):
            over.add(run.id)
        elif head is None:
            head = run.id
    return [r.id for r in order], {r.id for r in chosen}, over, head


def overtakes(order: Sequence[Waiting], bits: Sequence[int], holding: Sequence[Holding], policy: Policy) -> bool:
    for index, run in enumerate(order):
        before = [r for r, bit in zip(order[:index], bits[:index], strict=True) if bit]
        if not bits[index] and within_limits([*before, run], holding, policy):
            return any(bits[index + 1 :])
    return False


def reference_victims(
    head: Waiting | None, holding: Sequence[Holding], free: int, policy: Policy
) -> set[int]:  # fmt: skip
    """Of every set of runs that may be asked to stop and makes room for the head, the one that reaches least far
    along the victim order (lowest priority first, newest first): the least list of its positions, largest first."""
    coming = free + sum(r.slots for r in holding if r.stopping)
    if head is None or not policy.preemption or coming >= head.slots:
        return set()
    order = sorted(holding, key=lambda r: (r.priority, -r.id))
    position = {run.id: index for index, run in enumerate(order)}
    allowed = [r for r in holding if r.preemptible and not r.stopping and r.priority < head.priority]
    best: tuple[list[int], set[int]] | None = None
    for size in range(1, len(allowed) + 1):
        for victims in itertools.combinations(allowed, size):
            if coming + sum(r.slots for r in victims) < head.slots:
                continue
            key = sorted((position[r.id] for r in victims), reverse=True)
            if best is None or key < best[0]:
                best = (key, {r.id for r in victims})
    return best[1] if best else set()


def test_the_decision_is_the_reference_on_thousands_of_random_clusters() -> None:
    rng = random.Random(20261201)
    preempting = admitting = limited = 0
    for case in range(CASES):
        waiting, holding, policy = random_cluster(rng)
        decision = decide(waiting, holding, policy)
        order, admitted, over, head = reference_decision(waiting, holding, policy)
        where = f"case {case}: {waiting=} {holding=} {policy=}"
        assert list(decision.order) == order, where
        assert set(decision.admitted) == admitted, where
        assert decision.over_limit == over, where
        assert decision.head == head, where
        by_id = {run.id: run for run in waiting}
        free = policy.capacity - sum(r.slots for r in holding) - sum(by_id[i].slots for i in admitted)
        assert set(decision.preempted) == reference_victims(by_id.get(head or -1), holding, free, policy), where
        assert set(decision.waits) == set(order) - admitted, where
        preempting += bool(decision.preempted)
        admitting += bool(decision.admitted)
        limited += bool(decision.over_limit)
    # The random clusters exercise every rule, each in a good share of the cases.
    assert min(preempting, admitting, limited) > CASES // 20, (preempting, admitting, limited)


def cluster(*holding: Holding, capacity: int = 8, **policy: object) -> Policy:
    return Policy(capacity=capacity, unit="GPUs", **policy)  # type: ignore[arg-type]


def test_a_user_at_her_limit_waits_with_that_reason_and_holds_up_no_one() -> None:
    held = [Holding(1, "ada", 0, 8)]
    waiting = [Waiting(2, "ada", 0, 1), Waiting(3, "bo", 0, 2)]
    decision = decide(waiting, held, Policy(capacity=16, users={"ada": Limit(slots=8)}, unit="GPUs"))
    assert decision.admitted == (3,)
    assert decision.waits == {2: "waiting: ada uses 8 of 8 GPUs allowed"}


def test_group_and_run_limits_and_everyones_default_say_which_one_holds_a_run() -> None:
    policy = Policy(capacity=16, users={EVERYONE: Limit(runs=1)}, groups={"vision": Limit(slots=3)},
                    member_of={"ada": ("vision",), "bo": ("vision",)}, unit="GPUs")  # fmt: skip
    held = [Holding(1, "bo", 0, 2)]
    waiting = [Waiting(2, "ada", 0, 2), Waiting(3, "bo", 0, 1), Waiting(4, "cy", 0, 4), Waiting(5, "cy", 0, 1)]
    decision = decide(waiting, held, policy)
    assert decision.admitted == (4,)
    assert decision.waits == {
        2: "waiting: group vision uses 2 of 3 GPUs allowed",
        3: "waiting: bo runs 1 of 1 run allowed at once",
        5: "waiting: cy runs 1 of 1 run allowed at once",
    }
    alone = decide([Waiting(6, "ada", 0, 4)], [], policy)
    assert alone.waits == {6: "waiting: it asks for 4 GPUs, more than group vision's limit of 3"}


def test_the_queue_goes_by_priority_then_age_and_the_first_that_does_not_fit_holds_the_rest() -> None:
    waiting = [Waiting(10, "ada", 0, 2), Waiting(11, "bo", 100, 8), Waiting(12, "cy", 0, 1), Waiting(9, "di", -100, 1)]
    decision = decide(waiting, [Holding(1, "di", 0, 4)], cluster())
    assert decision.order == (11, 10, 12, 9)
    assert (decision.admitted, decision.head) == ((), 11)
    assert decision.waits[11] == "waiting for 8 GPUs: 4 free"
    assert decision.waits[10] == decision.waits[12] == "waiting behind run 11"


def test_fair_share_puts_the_user_with_the_fewest_recent_gpu_hours_first_among_equal_priorities() -> None:
    waiting = [Waiting(1, "ada", 0, 1), Waiting(2, "bo", 0, 1), Waiting(3, "ada", 100, 1)]
    assert decide(waiting, [], cluster(usage={"ada": 50.0, "bo": 2.0})).order == (3, 2, 1)
    assert decide(waiting, [], cluster()).order == (3, 1, 2)


def test_the_lowest_newest_runs_that_make_room_are_asked_to_stop_and_no_more() -> None:
    held = [Holding(1, "ada", -100, 2, preemptible=True), Holding(2, "bo", -100, 4, preemptible=True),
            Holding(3, "cy", 0, 2, preemptible=True)]  # fmt: skip
    urgent = Waiting(7, "di", 100, 4)
    decision = decide([urgent], held, cluster())
    assert decision.preempted == (2,)  # run 2 alone makes room: run 1, lower in the order, is not needed
    assert decision.waits == {7: "waiting for run 2 to stop: preempted to make room for it"}
    assert decide([Waiting(7, "di", 100, 6)], held, cluster()).preempted == (2, 1)


def test_nothing_is_preempted_for_equals_for_nothing_or_while_a_stop_already_makes_room() -> None:
    held = [Holding(1, "ada", 0, 6, preemptible=True), Holding(2, "bo", -100, 2, preemptible=True)]
    assert decide([Waiting(7, "di", 0, 4)], held, cluster()).preempted == ()  # equal priority: it waits
    mixed = [Holding(1, "ada", -100, 6, preemptible=False), Holding(2, "bo", -100, 2, preemptible=True)]
    assert decide([Waiting(7, "di", 100, 9)], mixed, cluster(capacity=9)).preempted == ()  # all it may: too few
    unmarked = [Holding(1, "ada", -100, 8, preemptible=False)]
    assert decide([Waiting(7, "di", 100, 2)], unmarked, cluster()).preempted == ()
    stopping = [Holding(1, "ada", -100, 4, stopping=True), Holding(2, "bo", -100, 4, preemptible=True)]
    decision = decide([Waiting(7, "di", 100, 4)], stopping, cluster())
    assert decision.preempted == ()
    assert decision.waits == {7: "waiting for run 1 to stop"}
    assert decide([Waiting(7, "di", 100, 2)], held, cluster(preemption=False)).preempted == ()


def test_a_start_is_estimated_from_the_running_runs_ends_in_the_queues_order() -> None:
    held = [Holding(1, "ada", 0, 4), Holding(2, "bo", 0, 2), Holding(3, "cy", 0, 2)]
    waiting = [Waiting(4, "di", 0, 4), Waiting(5, "di", 0, 2), Waiting(6, "di", 0, 8), Waiting(7, "di", 0, 1)]
    decision: Decision = decide(waiting, held, cluster())
    assert decision.admitted == () and decision.head == 4
    ends = {1: 600.0, 2: 60.0, 3: None}
    estimates = start_estimates(decision, waiting, held, ends_in=ends, policy=cluster())
    assert estimates == {4: 600.0, 5: 600.0, 6: None, 7: None}
    policy = cluster(users={"di": Limit(runs=1)})
    estimates = start_estimates(decide(waiting, held, policy), waiting, held, ends_in=ends, policy=policy)
    assert estimates == {4: 600.0, 5: None, 6: None, 7: None}

"""The verdict of a dump, from the ranks' answers as the client sends them: the rank with the lowest last collective
sequence number, else the rank outside every collective, else the rank that never answered."""

from __future__ import annotations

from app.schemas import RankDumpIn
from app.services.forensics import analyse
from trainer import wire

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
WAITING = (wire.Frame(C10D, 3252, "all_reduce"), wire.Frame("/work/train.py", 80, "step"))
LOADING = (wire.Frame("/usr/lib/python3.11/threading.py", 320, "wait"), wire.Frame("/work/data.py", 88, "__next__"))


def dump(rank: int, stack: tuple[wire.Frame, ...], last_seq: int | None = None) -> RankDumpIn:
    collectives = () if last_seq is None else (wire.Collective(last_seq, "gloo:all_reduce", "[[3]]"),)
    error = None if collectives else "no flight recorder: AttributeError"
    body = wire.RankDump(1, rank, "node-a", 100 + rank, 1.7e9, stack, "Thread 0x1 ...", collectives, error)
    return RankDumpIn.model_validate(body.to_json())


def test_without_a_flight_recorder_the_rank_outside_every_collective_is_named_with_its_own_code() -> None:
    found = analyse(1, None, [dump(0, WAITING), dump(1, LOADING), dump(2, WAITING)], expected=3)
    assert found.culprits == [1]
    assert found.verdict == (
        "rank 1 is in no collective while ranks 0, 2 wait in all_reduce; rank 1's stack: data.py:88 in __next__."
    )


def test_the_lowest_sequence_number_wins_over_stacks() -> None:
    found = analyse(1, None, [dump(0, WAITING, 7), dump(1, WAITING, 6), dump(2, WAITING, 7)], expected=4)
    assert found.culprits == [1] and found.missing == [3]
    assert found.verdict.startswith("rank 1 never reached all_reduce #7 that ranks 0, 2 wait in;")
    assert found.verdict.endswith("(no answer yet from rank 3)")


def test_a_rank_that_never_answers_is_named_when_every_other_waits() -> None:
    found = analyse(1, None, [dump(0, WAITING, 5)], expected=2)
    assert found.culprits == [1] and "rank 1 did not answer" in found.verdict


def test_ranks_in_step_with_each_other_name_no_culprit() -> None:
    found = analyse(1, None, [dump(0, WAITING, 5), dump(1, WAITING, 5)], expected=2)
    assert found.culprits == [] and found.verdict.startswith("Every rank is inside all_reduce")
    idle = analyse(1, None, [dump(0, LOADING), dump(1, LOADING)], expected=2)
    assert idle.culprits == [] and idle.verdict.startswith("No rank is inside a collective")

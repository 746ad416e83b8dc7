"""The verdict of a dump, from the ranks' answers as the client sends them. A culprit is named only from a picture of
one moment in which no rank moved on: then the rank with the lowest last collective sequence number, else the rank
outside every collective, else the rank that never answered. A rank that moved on means the run progresses."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient
from rankboard import wire

from app.schemas.forensics import RankDumpIn
from app.services.forensics import analyse
from tests.app.conftest import TOKEN, post

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
WAITING = (wire.Frame(C10D, 3252, "all_reduce"), wire.Frame("/work/train.py", 80, "step"))
LOADING = (wire.Frame("/usr/lib/python3.11/threading.py", 320, "wait"), wire.Frame("/work/data.py", 88, "__next__"))
COMPUTING = (wire.Frame("/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", 125, "forward"),
             wire.Frame("/work/train.py", 74, "step"))  # fmt: skip
T0 = 1.7e9


def dump(
    rank: int,
    stack: tuple[wire.Frame, ...],
    last_seq: int | None = None,
    *,
    at: float = T0,
    watched_s: float | None = None,
    moved: bool | None = None,
    step: int | None = None,
) -> RankDumpIn:
    """One rank's answer; without `watched_s` and `moved` as a client sent it before ranks watched themselves."""
    collectives = () if last_seq is None else (wire.Collective(last_seq, "gloo:all_reduce", "[[3]]"),)
    error = None if collectives else "no flight recorder: AttributeError"
    body = wire.RankDump(1, rank, "node-a", 100 + rank, at, stack, "Thread 0x1 ...", collectives, error, step,
                         watched_s, moved)  # fmt: skip
    return RankDumpIn.model_validate_json(json.dumps(body.to_json()))  # as the server reads it


def test_a_healthy_run_whose_ranks_answered_1_3_s_apart_is_progressing_with_no_culprit() -> None:
    # Issue 35: an mlp run 98% done; rank 0's snapshot at #1,035, rank 1's 1.3 s later at #1,404, neither inside a
    # collective. Both saw their collectives move on right after their stacks.
    rank_0 = dump(0, COMPUTING, 1035, watched_s=0.06, moved=True, step=2010)
    rank_1 = dump(1, LOADING, 1404, at=T0 + 1.3, watched_s=0.05, moved=True, step=2190)
    found = analyse(1, None, [rank_0, rank_1], expected=2)
    assert found.culprits == []
    assert found.verdict == "All ranks are progressing: each moved on after its stack was taken."
    assert [rank.progress for rank in found.ranks] == ["moved", "moved"]


def test_answers_1_3_s_apart_from_clients_that_do_not_watch_name_no_culprit() -> None:
    found = analyse(1, None, [dump(0, COMPUTING, 1035), dump(1, LOADING, 1404, at=T0 + 1.3)], expected=2)
    assert found.culprits == []
    assert found.verdict.startswith("No rank can be named: the ranks were not seen at one moment (rank 1 1.3 s after")
    assert [rank.progress for rank in found.ranks] == ["unknown", "unknown"]


def test_a_straggler_not_seen_moving_while_the_other_rank_moved_is_no_culprit() -> None:
    waiting = dump(0, WAITING, 881, watched_s=0.3, moved=True, step=400)
    slow = dump(1, LOADING, 880, at=T0 + 0.9, watched_s=4.0, moved=False, step=400)
    found = analyse(1, None, [waiting, slow], expected=2)
    assert found.culprits == []
    assert found.verdict.startswith("All ranks are progressing: rank 0 moved on after its stack was taken")
    assert "rank 1 was not seen moving" in found.verdict


def test_a_rank_that_reported_a_newer_step_since_its_dump_moved_on() -> None:
    # A rank 0 writing a checkpoint for longer than the watches while rank 1 waits: still at one moment, then moving.
    writing = dump(0, LOADING, 500, watched_s=4.0, moved=False, step=600)
    waiting = dump(1, WAITING, 501, at=T0 + 1.0, watched_s=4.0, moved=False, step=600)
    held = analyse(1, None, [writing, waiting], expected=2)
    assert held.culprits == [0] and held.verdict.startswith("rank 0 never reached all_reduce #501 that rank 1 waits")
    found = analyse(1, None, [writing, waiting], expected=2, later_steps={0: 601, 1: 600})
    assert found.culprits == [] and found.verdict.startswith("All ranks are progressing: rank 0 moved on")


def test_a_heartbeat_with_a_newer_step_after_the_dump_turns_the_verdict_to_progressing(
    client: TestClient, run_id: int
) -> None:
    request = client.post(f"/api/runs/{run_id}/dumps").json()["request"]
    writing = dump(0, LOADING, 500, watched_s=4.0, moved=False, step=600)
    waiting = dump(1, WAITING, 501, at=T0 + 1.0, watched_s=4.0, moved=False, step=600)
    for answer in (writing, waiting):
        sent = client.post(f"/api/runs/{run_id}/dumps/{request}", json=json.loads(answer.model_dump_json()),
                           headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        assert sent.status_code == 204, sent.text
    held = client.get(f"/api/runs/{run_id}/dumps").json()["latest"]
    assert held["culprits"] == [0], held["verdict"]
    assert post(client, run_id, wire.Batch(heartbeat=wire.Heartbeat(0, "node-a", 601)).to_json()).status_code == 200
    moved = client.get(f"/api/runs/{run_id}/dumps").json()["latest"]
    assert moved["culprits"] == [] and moved["verdict"].startswith("All ranks are progressing: rank 0 moved on")
    assert [rank["progress"] for rank in moved["ranks"]] == ["moved", "still"]


def test_a_hung_rank_is_named_when_every_rank_stood_still_over_one_moment() -> None:
    waiting = dump(0, WAITING, 1405, watched_s=4.0, moved=False, step=29)
    hung = dump(1, LOADING, 1404, at=T0 + 1.3, watched_s=4.0, moved=False, step=29)
    found = analyse(1, None, [waiting, hung], expected=2, later_steps={0: 29, 1: 29})
    assert found.culprits == [1]
    assert found.verdict == (
        "rank 1 never reached all_reduce #1405 that rank 0 waits in; rank 1's stack: data.py:88 in __next__."
    )
    assert [rank.progress for rank in found.ranks] == ["still", "still"]


def test_ranks_that_stood_still_at_different_moments_name_no_culprit() -> None:
    waiting = dump(0, WAITING, 1405, watched_s=4.0, moved=False)
    hung = dump(1, LOADING, 1404, at=T0 + 6.5, watched_s=4.0, moved=False)
    found = analyse(1, None, [waiting, hung], expected=2)
    assert found.culprits == []
    assert "(rank 1 2.5 s after rank 0 ended its watch)" in found.verdict


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

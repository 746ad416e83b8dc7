"""The names both sides of the wire must agree on: what the server accepts is what the trainer can run."""

from __future__ import annotations

from typing import get_args

from rankboard import relay, wire

from app.schemas.metrics import BatchIn
from app.schemas.runs import BestMetric
from trainer.workloads import WORKLOADS


def test_the_server_offers_exactly_the_trainers_workloads() -> None:
    assert set(wire.WORKLOADS) == set(WORKLOADS)


def test_the_server_ranks_checkpoints_by_exactly_the_metrics_the_trainer_records() -> None:
    assert get_args(BestMetric) == wire.CHECKPOINT_METRICS


def test_checkpoint_names_round_trip_and_temporary_files_are_not_checkpoints() -> None:
    assert wire.checkpoint_step(wire.checkpoint_name(512)) == 512
    assert wire.checkpoint_step(wire.sidecar_name(wire.checkpoint_name(7))) == 7
    assert wire.checkpoint_step(".step-00000512.pt.123.abcd.tmp") is None
    assert wire.checkpoint_step("step-12a.pt") is None


def test_a_nodes_relayed_batch_is_one_the_server_takes_with_every_ranks_heartbeat_and_ending() -> None:
    def one_rank(rank: int, steps: list[int]) -> dict[str, object]:
        column = wire.Column("loss", rank, steps, [0.5] * len(steps), [1.0] * len(steps))
        beat, ending = wire.Heartbeat(rank, "node-a", steps[-1]), wire.Ended(rank, "node-a", "exited")
        return wire.Batch(columns=(column,), heartbeat=beat, ended=ending).to_json()

    half = wire.MAX_POINTS_PER_BATCH // 2 + 1
    groups = relay.merged([one_rank(0, [1, 2]), one_rank(1, [3]), one_rank(2, list(range(half))),
                           one_rank(3, list(range(half)))])  # fmt: skip
    assert [group.members for group in groups] == [[0, 1, 2], [3]]  # split where a batch would hold too many points
    taken = BatchIn.model_validate(groups[0].body)
    assert [beat.rank for beat in taken.all_heartbeats] == [ending.rank for ending in taken.all_endings] == [0, 1, 2]
    assert taken.size == 3 + half and taken.heartbeat is None
    wired = wire.Batch(heartbeats=(wire.Heartbeat(4, "b", 9),), endings=(wire.Ended(4, "b", "finished"),))
    assert BatchIn.model_validate(wired.to_json()).all_endings[0].how == "finished"

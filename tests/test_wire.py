"""The names both sides of the wire must agree on: what the server accepts is what the trainer can run."""

from __future__ import annotations

from typing import get_args

from rankboard import wire

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

"""What a run cost, read from its API as a user reads it: GPU-hours from each launch to its end, energy by NVML's
counter or by the integral of sampled power, money at the admin's prices, and the goodput ledger's lost parts in the
same units. Runs are built in a real SQLite store (tests/app/cost_runs.py) with kills, restarts, stops and
preemptions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from app.cli import main
from app.core.models import RunStatus
from app.core.settings import Settings, parse_prices
from app.main import create_app
from app.services import cost
from tests.app.cost_runs import H100, Ledger, Plan, Wave, build, launches

A100 = "NVIDIA A100-SXM4-80GB"
PRICES = {"H100": 2.49, "a100-sxm4": 1.10}
Q, S, R = RunStatus.queued, RunStatus.starting, RunStatus.running


def killed_and_restarted() -> Plan:
    """Two ranks on two H100s; torchrun restarts both after a kill at 900 s; the second incarnation resumes from the
    checkpoint of step 500, having reached 600: 100 steps taken again."""
    ledgers = [ledger for rank in (0, 1) for ledger in (
        Ledger("a.0", rank, 40, 900, (0, 600), {"startup_build": 20, "step": 800, "checkpoint": 30, "data": 10}),
        Ledger("a.1", rank, 960, 1890, (500, 1200), {"startup_build": 20, "step": 880, "checkpoint": 30}),
    )]  # fmt: skip
    events = [(0, Q, "created"), (30, S, "torchrun started"), (35, R, "first progress"),
              (1900, RunStatus.succeeded, "training finished")]  # fmt: skip
    return Plan("killed", events, ledgers=ledgers, power=Wave(), counter=True, restarts=1, tags=["big", "llm"])


def stopped_and_resumed() -> Plan:
    """Stalled for two minutes, stopped, left stopped for an hour, resumed from its stop's checkpoint."""
    ledgers = [ledger for rank in (0, 1) for ledger in (
        Ledger("a.0", rank, 15, 1190, (0, 800), {"startup_build": 25, "step": 1100, "checkpoint": 50}),
        Ledger("b.0", rank, 5040, 6990, (800, 2000), {"startup_build": 30, "step": 1900, "checkpoint": 20}),
    )]  # fmt: skip
    events = [(0, Q, "created"), (10, S, "torchrun started"), (12, R, "first progress"),
              (300, R, "not progressing: no rank has reported a new step"),
              (420, R, "progressing again: the ranks' steps move again"), (1200, RunStatus.stopped, "stopped"),
              (5000, Q, "resume requested"), (5030, S, "torchrun started"),
              (7000, RunStatus.succeeded, "done")]  # fmt: skip
    return Plan("resumed", events, ledgers=ledgers, power=Wave(mean=200, swing=80), owner="bob", tags=["llm"])


def preempted() -> Plan:
    """One rank on an A100, preempted by a higher-priority run and resumed 10 minutes later."""
    ledgers = [Ledger("a.0", 0, 0, 1002, (0, 500), {"step": 1000, "checkpoint": 2}),
               Ledger("b.0", 0, 1600, 3000, (500, 1200), {"step": 1400})]  # fmt: skip
    events = [(0, Q, "created"), (0, S, "torchrun started"), (1, R, "first progress"),
              (1000, RunStatus.stopping, "preempted by run 9 (priority high): finishing the step, saving"),
              (1004, Q, "preempted by run 9: back in the queue at priority low; resumes from step-500.pt"),
              (1600, S, "torchrun started"), (3000, RunStatus.succeeded, "done")]  # fmt: skip
    return Plan("preempted", events, ranks=1, gpus=[A100], ledgers=ledgers)


def failed() -> Plan:
    ledgers = [Ledger("a.0", 0, 10, 500, (0, 300), {"startup_build": 10, "step": 480})]
    events = [(0, Q, "created"), (5, S, "torchrun started"), (600, RunStatus.failed, "torchrun exited with 1")]
    return Plan("failed", events, ranks=1, gpus=[H100], ledgers=ledgers, owner="bob")


def script() -> Plan:
    """A user's script: no ledger, so its time is not itemized."""
    events = [(0, Q, "created"), (10, S, "torchrun started"), (2000, RunStatus.succeeded, "done")]
    return Plan("script", events, script="train.py", power=Wave(mean=300, swing=0))


def on_cpus() -> Plan:
    events = [(0, Q, "created"), (5, S, "torchrun started"), (605, RunStatus.succeeded, "done")]
    return Plan("cpu", events, gpus=[], owner="cy", script="train.py")


PLANS = {plan.name: plan for plan in (killed_and_restarted(), stopped_and_resumed(), preempted(), failed(), script(),
                                      on_cpus())}  # fmt: skip


@pytest.fixture
def priced(settings: Settings) -> Iterator[tuple[TestClient, dict[str, int]]]:
    with TestClient(create_app(settings.model_copy(update={"gpu_prices": PRICES}))) as client:
        yield client, {name: build(client, plan) for name, plan in PLANS.items()}


def cost_of(client: TestClient, run_id: int) -> dict[str, Any]:
    answer = client.get(f"/api/runs/{run_id}/cost")
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_ledger_adds_up_in_gpu_hours_for_kills_restarts_stops_and_preemptions(
    priced: tuple[TestClient, dict[str, int]],
) -> None:
    client, runs = priced
    for name, plan in PLANS.items():
        body = cost_of(client, runs[name])
        held = (len(plan.gpus) or plan.ranks) * sum(end - launch for launch, end in launches(plan)) / 3600
        assert body["device_hours"] == pytest.approx(held, rel=1e-6), name  # launch to end, each launch
        assert sum(p["device_hours"] for p in body["parts"]) == pytest.approx(held, rel=0.01), name
        if body["itemized"]:
            lost = sum(p["share"] for p in body["parts"] if p["lost"])
            assert held * (body["goodput"] + lost) == pytest.approx(held, rel=0.01), name
            assert body["lost_device_hours"] == pytest.approx(held * (1 - body["goodput"]), rel=0.01), name
    killed = cost_of(client, runs["killed"])
    parts = {p["name"]: p for p in killed["parts"]}
    assert parts["restarts"]["device_hours"] == pytest.approx(2 * 60 / 3600)  # both GPUs, the 60 s re-launch
    assert parts["repeated"]["device_hours"] > 0 and killed["queued_hours"] == pytest.approx(30 / 3600)
    restarted = parts["restarts"]["cost"] + parts["repeated"]["cost"]
    hours = parts["restarts"]["device_hours"] + parts["repeated"]["device_hours"]
    assert killed["sentences"][0] == f"This run's 1 restart cost {hours:.3g} GPU-hours, ${restarted:,.2f}."
    resumed = cost_of(client, runs["resumed"])  # the hour it sat stopped is held by no one: in neither figure
    assert resumed["queued_hours"] == pytest.approx(40 / 3600) and len(resumed["attempts"]) == 2
    assert {p["name"] for p in resumed["parts"] if p["lost"]} >= {"stalls", "startup", "checkpoint"}


def test_cost_is_at_the_admins_price_for_the_gpu_model_and_none_without_one(
    priced: tuple[TestClient, dict[str, int]],
) -> None:
    client, runs = priced
    killed = cost_of(client, runs["killed"])
    assert killed["device"] == "gpu" and killed["gpu_models"] == [H100] and killed["price_per_hour"] == 2.49
    assert killed["cost"] == pytest.approx(killed["device_hours"] * 2.49)
    assert killed["lost_cost"] == pytest.approx(sum(p["cost"] for p in killed["parts"] if p["lost"]))
    assert cost_of(client, runs["preempted"])["price_per_hour"] == 1.10  # "a100-sxm4": any case, a part of the name
    assert cost.price_of("NVIDIA A100 80GB", {"A100": 1.0, "A100 80GB": 1.5}) == 1.5  # the longest model matches
    assert cost.price_of("Tesla T4", PRICES) is None
    with TestClient(create_app(client.app.state.settings.model_copy(update={"gpu_prices": {}}))) as unpriced:  # type: ignore[attr-defined]
        body = cost_of(unpriced, runs["killed"])
    assert body["cost"] is None and body["cost_note"] == f"no price is set for {H100} (RANKBOARD_GPU_PRICES)"
    assert body["sentences"][0].startswith("This run's 1 restart cost") and "$" not in body["sentences"][0]


def test_a_run_on_cpus_says_so_and_counts_cpu_hours(priced: tuple[TestClient, dict[str, int]]) -> None:
    client, runs = priced
    body = cost_of(client, runs["cpu"])
    assert (body["device"], body["unit"], body["devices"]) == ("cpu", "CPU-hours", 2)
    assert body["device_hours"] == pytest.approx(2 * 600 / 3600)
    assert body["energy_kwh"] is None and body["energy_method"] == "none" and body["cost"] is None
    assert body["held_from"] == "2 CPU process(es): its nodes have no GPU"
    page = client.get(f"/runs/{runs['cpu']}").text
    assert 'id="cost"' in page and "0.33 CPU-hours" in page and "on CPUs" in page


def test_energy_by_the_counter_and_by_the_integral_of_power_agree(priced: tuple[TestClient, dict[str, int]]) -> None:
    """The same GPU twice: once with NVML's counter (read once a minute), once with only its power each second."""
    client, runs = priced
    plan = PLANS["killed"]
    without = build(client, Plan("no counter", plan.events, ledgers=plan.ledgers, power=Wave(), restarts=1))
    by_counter, by_power = cost_of(client, runs["killed"]), cost_of(client, without)
    assert by_counter["energy_method"] == "counter" and by_power["energy_method"] == "integral of power"
    wave, (launch, end) = Wave(), launches(plan)[0]
    drawn = 2 * (wave.joules(end) - wave.joules(launch)) / 3.6e6  # two GPUs, the exact integral
    assert by_counter["energy_kwh"] == pytest.approx(by_power["energy_kwh"], rel=0.05)
    assert by_counter["energy_kwh"] == pytest.approx(drawn, rel=0.05) and by_power["energy_kwh"] == pytest.approx(
        drawn, rel=0.05
    )
    lost = sum(p["kwh"] for p in by_counter["parts"] if p["lost"])
    assert by_counter["lost_kwh"] == pytest.approx(lost) and 0 < lost < by_counter["energy_kwh"]


def test_the_integral_of_power_does_not_bridge_a_gap_in_the_samples() -> None:
    """100 W sampled each second for 100 s, nothing for 15 minutes, then 100 s more: 20 kJ, not 110 kJ."""
    times = [*range(0, 101), *range(1000, 1101)]
    assert cost.power_joules(times, [100.0] * len(times)) == pytest.approx(20_000)
    assert cost.counter_joules([0, 60, 120], [5e9, 5e9 + 600, 5e9 + 900]) == 900
    assert cost.counter_joules([0, 60, 120, 180], [5e9, 5e9 + 600, 300, 900]) is None  # the driver reloaded: unknown


def test_gpu_prices_are_read_from_the_environment_and_a_bad_one_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse_prices("H100=2.49/h, A100 = 1.10 ,L4=0") == {"H100": 2.49, "A100": 1.10, "L4": 0.0}
    monkeypatch.setenv("RANKBOARD_GPU_PRICES", "H100=2.49/h,A100=1.10/h")
    assert Settings().gpu_prices == {"H100": 2.49, "A100": 1.10}
    bad_values = [("H100=2.49/h,A100", "'A100'"), ("H100=cheap", "'H100=cheap'"), ("H100=-1/h", "'H100=-1/h'"),
                  ("=2.49/h", "'=2.49/h'"), ("H100=2/day", "'H100=2/day'"), ("H100=1,h100=2", "'h100=2'")]  # fmt: skip
    for bad, part in bad_values:
        monkeypatch.setenv("RANKBOARD_GPU_PRICES", bad)
        with pytest.raises(ValidationError, match=part):
            Settings()
        assert main(["serve"]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"rankboard: RANKBOARD_GPU_PRICES: {part}"), error

"""The metrics client when the server refuses a batch, fails on one, or fails on everything for a while (issue 35):
one batch never silences a rank. Against the real server, through a small proxy that injects the faults."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from rankboard import report, wire
from rankboard.report import Reporter

from tests.live import LiveServer, open_run, points, wait_for
from trainer.train import Throughput

TOKEN = "faults-token"


class FaultyProxy:
    """An HTTP proxy on 127.0.0.1 in front of the real server. It answers the first `storm` POSTs itself, 503 and
    every third 500 (the last one a 503, so the storm never ends on a 500), answers 500 to any body holding `poison`,
    and forwards the rest; it notes the points of each batch the server took, in the order it took them."""

    def __init__(self, target: str, *, storm: int = 0, poison: bytes | None = None) -> None:
        self.target, self.storm, self.poison = target, storm, poison
        self.posts = 0
        self.taken: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(base_url=target, timeout=10)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def answer(self, path: str, authorization: str, body: bytes) -> tuple[int, bytes]:
        """The status and reply for one POST."""
        with self._lock:
            self.posts += 1
            post = self.posts
        if post <= self.storm:
            return (500 if post % 3 == 0 else 503), b'{"detail": "injected"}'
        if self.poison is not None and self.poison in body:
            return 500, b"Internal Server Error"
        headers = {"Authorization": authorization, "Content-Type": "application/json"}
        reply = self._client.post(path, content=body, headers=headers)
        if reply.status_code == 200 and path.endswith("/metrics"):
            with self._lock:
                self.taken += [(c["key"], step) for c in json.loads(body).get("columns", []) for step in c["steps"]]
        return reply.status_code, reply.content

    def steps_taken(self, key: str) -> list[int]:
        """The steps of `key` the server took, in the order it took them."""
        with self._lock:
            return [step for taken_key, step in self.taken if taken_key == key]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # kept alive, as the real server's connections are

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status, reply = proxy.answer(self.path, self.headers.get("Authorization", ""), body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path / "server", RANKBOARD_SUPERVISE_INTERVAL_S="3600")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's pauses between tries, made short so that a fault test takes seconds, not minutes."""
    monkeypatch.setattr(report, "_RETRY_FIRST_S", 0.05)
    monkeypatch.setattr(report, "_RETRY_MAX_S", 0.2)
    monkeypatch.setattr(report, "_ASIDE_FIRST_S", 0.05)
    monkeypatch.setattr(report, "_ASIDE_MAX_S", 0.1)


def stored(server: LiveServer, run_id: int, key: str = "loss") -> list[tuple[int, float]]:
    with server.api() as api:
        return [(p["step"], p["value"]) for p in points(api, run_id, key)]


def losses(steps: Iterator[int] | range) -> list[tuple[int, float]]:
    return [(step, step / 7) for step in steps]


def log_losses(reporter: Reporter, steps: range, every: int = 100) -> None:
    """Log a loss at each step, pausing every `every` steps so that the points go in several batches."""
    for step in steps:
        reporter.log({"loss": step / 7}, step=step)
        if step % every == every - 1:
            time.sleep(0.01)


def arrived(server: LiveServer, run_id: int, points: int) -> None:
    """Wait until the API lists that many losses: close() gives up after its timeout, which a loaded machine's
    replay of a long spool may need more than."""
    wait_for(lambda: len(stored(server, run_id)) >= points, 60, interval=0.5, what=f"{points} points in the API")


def lines(err: str, *phrases: str) -> list[str]:
    return [line for line in err.splitlines() if any(phrase in line for phrase in phrases)]


def test_a_batch_the_server_refuses_is_dropped_once_and_every_later_point_arrives_in_order(
    server: LiveServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A spool left by an earlier process: 10,000 points in 10 batches, the sixth with one NaN time. The server
    refuses that batch (422); it used to answer 500, and the client retried it forever with every batch behind it."""
    run_id = open_run(server, TOKEN)
    spool_dir = tmp_path / "run"
    spool_dir.mkdir()
    batches = []
    for first in range(0, 10_000, 1_000):
        steps = list(range(first, first + 1_000))
        times = [math.nan if step == 5_500 else 1.7e9 + step for step in steps]
        column = wire.Column("loss", 0, steps, [step / 7 for step in steps], times)
        batches.append(json.dumps(wire.Batch(columns=(column,)).to_json()))
    (spool_dir / f"spool-{socket.gethostname()}-rank0.jsonl").write_text("\n".join(batches) + "\n")
    proxy = FaultyProxy(server.url)
    reporter = Reporter(proxy.url, str(run_id), TOKEN, spool_dir, flush_interval=0.02, max_batch=1_000)
    log_losses(reporter, range(10_000, 12_000))
    expected = [step for step in range(12_000) if not 5_000 <= step < 6_000]  # the refused batch, and only it
    arrived(server, run_id, len(expected))
    reporter.close()
    proxy.close()

    assert stored(server, run_id) == losses(expected)
    assert proxy.steps_taken("loss") == expected  # in order, each once
    refused = lines(capfd.readouterr().err, "rejected", "unreachable", "failing")
    assert len(refused) == 1 and "HTTP 422" in refused[0] and "times" in refused[0], refused
    assert not list(spool_dir.glob(wire.SPOOL_GLOB))


def test_through_a_5xx_storm_every_point_arrives_in_order_once(
    server: LiveServer, tmp_path: Path, capfd: pytest.CaptureFixture[str], quick_retries: None
) -> None:
    """A proxy answers 503, and 500 for some, to the first 10 posts (a server restarting behind it), then forwards:
    the points wait in the spool, in order, and arrive once it is over; none is set aside or dropped."""
    run_id = open_run(server, TOKEN)
    proxy = FaultyProxy(server.url, storm=10)
    reporter = Reporter(proxy.url, str(run_id), TOKEN, tmp_path, flush_interval=0.02, max_batch=100)
    log_losses(reporter, range(3_000))
    wait_for(lambda: proxy.posts > proxy.storm, 60, what="the storm to pass")
    log_losses(reporter, range(3_000, 3_500))
    arrived(server, run_id, 3_500)
    reporter.close()
    proxy.close()

    assert stored(server, run_id) == losses(range(3_500))
    assert proxy.steps_taken("loss") == list(range(3_500))
    err = capfd.readouterr().err
    assert len(lines(err, "unreachable (HTTP 503", "failing (HTTP 500")) == 1, err
    assert len(lines(err, "reachable again")) == 1, err
    assert lines(err, "set aside", "waits in", "dropped", "rejected") == []
    assert not list(tmp_path.glob(wire.SPOOL_GLOB))


def test_a_batch_the_server_keeps_failing_on_is_set_aside_and_the_rest_flow_on(
    server: LiveServer, tmp_path: Path, capfd: pytest.CaptureFixture[str], quick_retries: None
) -> None:
    """One batch gets a 500 every time (a bug of the server's on what it holds) while every other is taken: it no
    longer holds the rest back. It waits beside the spool, is tried ASIDE_TRIES times, then dropped, said once each."""
    run_id = open_run(server, TOKEN)
    proxy = FaultyProxy(server.url, poison=b'"poison"')
    reporter = Reporter(proxy.url, str(run_id), TOKEN, tmp_path, flush_interval=0.02)
    err: list[str] = []
    reporter.log({"poison": 1.0}, step=0)  # alone in its batch
    wait_for(lambda: reporter.spool_path.exists(), 30, what="the failed batch to be spooled")
    log_losses(reporter, range(1_000))
    wait_for(keep(err, capfd, "dropped a batch"), 60, what="the failing batch to be dropped")
    log_losses(reporter, range(1_000, 1_500))
    arrived(server, run_id, 1_500)
    reporter.close()
    proxy.close()

    assert stored(server, run_id) == losses(range(1_500))
    assert proxy.steps_taken("loss") == list(range(1_500))
    with server.api() as api:
        assert api.get(f"/api/runs/{run_id}/metrics/poison").status_code == 404
    err.append(capfd.readouterr().err)
    said_lines = lines("".join(err), "failing", "reachable again", "waits in", "dropped a batch", "rejected")
    assert [line.split("] ")[1][:30] for line in said_lines] == [
        "metrics server failing (HTTP 5",
        "metrics server reachable again",
        "the server failed on a batch (",
        "dropped a batch the server fai",
    ], said_lines
    assert f"failed on {report.ASIDE_TRIES} times" in said_lines[-1]
    assert not list(tmp_path.glob(wire.SPOOL_GLOB))


def keep(err: list[str], capfd: pytest.CaptureFixture[str], phrase: str) -> Callable[[], bool]:
    """A predicate: whether stderr said `phrase` yet; what it reads is kept in `err` for the test's later checks."""

    def said() -> bool:
        err.append(capfd.readouterr().err)
        return phrase in "".join(err)

    return said


def test_an_infinite_rate_is_sent_as_none_measured_once_and_the_run_keeps_its_last(
    server: LiveServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A loop's first step timed at 0 s gives an infinite samples/s: the server refuses such a progress (422), and
    every batch carries it. The client sends 0 (none measured) instead, once said; the points and the step arrive."""
    run_id = open_run(server, TOKEN)
    reporter = Reporter(server.url, str(run_id), TOKEN, tmp_path, flush_interval=0.02)
    reporter.progress(wire.Progress(epoch=1, epochs=2, step=1, total_steps=10, samples_per_s=99.0))
    reporter.log({"loss": 1 / 7, "samples_per_s": math.inf}, step=1)  # a metric's value: data, stored as it is
    wait_for(lambda: stored(server, run_id), 30, what="the first point")
    for step in range(2, 6):
        reporter.progress(wire.Progress(epoch=1, epochs=2, step=step, total_steps=10, samples_per_s=math.inf))
        reporter.log({"loss": step / 7}, step=step)
        time.sleep(0.05)
    reporter.close()

    assert stored(server, run_id) == losses(range(1, 6))
    assert stored(server, run_id, "samples_per_s") == [(1, "Infinity")]  # as the API writes it
    with server.api() as api:
        run = api.get(f"/api/runs/{run_id}").json()
    assert (run["step"], run["samples_per_s"]) == (5, 99.0)
    said = lines(capfd.readouterr().err, "samples_per_s", "rejected")
    assert len(said) == 1 and "samples_per_s=inf is not a rate" in said[0], said


@pytest.mark.parametrize("rate", [math.inf, -math.inf, math.nan, -1.0, 1e300])
def test_a_rate_that_is_no_measurement_is_mended_to_none_measured(rate: float) -> None:
    progress = wire.Progress(epoch=1, epochs=2, step=3, total_steps=10, samples_per_s=rate)
    sendable, mended = report.sendable_progress(progress)
    assert sendable == wire.Progress(epoch=1, epochs=2, step=3, total_steps=10, samples_per_s=0.0)
    assert [field for field, _ in mended] == ["samples_per_s"]
    good = wire.Progress(epoch=1, epochs=2, step=3, total_steps=10, samples_per_s=812.5)
    assert report.sendable_progress(good) == (good, [])


def test_counts_a_server_would_refuse_are_mended_or_the_progress_left_out() -> None:
    whole = wire.Progress(epoch=1.0, epochs=2, step=3, total_steps=10)  # type: ignore[arg-type]
    assert report.sendable_progress(whole)[0] == wire.Progress(epoch=1, epochs=2, step=3, total_steps=10)
    for bad in (-1, math.nan, 2**63):
        sendable, mended = report.sendable_progress(wire.Progress(1, 2, bad, 10))  # type: ignore[arg-type]
        assert sendable is None and [field for field, _ in mended] == ["step"]


def test_the_built_in_trainers_throughput_is_never_infinite() -> None:
    """Two reports at one instant (a step timed at 0 s) must not give an infinite rate, nor a huge one from a span a
    clock can hardly measure: the last rate stands until the span is long enough."""
    throughput = Throughput()
    assert throughput.update(0, now=100.0) == 0.0
    assert throughput.update(512, now=100.0) == 0.0
    assert throughput.update(1_024, now=100.0 + 1e-9) == 0.0
    assert throughput.update(1_536, now=101.0) == 1_536.0  # over the second since the first report
    assert throughput.update(2_048, now=101.0) == 2_048.0  # a second step at the same instant: still that second


def test_a_configs_nan_and_infinities_are_joined_as_the_strings_json_can_carry() -> None:
    """A run launched elsewhere sends its config when it joins: `{"grad_clip": inf}` is common, and JSON has no
    infinity. Sent as a string, the value reads as itself on the run's page."""
    config = {"grad_clip": math.inf, "betas": (0.9, math.nan), "optimizer": {"eps": -math.inf}, "lr": 3e-4}
    assert report.json_safe(config) == {
        "grad_clip": "Infinity", "betas": [0.9, "NaN"], "optimizer": {"eps": "-Infinity"}, "lr": 3e-4,
    }  # fmt: skip
    assert json.loads(json.dumps(report.json_safe(config), allow_nan=False))["lr"] == 3e-4

"""`homing top`'s shell: the /metrics URL it derives, its one-line errors (against real
loopback servers: a closed port, a 404, a page that is not metrics) and `--once` end to end
through `homing.cli.main` against a server whose counters grow per scrape; and the tables the
view draws."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from rich.console import Console

from homing.cli import main
from homing.top.frame import compute_frame, parse_scrape
from homing.top.main import ScrapeError, metrics_url, scrape
from homing.top.view import literal, percent, render, seconds, weight

Reply = tuple[int, str]


@pytest.fixture
def server() -> Iterator[tuple[str, Callable[[Callable[[int], Reply]], None]]]:
    """A loopback HTTP server: (its base URL, set the function from the request's number,
    0 first, to the (status, body) it answers)."""
    answer: list[Callable[[int], Reply]] = [lambda n: (404, "")]
    served = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answer[0](served[0])
            served[0] += 1
            data = body.encode()
            self.send_response(status)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()

    def set_answer(fn: Callable[[int], Reply]) -> None:
        answer[0] = fn

    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", set_answer
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/metrics"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/metrics"),
        ("127.0.0.1:9000", "http://127.0.0.1:9000/metrics"),
        ("https://gw.example/metrics", "https://gw.example/metrics"),
        ("http://gw.example/prefix/", "http://gw.example/prefix/metrics"),
    ],
)
def test_metrics_url_appends_metrics_unless_there(given: str, url: str) -> None:
    assert metrics_url(given) == url


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_gateway_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    port = _closed_port()
    assert main(["top", "--url", f"http://127.0.0.1:{port}", "--once"]) == 1
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        f"homing: cannot reach http://127.0.0.1:{port}/metrics: Connection refused\n",
    )


def test_a_status_other_than_200_is_one_line_and_exit_1(
    server: tuple[str, Callable[[Callable[[int], Reply]], None]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    base, answer = server
    answer(lambda n: (404, "no"))
    assert main(["top", "--url", base, "--once"]) == 1
    assert capsys.readouterr() == ("", f"homing: {base}/metrics answered HTTP 404 Not Found\n")


def test_a_page_that_is_not_metrics_is_one_line_and_exit_1(
    server: tuple[str, Callable[[Callable[[int], Reply]], None]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    base, answer = server
    answer(lambda n: (200, "node_load1 0.5\n"))
    assert main(["top", "--url", base, "--once"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"homing: {base}/metrics did not return a homing gateway's metrics: "
        "no homing metrics in it\n"
    )
    with pytest.raises(ScrapeError, match="not Prometheus metrics text"):
        answer(lambda n: (200, "<html><body>hi</body></html>"))
        scrape(f"{base}/metrics")


def _growing(n: int) -> Reply:
    """Scrape n: 10 * n requests of model m on w0, w0 at KV use 0.5."""
    return 200, (
        "# TYPE homing_requests_total counter\n"
        f'homing_requests_total{{model="m",worker="w0",outcome="ok"}} {10 * n}\n'
        'homing_worker_kv_usage_ratio{model="m",worker="w0"} 0.5\n'
        'homing_worker_requests_in_flight{model="m",worker="w0"} 2\n'
    )


def test_once_json_prints_one_frame_over_two_scrapes(
    server: tuple[str, Callable[[Callable[[int], Reply]], None]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    base, answer = server
    answer(_growing)
    assert main(["top", "--url", base, "--once", "--interval", "0.05", "--output", "json"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert err == ""
    assert data["scrapes"] == 2 and data["window_s"] > 0
    (model,) = data["models"]
    assert model["model"] == "m"
    assert model["requests_per_second"] == pytest.approx(10 / data["window_s"])
    (worker,) = data["workers"]
    assert (worker["worker"], worker["kv_usage_ratio"], worker["in_flight"]) == ("w0", 0.5, 2.0)
    assert worker["ttft_p95_s"] is None


def test_once_table_prints_the_model_and_worker_rows(
    server: tuple[str, Callable[[Callable[[int], Reply]], None]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    base, answer = server
    answer(_growing)
    assert main(["top", "--url", base, "--once", "--interval", "0.05"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"homing top  {base}/metrics  window ")
    worker = next(line for line in lines if line.startswith("m ") and " w0 " in line).split()
    assert float(worker[4]) > 0  # REQ/S
    assert worker[:4] + worker[5:] == ["m", "w0", "-", "-", "-", "2", "-", "-", "50.0%", "-"]


def test_view_draws_dashes_for_missing_figures_and_units_for_the_rest() -> None:
    text = (
        'homing_workers{model="m",phase="ready"} 2\n'
        'homing_worker_kv_usage_ratio{model="m",worker="w0"} 0.125\n'
        'homing_slo_ttft_seconds{model="m"} 0.5\n'
        'homing_slo_tpot_seconds{model="m"} 0.05\n'
    )
    console = Console(width=200, record=True)
    console.print(render(compute_frame([parse_scrape(text, 1.0)]), "SRC", status="oops"))
    lines = console.export_text().splitlines()
    assert lines[0] == "homing top  SRC  window - (1 scrapes)  oops"
    model = next(line for line in lines if line.startswith("m "))
    slo = ["ttft<=500", "ms", "tpot<=50.0", "ms"]
    assert model.split() == ["m", "2", "ready", *["-"] * 9, *slo, "-", "-", "-"]
    assert [seconds(v) for v in (0.0125, 0.35, 1.5, None)] == ["12.5 ms", "350 ms", "1.50 s", "-"]
    assert (percent(0.125), percent(None)) == ("12.5%", "-")


def _versions_text(n: int) -> str:
    """Scrape `n` of a model "m" with an unlabelled worker w0 and a canary v2 (worker w1)
    under a 90/10 split; 10 requests of w0 and 5 of v2 a scrape, 1 of each failed."""
    lines = ["# TYPE homing_requests_total counter", "# TYPE homing_slo_requests_total counter"]
    for version, worker, total in (("", "w0", 10), ("v2", "w1", 5)):
        labels = f'model="m",version="{version}",worker="{worker}"'
        lines.append(
            f'homing_requests_total{{{labels},outcome="ok",finish_reason="stop"}} {total * n}'
        )
        for verdict, k in (("met", total - 1), ("failed", 1)):
            v = f'model="m",version="{version}",verdict="{verdict}"'
            lines.append(f"homing_slo_requests_total{{{v}}} {k * n}")
        lines.append(f'homing_worker_kv_usage_ratio{{model="m",worker="{worker}"}} 0.5')
    lines += [
        'homing_version_weight{model="m",version=""} 90',
        'homing_version_weight{model="m",version="v2"} 10',
        'homing_rollout_phase{model="m",canary="v2",phase="running"} 0',
        'homing_rollout_phase{model="m",canary="v2",phase="paused"} 1',
    ]
    return "\n".join(lines) + "\n"


def test_view_draws_a_versions_table_for_a_model_with_several() -> None:
    frame = compute_frame(
        [parse_scrape(_versions_text(1), 0.0), parse_scrape(_versions_text(3), 2.0)]
    )
    console = Console(width=200, record=True)
    console.print(render(frame, "SRC"))
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    start = lines.index("versions")
    assert lines[start + 1].split() == [
        "MODEL",
        "VERSION",
        "WEIGHT",
        "REQ/S",
        "ERRORS",
        "ATTAIN",
        "TTFT",
        "p95",
        "TPOT",
        "p95",
        "ROLLOUT",
    ]
    # (20 requests, 2 of 20 failed) and (10, 2 of 10) over 2 s; no histograms
    assert lines[start + 2].split() == ["m", "-", "90%", "10.0", "10.0%", "90.0%", "-", "-", "-"]
    assert lines[start + 3].split() == [
        "m",
        "v2",
        "10%",
        "5.0",
        "20.0%",
        "80.0%",
        "-",
        "-",
        "canary",
        "paused",
    ]
    assert lines.index("versions") < lines.index("workers")
    assert (weight(12.5), weight(100.0), weight(None)) == ("12.5%", "100%", "-")


def test_view_has_no_versions_table_when_every_model_has_one_version() -> None:
    text = (
        'homing_requests_total{model="m",version="v1",worker="w0",outcome="ok"} 1\n'
        'homing_version_weight{model="m",version="v1"} 100\n'
    )
    console = Console(width=200, record=True)
    console.print(render(compute_frame([parse_scrape(text, 1.0)]), "SRC"))
    assert "versions" not in [line.rstrip() for line in console.export_text().splitlines()]


def _flaky(n: int) -> Reply:
    """Scrapes 2 and 3 fail with a 500; the others grow like `_growing`."""
    return (500, "down") if n in (2, 3) else _growing(n)


def test_live_json_streams_frames_survives_a_failed_scrape_and_exits_0_on_sigint(
    server: tuple[str, Callable[[Callable[[int], Reply]], None]],
) -> None:
    """One JSON frame per line; a scrape answered 500 is a stderr line and the next frame
    still comes; SIGINT (Ctrl-C) ends it with status 0 and no traceback."""
    base, answer = server
    answer(_flaky)
    command = [sys.executable, "-m", "homing", "top", "--url", base, "--interval", "0.05"]
    proc = subprocess.Popen(
        [*command, "--output", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT prints every thread's stack
    )
    try:
        assert proc.stdout is not None
        frames = [json.loads(proc.stdout.readline()) for _ in range(3)]  # scrapes 0, 1, 4
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"homing top still ran 30 s after SIGINT; where it was:\n{err[-8000:]}")
    assert proc.returncode == 0, err
    assert [f["scrapes"] for f in frames] == [1, 2, 3]
    assert frames[0]["models"][0]["requests_per_second"] is None
    assert frames[2]["models"][0]["requests_per_second"] > 0
    lines = err.splitlines()
    assert (
        lines[:2]
        == [f"homing: last scrape failed: {base}/metrics answered HTTP 500 Internal Server Error"]
        * 2
    )
    assert "Traceback" not in err


def _odd_server(body: Callable[[BaseHTTPRequestHandler], None]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.end_headers()
            try:
                body(self)
            except OSError:  # the scraper gave up
                pass

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    return httpd


def test_a_scrape_that_never_ends_is_refused_past_its_size_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import homing.top.main as top_main

    monkeypatch.setattr(top_main, "MAX_BODY_BYTES", 1 << 20)

    def endless(handler: BaseHTTPRequestHandler) -> None:
        while True:
            handler.wfile.write(b"homing_x 1\n" * 4096)

    httpd = _odd_server(endless)
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
        with pytest.raises(ScrapeError, match="sent more than 1 MiB of metrics"):
            scrape(url)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_trickling_scrape_is_refused_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    import homing.top.main as top_main

    now = [0.0]
    monkeypatch.setattr(top_main, "SCRAPE_TIMEOUT_S", 5.0)

    def trickle(handler: BaseHTTPRequestHandler) -> None:
        for _ in range(200):
            handler.wfile.write(b"h")
            handler.wfile.flush()
            now[0] += 1.0  # the virtual clock moves a second per byte sent
            time.sleep(0.01)

    httpd = _odd_server(trickle)
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
        with pytest.raises(ScrapeError, match=r"no whole answer .* within 5 s"):
            scrape(url, clock=lambda: now[0])
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_label_values_are_shown_literally_not_as_markup() -> None:
    text = (
        "# TYPE homing_requests_total counter\n"
        'homing_requests_total{model="x[/]",version="",worker="w0",outcome="ok",'
        'finish_reason="stop"} 1\n'
        'homing_worker_kv_usage_ratio{model="x[/]",worker="w0"} 0.5\n'
    )
    frame = compute_frame([parse_scrape(text, 0.0), parse_scrape(text, 1.0)])
    console = Console(width=200, record=True)
    console.print(render(frame, "test"))
    shown = console.export_text()
    assert "x[/]" in shown
    assert literal("w\x1b[31m0").plain == "w\\x1b[31m0"  # control characters escaped

"""The committed Grafana dashboard against a real Prometheus scraping a real `homing serve`.

A `homing serve` over two simulated workers (50x speed) gets a mix of traffic over HTTP:
streamed chat and plain completions from a tenant without limits, a burst past the
admission limit (2 in flight per worker, 1 queued: some 503s), and a tenant with a quota of
2 requests a minute (the rest 429). Prometheus 2.42 (`/usr/bin/prometheus`, Debian's
package) scrapes `/metrics` every second while the traffic runs; then every target of every
panel in `deploy/grafana/homing-dashboard.json` is evaluated through `/api/v1/query` with
Grafana's variables filled in as Grafana would (`$model` the served model, regex-escaped,
and All; `$__rate_interval` a fixed window) and must answer with at least one finite
sample, and the rates of what the traffic did (requests, tokens, goodput, routing, 429s,
503s) with a value above 0. The rollout series (`NO_SPLIT_NO_DATA`) have no series for a
model without a version split or a rollout, as here: their queries must only evaluate.

Skipped when `/usr/bin/prometheus` is missing, unless `HOMING_REQUIRE_PROMETHEUS=1` (then
it fails).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis_server import free_port

PROMETHEUS = "/usr/bin/prometheus"
DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "homing-dashboard.json"
MODEL = "llama-3.1-8b"


def _grafana_regex(value: str) -> str:
    r"""`value` as Grafana's Prometheus data source puts one selected value of a multi-value
    variable into a query: each regex metacharacter after a backslash that is itself escaped
    for the PromQL string literal (`llama-3.1-8b` becomes `llama-3\\.1-8b` in the query
    text, the regex `llama-3\.1-8b`)."""
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


#: `$model` as Grafana fills it in: the served model selected, or "All" (the allValue).
MODEL_CHOICES = {"the served model": _grafana_regex(MODEL), "All": ".*"}
#: `$__rate_interval`: covers the whole traffic phase (TRAFFIC_S) at a 1 s scrape interval.
RATE_INTERVAL = "20s"
TRAFFIC_S = 10.0
#: Targets (panel title, refId) whose value the traffic must raise above 0: rates of what it
#: did (requests, tokens, goodput, routing, the 429s and 503s).
MUST_RISE = {
    ("Request rate by outcome", "A"),
    ("Tokens per second", "A"),
    ("Tokens per second", "B"),
    ("Goodput (requests/s)", "A"),
    ("Goodput (tokens/s)", "A"),
    ("Router decisions by branch", "A"),
    ("Admission queue", "B"),
    ("Quota rejections by tenant", "A"),
}
#: Targets (panel title, refId) of series a model has only under a version split or a
#: rollout (`homing.rollout.metrics`); the gateway here serves one version without either.
NO_SPLIT_NO_DATA = {
    ("Version weight", "A"),
    ("Rollout phase", "A"),
    ("Rollout phase", "B"),
    ("Rollout verdicts and rollbacks", "A"),
    ("Rollout verdicts and rollbacks", "B"),
}
MAIN_KEY = "sk-main-grafana-test"
TINY_KEY = "sk-tiny-grafana-test"

pytestmark = pytest.mark.timeout(120)


def _sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """Status and body of `GET url`; (0, b"") when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError:
        return 0, b""


def _wait_for(
    what: str,
    check: Callable[[], bool],
    within_s: float,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    """Poll `check` every 0.2 s until true; fail naming `what` after `within_s`, or at once
    when `proc` exits (with the tail of its `log`)."""
    deadline = time.monotonic() + within_s
    while not check():
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-4000:] if log is not None else ""
            pytest.fail(f"{what}: process exited with {proc.returncode}\n{tail}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {within_s} s")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 15 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Homing:
    """A running `homing serve`: its HTTP port."""

    port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Prometheus:
    """A running Prometheus: its HTTP port."""

    port: int

    def query(self, expr: str) -> dict[str, Any]:
        """The JSON answer of `/api/v1/query?query=expr` (instant, at now)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        status, body = _get(url, timeout=10)
        if not body:
            return {"status": "error", "error": f"HTTP {status}, no body"}
        answer: dict[str, Any] = json.loads(body)
        return answer

    def samples(self, expr: str) -> list[dict[str, Any]]:
        """The result vector of `expr`; [] on error or no data."""
        answer = self.query(expr)
        return answer["data"]["result"] if answer.get("status") == "success" else []


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    if os.path.exists(PROMETHEUS):
        return PROMETHEUS
    reason = (
        f"{PROMETHEUS} is missing: run `make test` (it installs Debian's prometheus package) "
        "or `apt-get install prometheus`"
    )
    if os.environ.get("HOMING_REQUIRE_PROMETHEUS") == "1":
        pytest.fail(f"HOMING_REQUIRE_PROMETHEUS=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def homing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Homing]:
    """`homing serve` on free ports over 2 simulated workers at 50x, with two tenants
    ("main": no limits; "tiny": 2 requests a minute) and a small admission limit."""
    here = tmp_path_factory.mktemp("homing")
    port = free_port()
    config = here / "homing.toml"
    config.write_text(
        f"""
[gateway]
host = "127.0.0.1"
port = {port}
grpc_port = {free_port()}
drain_timeout_s = 1.0

[sim]
workers = 2
speedup = 50.0

[admission]
max_queued = 1
max_in_flight_per_replica = 2
queue_timeout_s = 5.0

[admin]
enabled = false

[[tenants]]
name = "main"

[[tenants.keys]]
id = "main-key"
sha256 = "{_sha256(MAIN_KEY)}"

[[tenants]]
name = "tiny"
quota = {{ requests_per_minute = 2 }}

[[tenants.keys]]
id = "tiny-key"
sha256 = "{_sha256(TINY_KEY)}"
"""
    )
    log = here / "homing.log"  # a log line per request: a pipe nobody reads would fill
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "homing", "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "HOMING_STATE_DIR": str(here)},
        )
    try:
        server = Homing(port)
        ready = lambda: _get(f"{server.base}/ready")[0] == 200  # noqa: E731
        _wait_for("homing serve ready", ready, 60, proc, log)
        yield server
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def prometheus(
    prometheus_binary: str, homing: Homing, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    """Prometheus scraping the gateway's `/metrics` every second (tmp storage, free port),
    running once its target is up."""
    here = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    scrape = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "homing",
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "static_configs": [{"targets": [f"127.0.0.1:{homing.port}"]}],
            }
        ],
    }
    config = here / "prometheus.yml"
    config.write_text(json.dumps(scrape))  # JSON is YAML
    log = here / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                prometheus_binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={here / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        server = Prometheus(port)
        _wait_for(
            "prometheus ready",
            lambda: _get(f"http://127.0.0.1:{port}/-/ready")[0] == 200,
            30,
            proc,
            log,
        )
        _wait_for(
            "prometheus scraping homing (up == 1)",
            lambda: [s["value"][1] for s in server.samples('up{job="homing"}')] == ["1"],
            20,
            proc,
            log,
        )
        yield server
    finally:
        _stop(proc)


def _post(homing: Homing, path: str, key: str, body: dict[str, Any]) -> int:
    """POST a JSON body with `Authorization: Bearer key`; the status (the body is read)."""
    req = urllib.request.Request(
        f"{homing.base}{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as err:
        err.read()
        return err.code


SYSTEM = "You are homing's test assistant. Answer briefly and precisely. " * 8


def _chat(turn: int, stream: bool, max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "stream": stream,
        "max_tokens": max_tokens,
        "messages": [
            {"role": "system", "content": SYSTEM},  # a shared prefix: cache hits
            {"role": "user", "content": f"Question number {turn}: what is {turn} squared?"},
        ],
    }


@pytest.fixture(scope="module")
def traffic(homing: Homing, prometheus: Prometheus) -> Counter[int]:
    """About TRAFFIC_S seconds of requests while Prometheus scrapes; the statuses answered.

    Steady traffic from 3 clients (streamed chat and plain completions with a shared
    prefix, 16 tokens) throughout, and two rounds of refusals: the tiny tenant's requests
    past its quota (429) and a burst of 10 at once past the admission limit (4 in flight,
    1 queued, the rest 503). Between the rounds Prometheus must have scraped the refusal
    counters: a counter first exported at a non-zero value shows no rise in rate(), so the
    second round is what the rate panels see. Returns after Prometheus has scraped the
    gateway once more after the last answer.
    """
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def record(status: int) -> None:
        with lock:
            statuses[status] += 1

    def client(n: int) -> None:
        turn = 0
        while not stop.is_set():
            turn += 1
            if turn % 2:
                body = _chat(turn, stream=True, max_tokens=16)
                record(_post(homing, "/v1/chat/completions", MAIN_KEY, body))
            else:
                body = {"model": MODEL, "prompt": f"{SYSTEM} Count to {turn}.", "max_tokens": 16}
                record(_post(homing, "/v1/completions", MAIN_KEY, body))
            stop.wait(0.05 * n)  # pacing, not ordering

    def refusals(pool: ThreadPoolExecutor, tiny: int) -> None:
        for turn in range(tiny):
            record(_post(homing, "/v1/chat/completions", TINY_KEY, _chat(turn, False, 4)))
        burst = threading.Barrier(10)

        def one(i: int) -> None:
            burst.wait(10)
            record(_post(homing, "/v1/chat/completions", MAIN_KEY, _chat(1000 + i, True, 512)))

        for f in [pool.submit(one, i) for i in range(10)]:
            f.result()

    with ThreadPoolExecutor(max_workers=13) as pool:
        clients = [pool.submit(client, n) for n in (1, 2, 3)]
        try:
            refusals(pool, tiny=5)  # 2 within the quota, 3 refused
            _wait_for(
                "Prometheus has scraped the refusal counters",
                lambda: bool(
                    prometheus.samples("homing_rate_limited_total")
                    and prometheus.samples("homing_admission_rejected_total")
                ),
                10,
            )
            stop.wait(TRAFFIC_S / 2)
            refusals(pool, tiny=3)
            stop.wait(TRAFFIC_S / 4)
        finally:
            stop.set()
            for f in clients:
                f.result()
    ended = time.time()
    _wait_for(
        "a scrape after the traffic ended",
        lambda: any(
            float(s["value"][1]) > ended + 0.1
            for s in prometheus.samples('timestamp(up{job="homing"})')
        ),
        10,
    )
    # The events some panels need happened (else the test's traffic, not the dashboard, is
    # at fault).
    assert statuses[200] > 20, statuses
    assert statuses[429] >= 6, f"the tiny tenant's quota did not answer 429: {statuses}"
    assert statuses[503] >= 2, f"the bursts did not get 503s from admission: {statuses}"
    return statuses


def _targets() -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every panel target in the committed dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                found.append((inner["title"], target["refId"], target["expr"]))
    return found


def _substitute(expr: str, model: str) -> str:
    return (
        expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("${model}", model)
        .replace("$model", model)
    )


def test_every_dashboard_query_returns_data_from_a_scraped_gateway(
    prometheus: Prometheus, traffic: Counter[int]
) -> None:
    """Each panel target's query, with Grafana's variables filled in ($model: the served
    model, and All), evaluates with status "success" and at least one finite sample (a
    histogram_quantile over no observations in the window would be NaN); the rollout
    series' queries (`NO_SPLIT_NO_DATA`) with status "success" only."""
    targets = _targets()
    assert MUST_RISE | NO_SPLIT_NO_DATA <= {(title, ref) for title, ref, _ in targets}
    failures = []
    for title, ref, expr in targets:
        for choice, model in MODEL_CHOICES.items():
            query = _substitute(expr, model)
            where = f"panel {title!r} target {ref} ($model = {choice})"
            assert not re.search(r"\$\{?\w", query), f"{where}: a variable is left in {query}"
            answer = prometheus.query(query)
            if answer.get("status") != "success":
                failures.append(f"{where}: {answer.get('error')} in {query}")
                continue
            values = [float(s["value"][1]) for s in answer["data"]["result"]]
            if (title, ref) in NO_SPLIT_NO_DATA:
                continue
            if not any(math.isfinite(v) for v in values):
                failures.append(f"{where}: no data ({values}) for {query}")
            elif (title, ref) in MUST_RISE and not any(v > 0 for v in values):
                failures.append(f"{where}: the traffic did not raise it ({values}): {query}")
    assert not failures, "panels without data:\n" + "\n".join(failures)


def test_model_variable_lists_the_served_model(
    prometheus: Prometheus, traffic: Counter[int]
) -> None:
    """The `model` variable's `label_values(homing_requests_total, model)` (Grafana asks
    Prometheus's label-values API with that match) offers the served model."""
    dashboard = json.loads(DASHBOARD.read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "model"]
    match = re.fullmatch(r"label_values\((\w+), *(\w+)\)", variable["query"])
    assert match, variable["query"]
    series, label = match.groups()
    url = f"http://127.0.0.1:{prometheus.port}/api/v1/label/{label}/values?" + (
        urllib.parse.urlencode({"match[]": series})
    )
    status, body = _get(url)
    assert status == 200, body
    assert MODEL in json.loads(body)["data"]


def test_quota_panel_names_the_refused_tenant(
    prometheus: Prometheus, traffic: Counter[int]
) -> None:
    """The quota panel's series carry the `tenant` and `quota` labels its legend shows:
    the tiny tenant, refused on its requests-per-minute quota."""
    (expr,) = [e for t, _, e in _targets() if t == "Quota rejections by tenant"]
    labels = [s["metric"] for s in prometheus.samples(_substitute(expr, ".*"))]
    assert {"tenant": "tiny", "quota": "requests"} in labels, labels

"""`homing.top.frame`: the figures of a frame from hand-made `/metrics` texts at two times,
checked against values computed by hand (rates: increase / 5 s; quantiles: Prometheus'
`histogram_quantile` interpolation worked out in the comments)."""

from __future__ import annotations

import math

import pytest

from homing.top.frame import (
    Frame,
    MetricsTextError,
    ModelRow,
    Scrape,
    VersionRow,
    Window,
    WorkerRow,
    compute_frame,
    histogram_quantile,
    parse_scrape,
)

T0, T1 = 100.0, 105.0  # the two scrapes, 5 s apart

BOUNDS = ("0.1", "0.2", "0.3", "0.4", "+Inf")


def _histogram(name: str, series: dict[str, tuple[int, ...]]) -> str:
    """Exposition text of histogram `name`: label text -> cumulative counts per BOUNDS."""
    lines = [f"# TYPE {name} histogram"]
    for labels, counts in series.items():
        for bound, n in zip(BOUNDS, counts, strict=True):
            lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {n}')
        lines.append(f"{name}_count{{{labels}}} {counts[-1]}")
        lines.append(f"{name}_sum{{{labels}}} 1.0")
    return "\n".join(lines) + "\n"


W0 = 'model="m",version="",worker="w0"'
W1 = 'model="m",version="v2",worker="w1"'
W2 = 'model="m",version="",worker="w2"'


def _worker_gauges(worker: str, kv: float, hit: float, healthy: int) -> str:
    labels = f'model="m",worker="{worker}"'
    return (
        f"homing_worker_healthy{{{labels}}} {healthy}\n"
        f"homing_worker_kv_usage_ratio{{{labels}}} {kv}\n"
        f"homing_worker_cache_hit_ratio{{{labels}}} {hit}\n"
    )


TEXT_T0 = (
    "# TYPE homing_requests_total counter\n"
    f'homing_requests_total{{{W0},outcome="ok",finish_reason="stop"}} 10\n'
    f'homing_requests_total{{{W1},outcome="ok",finish_reason="stop"}} 4\n'
    f'homing_requests_total{{{W2},outcome="ok",finish_reason="stop"}} 6\n'
    'homing_requests_total{model="",version="",worker="",outcome="invalid_request",'
    'finish_reason=""} 3\n'
    + _histogram(
        "homing_request_ttft_seconds",
        {W0: (2, 5, 8, 10, 10), W1: (1, 1, 1, 1, 1), W2: (0, 0, 0, 6, 6)},
    )
    + "# TYPE homing_worker_healthy gauge\n"
    + _worker_gauges("w0", 0.1, 0.5, 1)
    + _worker_gauges("w1", 0.2, 0.5, 1)
    + _worker_gauges("w2", 0.3, 0.5, 1)
)

TEXT_T1 = (
    "# TYPE homing_requests_total counter\n"
    # w0: 10 -> 20 (+10) and a new series (+5); w1: 4 -> 9 (+5); w2 gone, counter kept (+0)
    f'homing_requests_total{{{W0},outcome="ok",finish_reason="stop"}} 20\n'
    f'homing_requests_total{{{W0},outcome="ok",finish_reason="length"}} 5\n'
    f'homing_requests_total{{{W1},outcome="ok",finish_reason="stop"}} 9\n'
    f'homing_requests_total{{{W2},outcome="ok",finish_reason="stop"}} 6\n'
    'homing_requests_total{model="",version="",worker="",outcome="invalid_request",'
    'finish_reason=""} 7\n'
    # bucket increases: w0 (0, 8, 16, 16, 16), w1 (0, 0, 2, 3, 4); model (0, 8, 18, 19, 20)
    + _histogram(
        "homing_request_ttft_seconds",
        {W0: (2, 13, 24, 26, 26), W1: (1, 1, 3, 4, 5), W2: (0, 0, 0, 6, 6)},
    )
    + "# TYPE homing_generation_tokens_total counter\n"
    f"homing_generation_tokens_total{{{W0}}} 400\n"
    "# TYPE homing_requests_in_flight gauge\n"
    'homing_requests_in_flight{model="m"} 3\n'
    'homing_admission_queue_depth{model="m"} 1\n'
    'homing_workers{model="m",phase="ready"} 1\n'
    'homing_workers{model="m",phase="draining"} 1\n'
    'homing_workers{model="m",phase="joining"} 0\n'
    "# TYPE homing_worker_healthy gauge\n"
    + _worker_gauges("w0", 0.25, 0.75, 1)
    + _worker_gauges("w1", 0.5, 0.0, 0)
    + 'homing_worker_requests_in_flight{model="m",worker="w0"} 2\n'
    'homing_worker_requests_in_flight{model="m",worker="w1"} 1\n'
    'homing_worker_running_requests{model="m",worker="w0"} 2\n'
    'homing_worker_waiting_requests{model="m",worker="w0"} 1\n'
    'homing_worker_info{model="m",worker="w1",version="",phase="draining",state="draining"} 1\n'
    'homing_slo_burn_rate{model="m",window="5m"} 2.5\n'
    'homing_slo_burn_rate{model="m",window="30m"} 1.5\n'
    'homing_slo_burn_rate{model="m",window="1h"} 0.5\n'
    'homing_slo_burn_rate{model="m",window="6h"} 0.25\n'
    'homing_slo_alert{model="m",severity="page"} 0\n'
    'homing_slo_alert{model="m",severity="ticket"} 1\n'
    'homing_slo_attainment_ratio{model="m"} 0.875\n'
    'homing_goodput_requests_per_second{model="m"} 3.5\n'
    'homing_slo_ttft_seconds{model="m"} 0.5\n'
    'homing_slo_tpot_seconds{model="m"} 0.05\n'
    'homing_slo_objective{model="m"} 0.95\n'
)


@pytest.fixture
def frame() -> Frame:
    return compute_frame([parse_scrape(TEXT_T0, T0), parse_scrape(TEXT_T1, T1)])


def _model(frame: Frame, name: str = "m") -> ModelRow:
    return next(m for m in frame.models if m.model == name)


def _worker(frame: Frame, worker: str) -> WorkerRow:
    return next(w for w in frame.workers if w.worker == worker)


def test_request_rates_are_the_counter_increase_over_the_window(frame: Frame) -> None:
    """m: (10 + 5 + 5 + 0) / 5 s; w0 (15 / 5 s), w1 (5 / 5 s); tokens 400 new / 5 s."""
    assert frame.window_s == 5.0
    assert _model(frame).requests_per_second == 4.0
    assert _worker(frame, "w0").requests_per_second == 3.0
    assert _worker(frame, "w1").requests_per_second == 1.0
    assert _model(frame).output_tokens_per_second == 80.0


def test_model_ttft_quantiles_interpolate_in_the_window_bucket_increases(frame: Frame) -> None:
    """Model increases (0, 8, 18, 19, 20) at le 0.1 .. 0.4, +Inf. p50: rank 10 falls in
    (0.2, 0.3] holding 10 above 8 below: 0.2 + 0.1 * 2/10 = 0.22. p95: rank 19 in (0.3, 0.4]
    holding 1 above 18: 0.3 + 0.1 * 1/1 = 0.4. w2's unchanged buckets add nothing."""
    row = _model(frame)
    assert row.ttft_p50_s == pytest.approx(0.22, rel=1e-12)
    assert row.ttft_p95_s == pytest.approx(0.4, rel=1e-12)


def test_worker_ttft_p95_uses_only_that_workers_series(frame: Frame) -> None:
    """w0 (0, 8, 16, 16, 16): rank 15.2 in (0.2, 0.3]: 0.2 + 0.1 * 7.2/8 = 0.29. w1
    (0, 0, 2, 3, 4): rank 3.8 above every finite bucket, so the highest finite bound 0.4."""
    assert _worker(frame, "w0").ttft_p95_s == pytest.approx(0.29, rel=1e-12)
    assert _worker(frame, "w1").ttft_p95_s == 0.4


def test_worker_gauges_kv_hit_rate_in_flight_and_state(frame: Frame) -> None:
    w0, w1 = _worker(frame, "w0"), _worker(frame, "w1")
    assert (w0.kv_usage_ratio, w0.cache_hit_ratio) == (0.25, 0.75)
    assert (w1.kv_usage_ratio, w1.cache_hit_ratio) == (0.5, 0.0)
    assert (w0.in_flight, w0.running, w0.waiting) == (2.0, 2.0, 1.0)
    assert (w1.in_flight, w1.running, w1.waiting) == (1.0, None, None)
    assert (w0.state, w0.phase) == ("healthy", None)
    assert (w1.state, w1.phase) == ("unhealthy", "draining")


def test_slo_figures_burn_rates_and_firing_alerts(frame: Frame) -> None:
    row = _model(frame)
    assert (row.burn_rate_1h, row.burn_rate_5m) == (0.5, 2.5)
    assert row.alerts == ["ticket"]
    assert (row.goodput_requests_per_second, row.attainment_ratio) == (3.5, 0.875)
    assert (row.slo_ttft_s, row.slo_tpot_s, row.slo_objective) == (0.5, 0.05, 0.95)
    assert (row.in_flight, row.queued) == (3.0, 1.0)
    assert row.workers == {"draining": 1, "ready": 1}


def test_missing_series_are_none(frame: Frame) -> None:
    """No TPOT histogram: no p95. In a text with only the loop gauge and a model's phase
    counts, every figure of the model is None."""
    assert _model(frame).tpot_p95_s is None
    bare = 'homing_event_loop_busy_ratio 0.1\nhoming_workers{model="m",phase="ready"} 2\n'
    row = compute_frame([parse_scrape(bare, T0), parse_scrape(bare, T1)]).models[0]
    assert row == ModelRow(
        model="m",
        workers={"ready": 2},
        **{
            name: None for name in ModelRow.__dataclass_fields__ if name not in ("model", "workers")
        },
    )


def test_a_worker_that_left_between_scrapes_is_not_shown(frame: Frame) -> None:
    """w2 had gauges at T0 and none at T1 (its counters and histograms stay): not a row."""
    assert [(w.model, w.worker) for w in frame.workers] == [("m", "w0"), ("m", "w1")]


def test_the_unknown_model_of_rejected_requests_is_not_a_row(frame: Frame) -> None:
    assert [m.model for m in frame.models] == ["m"]


def test_one_scrape_gives_gauges_but_no_windowed_figures() -> None:
    frame = compute_frame([parse_scrape(TEXT_T1, T1)])
    assert (frame.window_s, frame.scrapes) == (None, 1)
    row, w0 = _model(frame), _worker(frame, "w0")
    assert (row.requests_per_second, row.ttft_p50_s, w0.ttft_p95_s) == (None, None, None)
    assert (row.in_flight, w0.kv_usage_ratio) == (3.0, 0.25)


def test_no_requests_in_the_window_gives_rate_zero_and_no_quantile() -> None:
    frame = compute_frame([parse_scrape(TEXT_T1, T0), parse_scrape(TEXT_T1, T1)])
    assert _model(frame).requests_per_second == 0.0
    assert _model(frame).ttft_p95_s is None


def test_a_counter_that_went_down_was_reset_and_counts_from_zero() -> None:
    """A gateway restart between scrapes: 20 -> 3 counts as 3 requests."""
    before = 'homing_requests_total{model="m",worker="w0"} 20\n'
    after = 'homing_requests_total{model="m",worker="w0"} 3\n'
    frame = compute_frame([parse_scrape(before, T0), parse_scrape(after, T1)])
    assert _model(frame).requests_per_second == 3 / 5


def test_a_declared_counter_without_the_models_series_is_rate_zero() -> None:
    text = '# TYPE homing_requests_total counter\nhoming_workers{model="m",phase="ready"} 1\n'
    frame = compute_frame([parse_scrape(text, T0), parse_scrape(text, T1)])
    assert _model(frame).requests_per_second == 0.0


def test_workers_are_sorted_with_their_numbers_as_numbers() -> None:
    text = "".join(f'homing_worker_healthy{{model="m",worker="w{i}"}} 1\n' for i in (10, 2, 1))
    frame = compute_frame([parse_scrape(text, T0)])
    assert [w.worker for w in frame.workers] == ["w1", "w2", "w10"]


def test_frame_json_has_stable_keys(frame: Frame) -> None:
    data = frame.as_dict()
    assert list(data) == ["window_s", "scrapes", "models", "workers", "versions"]
    assert list(data["models"][0]) == [
        "model",
        "workers",
        "requests_per_second",
        "output_tokens_per_second",
        "in_flight",
        "queued",
        "ttft_p50_s",
        "ttft_p95_s",
        "tpot_p95_s",
        "goodput_requests_per_second",
        "attainment_ratio",
        "slo_ttft_s",
        "slo_tpot_s",
        "slo_objective",
        "burn_rate_1h",
        "burn_rate_5m",
        "alerts",
    ]
    assert list(data["workers"][0]) == [
        "model",
        "worker",
        "state",
        "phase",
        "requests_per_second",
        "ttft_p95_s",
        "in_flight",
        "running",
        "waiting",
        "kv_usage_ratio",
        "cache_hit_ratio",
    ]
    assert list(data["versions"][0]) == [
        "model",
        "version",
        "weight_percent",
        "requests_per_second",
        "error_ratio",
        "attainment_ratio",
        "ttft_p95_s",
        "tpot_p95_s",
        "rollout",
    ]


def _version_text(
    requests: tuple[int, int, int],
    slo: dict[str, tuple[int, int, int]],
    ttft: dict[str, tuple[int, ...]],
    tpot: dict[str, tuple[int, ...]],
) -> str:
    """A scrape of model "m" with versions v1 (worker w0) and v2 (w1, the canary of a running
    rollout) and a quota refusal (version "", never routed), and model "solo" with one
    version and a refusal: `requests` of v1, v2 and the refusal; `slo` version -> (met,
    missed, failed); histograms by version."""
    v1, v2, refused = requests
    rv1 = 'model="m",version="v1",worker="w0"'
    rv2 = 'model="m",version="v2",worker="w1"'
    lines = [
        "# TYPE homing_requests_total counter",
        f'homing_requests_total{{{rv1},outcome="ok",finish_reason="stop"}} {v1}',
        f'homing_requests_total{{{rv2},outcome="ok",finish_reason="stop"}} {v2}',
        'homing_requests_total{model="m",version="",worker="",outcome="rate_limit_exceeded",'
        f'finish_reason=""}} {refused}',
        'homing_requests_total{model="solo",version="v1",worker="s0",outcome="ok",'
        'finish_reason="stop"} 1',
        'homing_requests_total{model="solo",version="",worker="",outcome="no_capacity",'
        'finish_reason=""} 1',
        "# TYPE homing_slo_requests_total counter",
    ]
    for version, counts in slo.items():
        for verdict, n in zip(("met", "missed", "failed"), counts, strict=True):
            labels = f'model="m",version="{version}",verdict="{verdict}"'
            lines.append(f"homing_slo_requests_total{{{labels}}} {n}")
    lines += [
        "# TYPE homing_version_weight gauge",
        'homing_version_weight{model="m",version="v1"} 90',
        'homing_version_weight{model="m",version="v2"} 10',
        "# TYPE homing_rollout_phase gauge",
        'homing_rollout_phase{model="m",canary="v2",phase="running"} 1',
        'homing_rollout_phase{model="m",canary="v2",phase="paused"} 0',
        'homing_rollout_phase{model="m",canary="v2",phase="promoted"} 0',
        'homing_rollout_phase{model="m",canary="v2",phase="rolled_back"} 0',
        # an earlier rollout's canary, no longer served: no row of its own
        'homing_rollout_phase{model="m",canary="v0",phase="promoted"} 1',
        "# TYPE homing_worker_info gauge",
        'homing_worker_info{model="m",worker="w0",version="v1",phase="ready",state="ready"} 1',
        'homing_worker_info{model="m",worker="w1",version="v2",phase="ready",state="ready"} 1',
    ]
    body = "\n".join(lines) + "\n"
    labels = {v: f'model="m",version="{v}",worker="{w}"' for v, w in (("v1", "w0"), ("v2", "w1"))}
    body += _histogram("homing_request_ttft_seconds", {labels[v]: c for v, c in ttft.items()})
    body += _histogram("homing_request_tpot_seconds", {labels[v]: c for v, c in tpot.items()})
    return body


ZERO = (0, 0, 0, 0, 0)
VERSIONS_T0 = _version_text(
    (10, 2, 1),
    {"v1": (8, 1, 1), "v2": (2, 0, 0)},
    {"v1": ZERO, "v2": ZERO},
    {"v1": ZERO},
)
# Increases: requests v1 +20, v2 +5, "" +5; verdicts v1 (18, 1, 1), v2 (3, 0, 2).
VERSIONS_T1 = _version_text(
    (30, 7, 6),
    {"v1": (26, 2, 2), "v2": (5, 0, 2)},
    {"v1": (10, 20, 20, 20, 20), "v2": (0, 0, 4, 5, 5)},
    {"v1": (20, 20, 20, 20, 20)},
) + (
    # a version whose worker is joining: no request yet
    'homing_worker_info{model="m",worker="w2",version="v3",phase="joining",state="joining"} 1\n'
)


def test_versions_of_a_model_with_several_are_rows_side_by_side() -> None:
    """m's versions: v1, v2 (requests, workers, weights), v3 (a worker); a refusal's "" is
    no version (never routed), so "solo" has one version and no rows.

    v1: 20 / 5 s; verdicts 20 judged, 1 failed, 18 met; TTFT increases (10, 20, 20, 20, 20):
    rank 19 in (0.1, 0.2] holding 10 above 10: 0.1 + 0.1 * 9/10 = 0.19; TPOT (20, ...): rank
    19 in (0, 0.1]: 0.1 * 19/20 = 0.095. v2: 5 / 5 s; 5 judged, 2 failed, 3 met; TTFT
    (0, 0, 4, 5, 5): rank 4.75 in (0.3, 0.4] holding 1 above 4: 0.375; no TPOT."""
    frame = compute_frame([parse_scrape(VERSIONS_T0, T0), parse_scrape(VERSIONS_T1, T1)])
    assert [(v.model, v.version) for v in frame.versions] == [
        ("m", "v1"),
        ("m", "v2"),
        ("m", "v3"),
    ]
    v1, v2, v3 = frame.versions
    assert v1 == VersionRow(
        "m", "v1", 90.0, 4.0, 0.05, 0.9, pytest.approx(0.19), pytest.approx(0.095), None
    )
    assert v2 == VersionRow("m", "v2", 10.0, 1.0, 0.4, 0.6, pytest.approx(0.375), None, "running")
    assert v3 == VersionRow("m", "v3", None, 0.0, None, None, None, None, None)


def test_version_rows_of_one_scrape_have_gauges_only() -> None:
    frame = compute_frame([parse_scrape(VERSIONS_T1, T1)])
    v2 = next(v for v in frame.versions if v.version == "v2")
    assert (v2.weight_percent, v2.rollout) == (10.0, "running")
    assert (v2.requests_per_second, v2.error_ratio, v2.ttft_p95_s) == (None, None, None)


def test_the_empty_version_is_a_row_when_one_of_several(frame: Frame) -> None:
    """The fixture's workers: w0 and w2 without a label, w1 with v2. TTFT of "": w0's
    increases (0, 8, 16, 16, 16) (w2's are 0): 0.29 as w0's own."""
    assert [(v.version, v.requests_per_second) for v in frame.versions] == [("", 3.0), ("v2", 1.0)]
    assert frame.versions[0].ttft_p95_s == pytest.approx(0.29, rel=1e-12)
    assert frame.versions[1].ttft_p95_s == 0.4


def test_a_model_with_one_version_has_no_version_rows() -> None:
    """Workers all without a label: one version, no rows."""
    text = (
        "# TYPE homing_requests_total counter\n"
        f'homing_requests_total{{{W0},outcome="ok",finish_reason="stop"}} 1\n'
        f'homing_requests_total{{{W2},outcome="ok",finish_reason="stop"}} 2\n'
    )
    assert compute_frame([parse_scrape(text, T0), parse_scrape(text, T1)]).versions == []


def test_a_rolled_back_canary_is_marked() -> None:
    text = (
        'homing_version_weight{model="m",version="v1"} 100\n'
        'homing_version_weight{model="m",version="v2"} 0\n'
        'homing_rollout_phase{model="m",canary="v2",phase="running"} 0\n'
        'homing_rollout_phase{model="m",canary="v2",phase="rolled_back"} 1\n'
    )
    frame = compute_frame([parse_scrape(text, T0)])
    assert [(v.version, v.weight_percent, v.rollout) for v in frame.versions] == [
        ("v1", 100.0, None),
        ("v2", 0.0, "rolled_back"),
    ]


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        # rank 10 reaches the first bucket: 0 + 0.1 * 10/10
        (0.5, [(0.1, 10), (0.2, 20), (math.inf, 20)], 0.1),
        # rank 15 in (0.1, 0.2] holding 10 above 10: 0.1 + 0.1 * 5/10
        (0.75, [(0.1, 10), (0.2, 20), (math.inf, 20)], 0.15),
        # bucket order does not matter
        (0.75, [(math.inf, 20), (0.2, 20), (0.1, 10)], 0.15),
        # rank 9.5 in the +Inf bucket: the highest finite bound
        (0.95, [(0.1, 5), (0.2, 5), (math.inf, 10)], 0.2),
        # a first bucket with bound <= 0 gives that bound
        (0.25, [(0.0, 5), (1.0, 10), (math.inf, 10)], 0.0),
        # a count that goes down is raised to the one before it: (10, 10, 20)
        (0.5, [(0.1, 10), (0.2, 7), (math.inf, 20)], 0.1),
        # no observations, one bucket, no +Inf bucket: no quantile (NaN in Prometheus)
        (0.5, [(0.1, 0), (math.inf, 0)], None),
        (0.5, [(math.inf, 4)], None),
        (0.5, [(0.1, 2), (0.2, 4)], None),
        (0.5, [], None),
    ],
)
def test_histogram_quantile_follows_prometheus(
    q: float, buckets: list[tuple[float, float]], expected: float | None
) -> None:
    got = histogram_quantile(q, buckets)
    assert got == (None if expected is None else pytest.approx(expected, rel=1e-12))


def test_histogram_quantile_refuses_q_outside_0_1() -> None:
    with pytest.raises(ValueError, match="outside"):
        histogram_quantile(1.5, [(0.1, 1), (math.inf, 1)])


@pytest.mark.parametrize(
    "text", ["<html><body>hi</body></html>", '{"a": 1}', "", "node_load1 0.5\n"]
)
def test_text_that_is_not_homing_metrics_is_refused(text: str) -> None:
    with pytest.raises(MetricsTextError):
        parse_scrape(text, T0)


def test_created_samples_are_dropped_and_counter_families_keep_their_base_name() -> None:
    text = (
        "# TYPE homing_requests_total counter\n"
        'homing_requests_total{model="m"} 1\n'
        'homing_requests_created{model="m"} 1.7e9\n'
    )
    scrape = parse_scrape(text, T0)
    assert set(scrape.samples) == {"homing_requests_total"}
    assert "homing_requests" in scrape.families


def _scrape(at: float) -> Scrape:
    return parse_scrape(f'homing_requests_total{{model="m"}} {at}\n', at)


def test_window_keeps_the_last_span_of_scrapes_and_at_least_two() -> None:
    window = Window(span_s=30.0)
    for at in range(0, 40):
        window.add(_scrape(float(at)))
    assert len(window) == 31  # 9 .. 39
    assert window.frame().window_s == 30.0
    assert window.frame().models[0].requests_per_second == 1.0
    sparse = Window(span_s=1.0, scrapes=[_scrape(0.0), _scrape(10.0), _scrape(20.0)])
    assert (len(sparse), sparse.frame().window_s) == (2, 10.0)


def test_window_refuses_a_scrape_older_than_its_newest() -> None:
    window = Window(scrapes=[_scrape(5.0)])
    with pytest.raises(ValueError, match="oldest first"):
        window.add(_scrape(4.0))


def test_series_without_their_labels_are_skipped_not_fatal() -> None:
    """A phase count without `phase`, an alert without `severity`, a bucket with a bad `le`."""
    text = (
        'homing_workers{model="m"} 2\n'
        'homing_slo_alert{model="m"} 1\n'
        'homing_request_ttft_seconds_bucket{model="m",le="x"} 1\n'
        'homing_request_ttft_seconds_bucket{model="m",le="+Inf"} 1\n'
    )
    row = compute_frame([parse_scrape(text, T0), parse_scrape(text, T1)]).models[0]
    assert (row.workers, row.alerts, row.ttft_p95_s) == ({}, [], None)

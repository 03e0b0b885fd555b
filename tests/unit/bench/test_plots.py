"""Bench pictures: the plotted series on hand-made records, and the PNG files themselves."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.image import imread

from homing.bench.plots import (
    PLOT_FILES,
    auto_bin_s,
    binned_rates,
    cdf,
    fraction_at_most,
    hit_rate_series,
    in_flight_series,
    tpot_values_ms,
    ttft_values_ms,
    write_comparison_plots,
    write_plots,
)
from homing.bench.records import RequestRecord
from homing.bench.report import Slo, summarize

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SLO = Slo(ttft_ms=100.0, tpot_ms=50.0)


def _done(
    index: int,
    worker: str,
    *,
    send: float,
    first: float,
    last: float,
    end: float,
    tokens: int,
    prompt: int,
    cached: int,
) -> RequestRecord:
    return RequestRecord(
        index=index,
        scheduled_s=send,
        sent_prompt_tokens=prompt,
        max_tokens=tokens,
        send_s=send,
        first_token_s=first,
        last_token_s=last,
        end_s=end,
        status=200,
        worker=worker,
        prompt_tokens=prompt,
        completion_tokens=tokens,
        cached_tokens=cached,
    )


def _failed(index: int, worker: str | None, *, send: float, end: float) -> RequestRecord:
    return RequestRecord(
        index=index,
        scheduled_s=send,
        sent_prompt_tokens=50,
        max_tokens=4,
        send_s=send,
        end_s=end,
        status=400 if worker else None,
        worker=worker,
        error_kind="http_400" if worker else "transport",
        error="HTTP 400: bad" if worker else "refused",
    )


@pytest.fixture
def records() -> list[RequestRecord]:
    """Binary-exact times. Against SLO (100 ms, 50 ms): r0, r2, r3 meet it, r1 misses (TTFT
    250 ms, TPOT 62.5 ms), r4 (w0) and r5 (no worker) failed."""
    rows = [
        # worker, send, first token, last token, end, tokens, prompt, cached
        ("w0", 0.0, 0.0625, 0.125, 0.5, 3, 100, 0),
        ("w1", 0.25, 0.5, 0.75, 1.5, 5, 200, 100),
        ("w0", 0.25, 0.3125, 0.34375, 1.25, 2, 100, 50),
        ("w1", 1.0, 1.0625, 1.0625, 2.5, 1, 300, 300),
    ]
    done = [
        _done(i, w, send=s, first=f, last=la, end=e, tokens=n, prompt=p, cached=c)
        for i, (w, s, f, la, e, n, p, c) in enumerate(rows)
    ]
    return [
        *done,
        _failed(4, "w0", send=2.0, end=2.25),
        _failed(5, None, send=2.0, end=2.0625),
    ]


def test_cdf_gives_distinct_values_and_fractions_at_or_below() -> None:
    """Ties collapse to one point at their upper fraction; NaN and inf are dropped first."""
    assert cdf([2.0, math.nan, 1.0, math.inf, 2.0]) == ([1.0, 2.0], [1 / 3, 1.0])
    assert cdf([]) == ([], [])


def test_fraction_at_most_reads_the_cdf_at_a_point() -> None:
    """Below the smallest value it is 0, at a value it includes that value."""
    xs, ys = cdf([62.5, 250.0, 62.5, 62.5])
    assert (xs, ys) == ([62.5, 250.0], [0.75, 1.0])
    assert [fraction_at_most(xs, ys, x) for x in (62.0, 62.5, 100.0, 250.0)] == [
        0.0,
        0.75,
        0.75,
        1.0,
    ]


def test_ttft_and_tpot_samples_are_the_reports_completed_requests(
    records: list[RequestRecord],
) -> None:
    """TTFT of every completed request; TPOT only where there are >= 2 output tokens."""
    assert ttft_values_ms(records) == [62.5, 250.0, 62.5, 62.5]
    assert tpot_values_ms(records) == [31.25, 62.5, 31.25]
    assert cdf(tpot_values_ms(records)) == ([31.25, 62.5], [2 / 3, 1.0])


def test_binned_rates_count_completed_requests_by_end_time(records: list[RequestRecord]) -> None:
    """1 s bins: ends 0.5 | 1.25, 1.5 | 2.5; r1 (bin 1) misses the SLO; failures are left out."""
    rates = binned_rates(records, 1.0, SLO)
    assert rates.starts == [0.0, 1.0, 2.0]
    assert rates.edges == [0.0, 1.0, 2.0, 3.0]
    assert rates.requests_per_s == [1.0, 2.0, 1.0]
    assert rates.goodput_rps == [1.0, 1.0, 1.0]
    assert rates.tokens_per_s == [3.0, 7.0, 1.0]


def test_binned_rates_keep_empty_bins_and_divide_by_the_bin_width(
    records: list[RequestRecord],
) -> None:
    """0.5 s bins: ends fall in bins 1, 2, 3 and 5; bins 0 and 4 are present with zeros."""
    rates = binned_rates(records, 0.5, SLO)
    assert rates.starts == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert rates.requests_per_s == [0.0, 2.0, 2.0, 2.0, 0.0, 2.0]
    assert rates.goodput_rps == [0.0, 2.0, 2.0, 0.0, 0.0, 2.0]
    assert rates.tokens_per_s == [0.0, 6.0, 4.0, 10.0, 0.0, 2.0]


def test_binned_goodput_adds_up_to_the_reports_good_requests(
    records: list[RequestRecord],
) -> None:
    """Summed over bins, goodput x bin width is the report's count of requests meeting the SLO."""
    summary = summarize(records, slo=SLO)
    good = summary["slo_attainment"] * summary["requests"]
    rates = binned_rates(records, 0.25, SLO)
    assert sum(rates.goodput_rps) * 0.25 == pytest.approx(good)
    assert sum(rates.tokens_per_s) * 0.25 == summary["completion_tokens"]


def test_hit_rate_series_sums_tokens_per_bin(records: list[RequestRecord]) -> None:
    """Bin 0: 0/100; bin 1: (100 + 50)/(200 + 100); bin 2: 300/300."""
    assert hit_rate_series(records, 1.0) == ([0.0, 1.0, 2.0], [0.0, 0.5, 1.0])


def test_hit_rate_series_leaves_out_bins_without_prompt_tokens(
    records: list[RequestRecord],
) -> None:
    """With 0.5 s bins the empty bins 0 and 4 are absent, not NaN."""
    starts, rates = hit_rate_series(records, 0.5)
    assert starts == [0.5, 1.0, 1.5, 2.5]
    assert rates == [0.0, 0.5, 0.5, 1.0]


def test_in_flight_series_steps_per_worker(records: list[RequestRecord]) -> None:
    """w0 holds r0 [0, 0.5), r2 [0.25, 1.25), the failed r4 [2, 2.25); r5 has no worker."""
    series = in_flight_series(records)
    assert list(series) == ["w0", "w1"]
    assert series["w0"] == ([0.0, 0.25, 0.5, 1.25, 2.0, 2.25], [1, 2, 1, 0, 1, 0])
    assert series["w1"] == ([0.25, 1.0, 1.5, 2.5], [1, 2, 1, 0])


def test_in_flight_series_merges_events_at_the_same_time() -> None:
    """One request ending as the next starts gives one point with the count after both."""
    a = _done(0, "w0", send=0.0, first=0.5, last=0.5, end=1.0, tokens=1, prompt=10, cached=0)
    b = _done(1, "w0", send=1.0, first=1.5, last=1.5, end=2.0, tokens=1, prompt=10, cached=0)
    assert in_flight_series([b, a]) == {"w0": ([0.0, 1.0, 2.0], [1, 1, 0])}


@pytest.mark.parametrize(
    ("span", "expected"),
    [(300.0, 5.0), (600.0, 10.0), (7.0, 0.2), (0.12, 0.002), (0.0, 1.0), (math.nan, 1.0)],
)
def test_auto_bin_is_a_round_size_giving_at_most_60_bins(span: float, expected: float) -> None:
    """The smallest 1/2/5 x 10^k with span / size <= 60; 1 s without a span."""
    assert auto_bin_s(span) == expected


def test_bad_bin_width_is_refused(records: list[RequestRecord]) -> None:
    """Zero, negative and NaN widths raise ValueError."""
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="bin_s"):
            binned_rates(records, bad, SLO)
        with pytest.raises(ValueError, match="bin_s"):
            hit_rate_series(records, bad)


def _check_png(path: Path) -> tuple[int, int]:
    """Assert `path` is a readable, non-blank PNG; return (height, width) in pixels."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > 10_000, path
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 500, path
    assert float(image.std()) > 0.01, path  # not a blank canvas
    return image.shape[0], image.shape[1]


def test_write_plots_writes_the_five_pngs(records: list[RequestRecord], tmp_path: Path) -> None:
    """Every file is a valid PNG in a created directory; the paths come back in order."""
    out = tmp_path / "a" / "plots"
    paths = write_plots(records, out, SLO, title="test run")
    assert paths == [out / name for name in PLOT_FILES]
    for path in paths:
        _check_png(path)


@pytest.mark.parametrize(
    "case", ["no records", "only failures"], ids=["no_records", "only_failures"]
)
def test_write_plots_without_completed_requests_still_writes_every_figure(
    case: str, records: list[RequestRecord], tmp_path: Path
) -> None:
    """No completed request (none at all, or only errors) draws 'no data' figures, no crash."""
    data = [] if case == "no records" else [r for r in records if not r.completed]
    paths = write_plots(data, tmp_path, SLO)
    assert [p.name for p in paths] == list(PLOT_FILES)
    for path in paths:
        _check_png(path)


def test_comparison_plots_put_runs_side_by_side(
    records: list[RequestRecord], tmp_path: Path
) -> None:
    """Three runs (one empty) give the same five files; the per-run figures are wider than a
    single run's, and the one-axes figures keep their size."""
    single = {p.name: _check_png(p) for p in write_plots(records, tmp_path / "one", SLO)}
    runs = {"homing round_robin": records, "homing cache_aware": records[:3], "smg": []}
    paths = write_comparison_plots(runs, tmp_path / "cmp", SLO, title="compare")
    compared = {p.name: _check_png(p) for p in paths}
    assert list(compared) == list(PLOT_FILES)
    for name in ("throughput.png", "worker_load.png"):
        assert compared[name][1] > 1.5 * single[name][1]
    for name in ("ttft_cdf.png", "tpot_cdf.png", "cache_hit.png"):
        assert compared[name] == single[name]


def test_comparison_without_runs_is_refused(tmp_path: Path) -> None:
    """An empty mapping is a caller error, not an empty picture."""
    with pytest.raises(ValueError, match="at least one run"):
        write_comparison_plots({}, tmp_path, SLO)


def test_plots_do_not_import_pyplot(tmp_path: Path) -> None:
    """Writing the figures leaves pyplot (its global figure manager and backend) unloaded."""
    script = (
        "import sys\n"
        "from homing.bench.plots import write_plots\n"
        "from homing.bench.report import Slo\n"
        f"write_plots([], {str(tmp_path)!r}, Slo())\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)

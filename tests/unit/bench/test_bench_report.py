"""Percentiles and summary arithmetic on hand-built records."""

from __future__ import annotations

import json

import pytest

from homing.bench.records import RequestRecord
from homing.bench.report import Slo, format_summary, percentile, summarize


def _ok(
    index: int,
    *,
    send: float,
    ttft: float,
    tpot: float,
    tokens: int,
    prompt: int,
    cached: int,
    worker: str,
    scheduled: float | None = None,
) -> RequestRecord:
    first = send + ttft
    last = first + tpot * (tokens - 1)
    return RequestRecord(
        index=index,
        scheduled_s=send if scheduled is None else scheduled,
        sent_prompt_tokens=prompt,
        max_tokens=tokens,
        send_s=send,
        first_token_s=first,
        last_token_s=last,
        end_s=last + 0.001,
        status=200,
        worker=worker,
        prompt_tokens=prompt,
        completion_tokens=tokens,
        cached_tokens=cached,
    )


def _failed(index: int, *, send: float, end: float, worker: str | None) -> RequestRecord:
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
        error="HTTP 400: bad" if worker else "ClientConnectorError: refused",
    )


@pytest.fixture
def records() -> list[RequestRecord]:
    return [
        # meets both SLOs
        _ok(0, send=0.0, ttft=0.1, tpot=0.02, tokens=11, prompt=1000, cached=0, worker="w0"),
        # TTFT 3 s: misses the TTFT SLO; waited 0.5 s for a slot
        _ok(
            1,
            send=1.0,
            ttft=3.0,
            tpot=0.02,
            tokens=6,
            prompt=1000,
            cached=512,
            worker="w1",
            scheduled=0.5,
        ),
        # TPOT 80 ms: misses the TPOT SLO
        _ok(2, send=2.0, ttft=0.2, tpot=0.08, tokens=5, prompt=500, cached=500, worker="w0"),
        # one token: no TPOT, meets the SLO on TTFT alone
        _ok(3, send=3.0, ttft=0.3, tpot=0.0, tokens=1, prompt=500, cached=0, worker="w1"),
        _failed(4, send=4.0, end=4.1, worker="w0"),
        _failed(5, send=9.0, end=10.0, worker=None),
    ]


class TestPercentile:
    def test_linear_interpolation_between_ranks(self) -> None:
        """p50 of 1..4 is 2.5 and p95 of 0..100 is 95 (numpy's linear method)."""
        assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
        assert percentile([float(i) for i in range(101)], 95) == 95.0
        assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)

    def test_empty_and_single(self) -> None:
        """No samples gives None; one sample is every percentile."""
        assert percentile([], 50) is None
        assert percentile([7.0], 99) == 7.0

    def test_out_of_range_is_rejected(self) -> None:
        """q outside [0, 100] raises ValueError."""
        with pytest.raises(ValueError):
            percentile([1.0], 101)


class TestSummary:
    def test_counts_and_errors(self, records: list[RequestRecord]) -> None:
        """Errors are counted by kind and never as completed."""
        s = summarize(records, slo=Slo())
        assert (s["requests"], s["completed"], s["errors"]) == (6, 4, 2)
        assert s["errors_by_kind"] == {"http_400": 1, "transport": 1}
        assert [e["index"] for e in s["error_samples"]] == [4, 5]

    def test_latency_percentiles_in_ms(self, records: list[RequestRecord]) -> None:
        """TTFT over completed requests; TPOT only where completion_tokens >= 2."""
        s = summarize(records, slo=Slo())
        assert s["ttft_ms"]["p50"] == pytest.approx(250.0)  # 100, 200, 300, 3000
        assert s["ttft_ms"]["max"] == pytest.approx(3000.0)
        assert s["tpot_ms"]["p50"] == pytest.approx(20.0)  # 20, 20, 80
        assert s["tpot_ms"]["p99"] == pytest.approx(20 + 60 * 0.98)
        assert s["queue_delay_ms"]["max"] == pytest.approx(500.0)

    def test_cache_hit_rate_sums_over_completed(self, records: list[RequestRecord]) -> None:
        """Hit rate = sum cached / sum prompt tokens of completed requests."""
        s = summarize(records, slo=Slo())
        assert s["cache_hit_rate"] == pytest.approx(1012 / 3000, abs=1e-6)
        assert (s["prompt_tokens"], s["cached_tokens"]) == (3000, 1012)

    def test_goodput_and_slo_attainment(self, records: list[RequestRecord]) -> None:
        """Requests 0 and 3 meet the SLO: goodput over duration, attainment over all six."""
        s = summarize(records, slo=Slo(ttft_ms=2000, tpot_ms=50))
        assert s["duration_s"] == pytest.approx(10.0)  # first send 0.0 to last end 10.0
        assert s["goodput_rps"] == pytest.approx(2 / 10.0, abs=1e-6)
        assert s["slo_attainment"] == pytest.approx(2 / 6, abs=1e-6)
        assert s["throughput_tokens_per_s"] == pytest.approx((11 + 6 + 5 + 1) / 10.0)

    def test_looser_slo_admits_more(self, records: list[RequestRecord]) -> None:
        """Raising both bounds lets the slow-TTFT and slow-TPOT requests count."""
        s = summarize(records, slo=Slo(ttft_ms=5000, tpot_ms=100))
        assert s["slo_attainment"] == pytest.approx(4 / 6, abs=1e-6)

    def test_per_worker_groups_by_header(self, records: list[RequestRecord]) -> None:
        """Per-worker counts include errors; token sums cover completed requests only."""
        pw = summarize(records, slo=Slo())["per_worker"]
        assert set(pw) == {"w0", "w1"}
        assert pw["w0"]["requests"] == 3 and pw["w0"]["errors"] == 1
        assert (pw["w0"]["prompt_tokens"], pw["w0"]["cached_tokens"]) == (1500, 500)
        assert (pw["w1"]["prompt_tokens"], pw["w1"]["cached_tokens"]) == (1500, 512)

    def test_empty_run_has_no_ratios(self) -> None:
        """With no records every ratio is None and the summary is still valid JSON."""
        s = summarize([], slo=Slo())
        assert s["requests"] == 0 and s["cache_hit_rate"] is None and s["goodput_rps"] is None
        json.dumps(s, allow_nan=False)

    def test_meta_is_kept_and_table_prints(self, records: list[RequestRecord]) -> None:
        """Meta keys are copied in and the table shows the headline figures and workers."""
        s = summarize(records, slo=Slo(), meta={"trace": "t.jsonl", "speed": 20.0, "limit": 6})
        assert (s["trace"], s["speed"], s["limit"]) == ("t.jsonl", 20.0, 6)
        table = format_summary(s)
        assert "requests 6  completed 4  errors 2" in table
        assert "cache hit rate 33.7%" in table
        assert "w1" in table and "HTTP 400: bad" in table

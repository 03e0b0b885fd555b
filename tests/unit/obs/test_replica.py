"""Per-worker snapshots from load records and the gateway's own request records, and the
recorder's per-request series on a registry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from homing.clock import ManualClock
from homing.obs.replica import RECENT_WINDOW_S, ReplicaStats
from homing.obs.requests import RequestDone, RequestMetrics, RequestRecorder
from homing.obs.slo import Slo
from homing.obs.testing import FakeLoad, FakeWorker, RecordingRecorder, replica_snapshot


def test_a_snapshot_joins_the_load_record_with_the_recent_requests() -> None:
    clock = ManualClock(100.0)
    stats = ReplicaStats(now=clock.now)
    # 1000 prompt tokens, 800 cached: 200 uncached in 0.1 s; 11 tokens in 1 s after the first
    stats.record("w0", failed=False, prompt_tokens=1000, cached_tokens=800, ttft_s=0.1,
                 tpot_s=0.1, completion_tokens=11)  # fmt: skip
    stats.record("w0", failed=True, prompt_tokens=1000, cached_tokens=0, ttft_s=None,
                 tpot_s=None, completion_tokens=0)  # fmt: skip
    clock.advance(2.0)
    worker = FakeWorker(in_flight=3, load=FakeLoad(running=5, waiting=2, token_usage=0.4,
                                                   updated_at=101.5))  # fmt: skip
    s = stats.snapshot("m", worker)
    assert (s.running, s.waiting, s.kv_usage, s.in_flight) == (5, 2, 0.4, 3)
    assert s.load_age_s == pytest.approx(0.5)
    assert s.requests == 2
    assert s.cache_hit_ratio == pytest.approx(800 / 2000)
    assert s.ttft_per_uncached_token_s == pytest.approx(0.1 / 200)
    assert s.tpot_s == pytest.approx(0.1)
    assert s.error_ratio == pytest.approx(0.5)
    assert (s.state, s.reason) == ("ready", None)
    clock.advance(RECENT_WINDOW_S + 5)
    later = stats.snapshot("m", worker)
    assert later.requests == 0 and later.cache_hit_ratio is None and later.error_ratio is None


def test_a_snapshot_says_why_a_worker_takes_no_requests() -> None:
    stats = ReplicaStats(now=ManualClock().now)
    sick = stats.snapshot("m", FakeWorker(healthy=False, last_error="UNAVAILABLE", load=None))
    assert (sick.state, sick.reason, sick.running, sick.kv_usage) == (
        "unhealthy", "UNAVAILABLE", None, None
    )  # fmt: skip
    draining = stats.snapshot("m", FakeWorker(phase="draining"))
    assert (draining.state, draining.reason) == ("draining", "phase draining")


def test_the_snapshot_builder_gives_a_ready_idle_worker_with_overrides() -> None:
    s = replica_snapshot(worker_id="w3", kv_usage=0.9)
    assert (s.worker_id, s.kv_usage, s.state, s.healthy) == ("w3", 0.9, "ready", True)


def test_tenant_labels_are_added_only_when_configured() -> None:
    for tenant_labels, expected in ((False, False), (True, True)):
        registry = CollectorRegistry()
        recorder = RequestRecorder(
            now=ManualClock().now,
            metrics=RequestMetrics(registry, tenant_labels=tenant_labels),
            registry=registry,
        )
        recorder.done(
            RequestDone(
                request_id="r",
                outcome="ok",
                model="m",
                worker="w0",
                tenant="acme",
                ttft_s=0.1,
                queue_s=0.0,
                finish_reason="stop",
            )
        )
        text = generate_latest(registry).decode()
        assert ('tenant="acme"' in text) is expected


def test_the_recording_recorder_keeps_each_report_and_its_verdict() -> None:
    recorder = RecordingRecorder(now=ManualClock().now, default_slo=Slo(ttft_p95_s=0.2))
    recorder.done(RequestDone(request_id="a", outcome="ok", model="m", ttft_s=0.1))
    recorder.done(RequestDone(request_id="b", outcome="ok", model="m", ttft_s=0.3))
    recorder.done(RequestDone(request_id="c", outcome="client_closed", model="m"))
    assert [v for _, v in recorder.reports] == ["met", "missed", None]
    assert recorder.outcomes() == ["ok", "ok", "client_closed"]
    assert recorder.tracker("m").status().attainment == 0.5

"""Outlier ejection as pure policy on a virtual clock: the rule, its guards, its backoff and
probe readmission."""

from __future__ import annotations

from typing import Any

import pytest

from homing.clock import ManualClock
from homing.engines.outliers import (
    Eject,
    OutlierConfig,
    OutlierDetector,
    Probe,
    ProbeResult,
    Readmit,
    Skip,
    allowed_ejections,
    ejection_time,
)
from homing.obs.replica import ReplicaSnapshot
from homing.obs.testing import replica_snapshot

CFG = OutlierConfig(
    interval_s=5.0,
    window_s=15.0,
    factor=3.0,
    consecutive=2,
    min_requests=5,
    base_ejection_s=10.0,
    max_ejection_s=300.0,
)
FAST = 0.01  # s per output token
SLOW = 0.1


def snap(worker_id: str, tpot: float | None = FAST, **fields: Any) -> ReplicaSnapshot:
    """A worker with 10 requests in the window at `tpot`; `phase` also sets `state`."""
    phase = fields.pop("phase", "ready")
    fields.setdefault("state", "ready" if phase == "ready" else phase)
    fields.setdefault("requests", 10)
    fields.setdefault("ttft_per_uncached_token_s", 0.001)
    fields.setdefault("error_ratio", 0.0)
    fields.setdefault("uncached_tokens", fields["requests"] * 1000)
    return replica_snapshot(worker_id=worker_id, phase=phase, tpot_s=tpot, **fields)


class Pool:
    """Snapshots of a pool whose phases follow the plans, on a manual clock."""

    def __init__(self, config: OutlierConfig = CFG, **tpots: float | None) -> None:
        self.clock = ManualClock(1000.0)
        self.detector = OutlierDetector(config, now=self.clock.now)
        self.tpot = dict(tpots)
        self.phase = {w: "ready" for w in tpots}
        self.extra: dict[str, dict[str, Any]] = {w: {} for w in tpots}

    def snapshots(self) -> list[ReplicaSnapshot]:
        return [
            snap(w, self.tpot[w], phase=self.phase[w], **self.extra[w]) for w in sorted(self.tpot)
        ]

    def interval(self) -> Any:
        """Advance one interval and evaluate; apply ejections and readmissions."""
        self.clock.advance(self.detector.config.interval_s)
        plan = self.detector.evaluate(self.snapshots())
        for e in plan.ejections:
            self.phase[e.worker_id] = "ejected"
        for r in plan.readmissions:
            self.phase[r.worker_id] = "ready"
        return plan

    def probe(self, worker_id: str, tpot: float, peer_tpot: float | None) -> bool:
        peer = ProbeResult(True, tpot_s=peer_tpot) if peer_tpot is not None else None
        back = self.detector.probed(worker_id, ProbeResult(True, tpot_s=tpot), peer)
        if back:
            self.phase[worker_id] = "ready"
        return back


def test_a_worker_over_three_times_the_median_for_two_intervals_is_ejected() -> None:
    """One interval over is a strike; the second in a row ejects, for the base time."""
    pool = Pool(w0=SLOW, w1=FAST, w2=FAST)
    assert pool.interval().ejections == []
    plan = pool.interval()
    assert plan.ejections == [Eject("w0", "tpot", SLOW, FAST, 10.0, 1)]
    assert pool.detector.ejected() == ["w0"]


def test_exactly_the_factor_is_not_over() -> None:
    """3x the median is the limit, not past it."""
    pool = Pool(w0=3 * FAST, w1=FAST, w2=FAST)
    assert [pool.interval().ejections for _ in range(4)] == [[], [], [], []]


def test_an_interval_back_in_line_breaks_the_run() -> None:
    """Over, fine, over: never two in a row, never ejected."""
    pool = Pool(w0=SLOW, w1=FAST)
    pool.interval()
    pool.tpot["w0"] = FAST
    pool.interval()
    pool.tpot["w0"] = SLOW
    assert pool.interval().ejections == []
    assert pool.interval().ejections != []


def test_too_few_requests_neither_judge_nor_compare() -> None:
    """Below `min_requests` a worker is not judged, and it is no baseline for others."""
    pool = Pool(w0=SLOW, w1=FAST)
    pool.extra["w0"]["requests"] = 4
    assert [pool.interval().ejections for _ in range(3)] == [[], [], []]
    pool.extra["w0"]["requests"] = 10
    pool.extra["w1"]["requests"] = 4  # now nobody to compare w0 with
    assert [pool.interval().ejections for _ in range(3)] == [[], [], []]


def test_slow_prefill_per_uncached_token_ejects_on_ttft() -> None:
    """TTFT per uncached prompt token over the factor is its own reason."""
    pool = Pool(w0=FAST, w1=FAST, w2=FAST)
    pool.extra["w0"]["ttft_per_uncached_token_s"] = 0.01  # others 0.001
    pool.interval()
    [eject] = pool.interval().ejections
    assert (eject.worker_id, eject.reason) == ("w0", "ttft")


def test_ttft_is_not_judged_on_mostly_cached_prompts() -> None:
    """A worker whose requests prefill 48 tokens each (the hot prefix is cached there) has a
    high TTFT per uncached token without being slow: not judged on it."""
    pool = Pool(w0=FAST, w1=FAST, w2=FAST)
    pool.extra["w0"]["ttft_per_uncached_token_s"] = 0.01
    pool.extra["w0"]["uncached_tokens"] = 10 * 48
    assert [pool.interval().ejections for _ in range(3)] == [[], [], []]


def test_errors_eject_only_past_the_threshold_and_relative_to_the_pool() -> None:
    """0.6 errors among clean peers ejects; 0.3 does not; everyone at 0.6 ejects nobody."""
    pool = Pool(w0=FAST, w1=FAST, w2=FAST)
    pool.extra["w0"]["error_ratio"] = 0.3
    assert [pool.interval().ejections for _ in range(3)] == [[], [], []]
    for w in ("w0", "w1", "w2"):
        pool.extra[w]["error_ratio"] = 0.6
    assert [pool.interval().ejections for _ in range(3)] == [[], [], []]
    pool.extra["w1"]["error_ratio"] = pool.extra["w2"]["error_ratio"] = 0.0
    pool.interval()
    [eject] = pool.interval().ejections
    assert (eject.worker_id, eject.reason, eject.value) == ("w0", "errors", 0.6)


def test_at_most_the_fraction_is_ejected_worst_first() -> None:
    """Two outliers of four with room for one: the worse goes, the other is kept and
    goes only when the first is back."""
    config = OutlierConfig(**{**CFG.__dict__, "max_ejected_fraction": 0.25})
    pool = Pool(config, w0=10 * FAST, w1=20 * FAST, w2=FAST, w3=FAST)
    pool.interval()
    plan = pool.interval()
    assert [e.worker_id for e in plan.ejections] == ["w1"]
    assert plan.skips == [Skip("w0", "tpot", "max_ejected")]
    assert pool.interval().skips == [Skip("w0", "tpot", "max_ejected")]


def test_the_fraction_allows_two_of_four_and_one_of_two() -> None:
    """Half of four is two; a pool of two may always eject one; a pool of one none."""
    assert [allowed_ejections(n, 0.5) for n in (1, 2, 3, 4)] == [0, 1, 1, 2]
    assert allowed_ejections(2, 0.1) == 1
    pool = Pool(w0=SLOW, w1=SLOW, w2=FAST, w3=FAST)
    pool.interval()
    assert sorted(e.worker_id for e in pool.interval().ejections) == ["w0", "w1"]


def test_the_last_ready_worker_is_never_ejected() -> None:
    """A slow worker beside a cordoned fast one is the pool's last ready worker: kept."""
    pool = Pool(config=OutlierConfig(**{**CFG.__dict__, "max_ejected_fraction": 1.0}),
                w0=SLOW, w1=FAST)  # fmt: skip
    pool.phase["w1"] = "cordoned"  # its recent requests still set the baseline
    plans = [pool.interval() for _ in range(4)]
    assert all(p.ejections == [] for p in plans)
    assert plans[-1].skips == [Skip("w0", "tpot", "last_ready")]


def test_a_pool_of_one_never_ejects() -> None:
    """Alone, a worker has nobody to be an outlier against."""
    pool = Pool(w0=SLOW)
    assert [pool.interval() for _ in range(4)][-1].skips == []
    assert pool.detector.ejected() == []


def test_ejection_time_doubles_per_ejection_up_to_the_cap() -> None:
    """10, 20, 40, ... capped at 300 s."""
    assert [ejection_time(n, CFG) for n in (1, 2, 3, 4, 5, 6)] == [10, 20, 40, 80, 160, 300]


def test_a_worker_ejected_again_stays_out_twice_as_long() -> None:
    """Readmitted by its probe while still slow, it is ejected again for 20 s (the grace
    after readmission keeps its old records from counting), and probed only after it."""
    pool = Pool(w0=SLOW, w1=FAST)
    pool.interval()
    assert pool.interval().ejections[0].duration_s == 10.0
    plan = pool.interval()  # 5 s later: not yet probed
    assert plan.probes == []
    plan = pool.interval()  # 10 s after the ejection
    assert plan.probes == [Probe("w0", "w1")]
    assert pool.probe("w0", FAST, FAST)
    for _ in range(2):  # 15 s grace: its records from before are not judged
        assert pool.interval().ejections == []
    assert pool.interval().ejections == []  # judged again: the first strike
    [again] = pool.interval().ejections
    assert (again.duration_s, again.times) == (20.0, 2)
    probes = [pool.interval().probes for _ in range(4)]
    assert probes == [[], [], [], [Probe("w0", "w1")]]


def test_clean_intervals_wear_the_backoff_down() -> None:
    """Each judged interval in line takes one ejection off the count."""
    pool = Pool(w0=SLOW, w1=FAST)
    pool.interval()
    pool.interval()
    pool.interval()
    pool.interval()
    assert pool.probe("w0", FAST, FAST)
    pool.tpot["w0"] = FAST
    for _ in range(2):
        pool.interval()  # grace
    assert pool.detector.times_ejected("w0") == 1
    pool.interval()
    assert pool.detector.times_ejected("w0") == 0


def test_a_probe_within_the_factor_of_its_peer_readmits_else_it_stays() -> None:
    """Slower than 3x its peer: stays ejected and is probed again next interval; a failed
    probe stays too; within the factor, readmitted."""
    pool = Pool(w0=SLOW, w1=FAST)
    for _ in range(4):
        plan = pool.interval()
    assert plan.probes == [Probe("w0", "w1")]
    assert not pool.probe("w0", 0.04, 0.01)
    assert pool.interval().probes == [Probe("w0", "w1")]
    assert not pool.detector.probed("w0", ProbeResult(False, error="UNAVAILABLE"), None)
    assert pool.interval().probes == [Probe("w0", "w1")]
    assert pool.probe("w0", 0.03, 0.01)
    assert pool.detector.ejected() == []


def test_without_a_peer_result_its_own_success_readmits() -> None:
    """The peer's probe failed: the worker's success alone brings it back."""
    pool = Pool(w0=SLOW, w1=FAST)
    for _ in range(4):
        pool.interval()
    peer_failed = ProbeResult(False, error="DEADLINE_EXCEEDED")
    assert pool.detector.probed("w0", ProbeResult(True, tpot_s=1.0), peer_failed)


def test_a_pool_left_without_ready_workers_readmits_its_ejected_ones() -> None:
    """The fast worker turns unhealthy while the slow one is out: the slow one returns."""
    pool = Pool(w0=SLOW, w1=FAST)
    pool.interval()
    pool.interval()
    pool.extra["w1"]["state"] = "unhealthy"
    plan = pool.interval()
    assert plan.readmissions == [Readmit("w0", "no_ready_worker")]
    assert pool.detector.ejected() == []


def test_a_worker_drained_while_ejected_is_no_longer_held() -> None:
    """Another phase than ejected (drain, remove) ends the detector's hold; gone, forgotten."""
    pool = Pool(w0=SLOW, w1=FAST, w2=FAST)
    pool.interval()
    pool.interval()
    pool.phase["w0"] = "draining"
    assert pool.interval().probes == []
    assert pool.detector.ejected() == []
    del pool.tpot["w0"]
    pool.interval()
    assert pool.detector.times_ejected("w0") == 0


@pytest.mark.parametrize(
    "bad",
    [
        {"factor": 1.0},
        {"consecutive": 0},
        {"min_requests": 0},
        {"error_ratio": 0.0},
        {"base_ejection_s": 400.0},
        {"max_ejected_fraction": 0.0},
        {"interval_s": 0.0},
    ],
)
def test_a_config_out_of_range_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        OutlierConfig(**bad)  # type: ignore[arg-type]


def test_rescue_readmits_the_ejected_at_once_when_no_worker_is_ready() -> None:
    """Between intervals: the fast worker dies after the slow one's ejection; `rescue`
    readmits the slow one now (recorded: no longer held), and does nothing while a worker
    is ready."""
    pool = Pool(w0=SLOW, w1=FAST)
    pool.interval()
    pool.interval()
    assert pool.detector.ejected() == ["w0"]
    assert pool.detector.rescue(pool.snapshots()) == []
    pool.extra["w1"]["state"] = "unhealthy"
    assert pool.detector.rescue(pool.snapshots()) == [Readmit("w0", "no_ready_worker")]
    assert pool.detector.ejected() == []

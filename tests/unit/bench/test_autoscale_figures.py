"""The doubling benchmark's arithmetic: the schedule, the oracle, GPU-seconds, p95 windows
and the recovery time."""

from __future__ import annotations

import pytest

from homing.bench.autoscale import (
    Request,
    Schedule,
    Window,
    gpu_seconds,
    oracle_replicas,
    recovery_s,
    ttft_windows,
)


def test_the_schedule_is_steady_then_doubles_linearly_then_holds() -> None:
    s = Schedule(10, steady_s=120, ramp_s=300, hold_s=180)
    assert s.duration_s == 600
    assert [s.concurrency(t) for t in (0, 119, 120, 270, 419, 420, 599)] == [
        10, 10, 10, 15, 20, 20, 20,
    ]  # fmt: skip


def test_the_oracle_holds_the_fewest_replicas_and_gpu_seconds_integrate_them() -> None:
    assert [oracle_replicas(c, 6.0) for c in (0, 1, 6, 7, 12, 13)] == [0, 1, 1, 2, 2, 3]
    assert gpu_seconds([2, 2, 3], gpus_per_replica=8, dt_s=1.0) == 56.0


def test_windows_take_the_p95_of_completed_requests_only() -> None:
    requests = [Request(send_s=i * 0.1, ttft_s=0.01 * (i + 1)) for i in range(100)]
    requests.append(Request(send_s=1.0, ttft_s=50.0, error="cut"))  # failed: not a TTFT
    windows = ttft_windows(requests, width_s=5.0, duration_s=15.0)
    assert [w.requests for w in windows] == [50, 50, 0]
    assert windows[2].ttft_p95_s is None
    assert windows[0].ttft_p95_s is not None and 0.45 <= windows[0].ttft_p95_s <= 0.5


def test_recovery_runs_from_the_first_window_over_the_slo_to_the_next_within_it() -> None:
    w = [Window(i * 10.0, 5, p) for i, p in enumerate([0.2, 0.9, None, 0.8, 0.3, 0.9])]
    assert recovery_s(w, 0.5) == (10.0, 30.0)
    assert recovery_s(w, 0.5, from_s=40.0) == (50.0, None)  # never back within it
    assert recovery_s(w, 1.0) == (None, 0.0)


@pytest.mark.parametrize("speedup", ["0", "-1", "100"])
def test_a_speedup_the_scalers_tick_cannot_follow_exits_2(
    speedup: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from homing.bench.autoscale import main

    with pytest.raises(SystemExit) as caught:
        main(["--speedup", speedup])
    assert caught.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python -m homing.bench.autoscale: error: --speedup must be in (0, 50]: the scaler's "
        f"5 s tick / speedup must stay >= 0.1 s, got {float(speedup):g}"
    )

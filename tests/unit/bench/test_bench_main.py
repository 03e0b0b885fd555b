"""The `homing bench` command line: argument errors, a whole run, an unreachable gateway."""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from homing.bench.main import add_bench_arguments, run_bench
from homing.bench.plots import PLOT_FILES


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    rows = [
        {"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]},
        {"timestamp": 10, "input_length": 530, "output_length": 3, "hash_ids": [0, 2]},
        {"timestamp": 20, "input_length": 40, "output_length": 2, "hash_ids": [3]},
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_defaults_follow_the_contract(trace: Path) -> None:
    """Options default to the documented values."""
    args = _args("--trace", str(trace))
    assert args.url == "http://127.0.0.1:8080" and args.model is None
    assert (args.speed, args.limit, args.concurrency) == (1.0, None, 256)
    assert (args.slo_ttft_ms, args.slo_tpot_ms, args.timeout_s) == (2000.0, 50.0, 600.0)
    assert args.json is None and args.plot is None


def test_missing_trace_file_exits_2_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace path that does not exist is a usage error naming the path."""
    code = run_bench(_args("--trace", str(tmp_path / "nope.jsonl")))
    assert code == 2
    assert "trace file not found" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--speed", "0"], "--speed"),
        (["--limit", "0"], "--limit"),
        (["--concurrency", "0"], "--concurrency"),
        (["--slo-ttft-ms", "-1"], "--slo-ttft-ms"),
        (["--vocab-limit", "10"], "--vocab-limit"),
    ],
)
def test_bad_numbers_exit_2(
    trace: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Out-of-range options are rejected before anything is sent."""
    assert run_bench(_args("--trace", str(trace), *extra)) == 2
    assert message in capsys.readouterr().err


def test_plot_path_that_is_a_file_exits_2(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--plot` must name a directory (new or existing); an existing file is refused."""
    taken = tmp_path / "taken.png"
    taken.write_bytes(b"x")
    assert run_bench(_args("--trace", str(trace), "--plot", str(taken))) == 2
    assert f"--plot {taken}: cannot make that directory (File exists)" in capsys.readouterr().err
    under = taken / "sub"  # under a file: refused before the run, not after it
    assert run_bench(_args("--trace", str(trace), "--plot", str(under))) == 2
    assert f"--plot {under}: cannot make that directory" in capsys.readouterr().err


def test_names_too_long_for_the_file_system_exit_2(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long = str(tmp_path / ("d" * 300))
    assert run_bench(_args("--trace", long)) == 2
    assert f"trace file not found: {long}" in capsys.readouterr().err
    assert run_bench(_args("--trace", str(trace), "--plot", long)) == 2
    assert "cannot make that directory (File name too long)" in capsys.readouterr().err


def test_unknown_extension_and_bad_rows_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A .txt trace and a malformed .jsonl trace are usage errors."""
    txt = tmp_path / "t.txt"
    txt.write_text("x")
    assert run_bench(_args("--trace", str(txt))) == 2
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    assert run_bench(_args("--trace", str(bad))) == 2
    err = capsys.readouterr().err
    assert "unknown trace format" in err and "input_length" in err


def test_unreachable_gateway_exits_1(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without a gateway the model lookup fails with exit code 1 and says why."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert run_bench(_args("--trace", str(trace), "--url", f"http://127.0.0.1:{port}")) == 1
    assert "cannot reach" in capsys.readouterr().err


def test_whole_run_prints_a_table_and_writes_json(
    threaded_gateway: Any, trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A replay exits 0, prints the table and writes the JSON summary (parents created)."""
    gateway, url = threaded_gateway
    out = tmp_path / "deep" / "dir" / "bench.json"
    code = run_bench(
        _args(
            "--trace", str(trace), "--url", url, "--speed", "10", "--limit", "2",
            "--json", str(out), "--no-progress",
        )
    )  # fmt: skip
    assert code == 0
    assert "requests 2  completed 2  errors 0" in capsys.readouterr().out
    summary = json.loads(out.read_text())
    assert summary["model"] == "fake-model" and summary["limit"] == 2
    assert summary["speed"] == 10.0 and summary["trace"] == str(trace)
    assert (summary["requests"], summary["completed"], summary["errors"]) == (2, 2, 0)
    assert set(summary["ttft_ms"]) >= {"p50", "p95", "p99"}
    assert set(summary["tpot_ms"]) >= {"p50", "p95", "p99"}
    assert summary["cache_hit_rate"] == pytest.approx(512 / (600 + 530), abs=1e-6)
    assert summary["slo_attainment"] is not None and summary["goodput_rps"] is not None
    assert summary["duration_s"] > 0 and summary["started_at"]
    assert sum(w["requests"] for w in summary["per_worker"].values()) == 2
    assert len(gateway.bodies) == 2


def test_whole_run_with_plot_writes_the_five_pngs(
    threaded_gateway: Any, trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--plot DIR` creates DIR after the run, writes the PNGs there and names each on stderr."""
    _, url = threaded_gateway
    out = tmp_path / "deep" / "plots"
    code = run_bench(
        _args(
            "--trace", str(trace), "--url", url, "--speed", "10", "--limit", "2",
            "--plot", str(out), "--no-progress",
        )
    )  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err
    for name in PLOT_FILES:
        path = out / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"wrote {path}" in err

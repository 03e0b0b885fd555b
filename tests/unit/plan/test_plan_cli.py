"""`homing plan` through `homing.cli.main`: the seed's chain line by line, JSON, the
follow-ups side by side, `--measure`, and one-line errors with exit status 2."""

from __future__ import annotations

import json

import pytest

from homing.cli import main
from homing.plan.chain import Assumptions
from homing.plan.measure import measure

SEED_CHAIN = """\
base: llama-3.1-70b on 8x H100 (TP8) per replica
  assumptions: 10,000 users, prompt 1,500 tokens (1,000 cached: cache hit 67%), answer 300 \
tokens, p95 TTFT 500 ms, p95 TPOT 50 ms, headroom 20%, $2.50/GPU-h, 730 h/month
  decode demand   = 10,000 users x 0.25 mid-generation x 20 tok/s (1 / 50 ms TPOT) = \
50,000 tok/s
  request rate    = 50,000 tok/s / 300 answer tokens = 166.7 req/s
  prefill demand  = 166.7 req/s x 500 uncached tokens (1,500 - 1,000 cached) = 83,333 tok/s \
(~83,000)
  decode goodput  = 96 sequences at the TPOT SLO (the seed's planning figure) x 20 tok/s = \
1,920 tok/s per replica
  decode replicas = 50,000 / 1,920 = 26.04 (~26)
  with prefill    = 26.04 + 83,333 / 7,467 tok/s per replica (calibrated so the seed's case \
gives its /0.7) = 26.04 + 11.16 = 37.20 (~37): prefill's share 30%, i.e. 26.04 / 0.70
  with headroom   = 37.20 x 1.20 = 44.64 -> 45 replicas (rounded up)
  GPUs            = 45 replicas x 8 GPUs = 360 H100
  cost            = 360 x $2.50/GPU-h = $900/h; x 730 h/month = $657,000/month (~$650k)
  gateway cores   = 166.7 req/s x (2.5 ms + 1,500 prompt tokens x 2 us) + 50,000 streamed \
tok/s x 144 us (bench-overhead and encode_chat timings, 2026-12-07, 2-core VM, \
stream_interval 1) = 0.42 + 0.50 + 7.20 = 8.12 cores
  gateway         = 8.12 cores / 0.7 busy per process = 11.60 -> 12 gateway processes of \
one core (rounded up)
"""


def test_plan_prints_the_seeds_chain_step_by_step(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == (SEED_CHAIN, "")


def test_plan_json_carries_every_step_unrounded_and_the_figures_as_shown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--json"]) == 0
    (scenario,) = json.loads(capsys.readouterr().out)["scenarios"]
    steps = scenario["steps"]
    assert steps["decode_demand_tok_s"] == 50_000
    assert steps["prefill_demand_tok_s"] == pytest.approx(83_333.333)
    assert steps["replicas"] == 45 and steps["gpus"] == 360
    assert (steps["cost_per_hour"], steps["cost_per_month"]) == (900, 657_000)
    assert scenario["shown"] == {
        "decode_demand_tok_s": "50,000 tok/s",
        "prefill_demand_tok_s": "83,333 tok/s (~83,000)",
        "decode_replicas": 26,
        "replicas_before_headroom": 37,
        "replicas": 45,
        "gpus": 360,
        "cost_per_hour": "$900",
        "cost_per_month": "~$650k",
        "gateway_processes": 12,
    }
    assert steps["gateway"] == pytest.approx(
        {
            "request_cores": 166.667 * 2.5e-3,
            "prompt_cores": 166.667 * 1_500 * 2e-6,
            "token_cores": 7.2,
            "cores": 8.1167,
            "processes_unrounded": 11.5952,
            "processes": 12,
        },
        rel=1e-4,
    )
    assert scenario["assumptions"]["gateway"]["token_us"] == 144
    assert scenario["measured"] is None
    assert scenario["assumptions"]["users"] == 10_000


def test_follow_ups_print_each_chain_after_the_base_and_a_table_side_by_side(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "--smaller-model", "--coding", "--agent", "--cache-hit", "0.85"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(SEED_CHAIN + "\nsmaller model: llama-3.1-8b on 1x H100 (TP1)")
    for line in [
        "  GPUs            = 29 replicas x 1 GPU = 29 H100",
        "  cost            = 29 x $2.50/GPU-h = $72.50/h; x 730 h/month = $52,925/month (~$52k)",
        "  GPUs            = 46 replicas x 8 GPUs = 368 H100",
        "  GPUs            = 126 replicas x 8 GPUs = 1,008 H100",
        "  prefill demand  = 166.7 req/s x 225 uncached tokens (1,500 - 1,275 cached) = "
        "37,500 tok/s (~38,000)",
        "  cost            = 304 x $2.50/GPU-h = $760/h; x 730 h/month = $554,800/month (~$550k)",
    ]:
        assert line + "\n" in out
    table = out[out.index("homing plan: side by side") :]
    for name in ("base", "smaller model", "coding", "agent", "cache hit 85%"):
        assert f"│ {name} " in table


def test_plan_measure_prints_and_uses_the_timing_models_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--measure"]) == 0
    out = capsys.readouterr().out
    m = measure(Assumptions())
    assert (
        f"  measured:        decode batch {m.decode_batch} (TPOT-bound: step {m.step_ms:.1f} ms "
        f"at 1,650 tokens of context, p95 = the step time; KV pool {m.kv_capacity_tokens:,} "
        f"tokens), prefill {m.prefill_rate_tok_s:,.0f} tok/s (steps of 8,192 tokens), one "
        f"prompt's prefill alone {m.prompt_prefill_ms:.1f} ms of the 500 ms TTFT SLO\n"
    ) in out
    assert (
        "  decode goodput  = 100 sequences at the TPOT SLO (measured above, timing model) x "
        "20 tok/s = 2,000 tok/s per replica\n"
    ) in out
    assert "  GPUs            = 36 replicas x 8 GPUs = 288 H100\n" in out


def test_a_model_without_tp_takes_the_models_preset_tp(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--model", "llama-3.1-8b", "--json"]) == 0
    (scenario,) = json.loads(capsys.readouterr().out)["scenarios"]
    assert scenario["assumptions"]["tp"] == 1
    assert scenario["steps"]["gpus"] == 45


def test_explicit_figures_replace_the_assumed_ones(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--decode-goodput", "2500", "--prefill-share", "0.3", "--gpu-price", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "  decode goodput  = 2,500 tok/s per replica (--decode-goodput)\n" in out
    assert (
        "  with prefill    = 20.00 / (1 - 0.3 prefill share) = 28.57 (~29; prefill's share "
        "fixed, --prefill-share)\n"
    ) in out
    assert "  cost            = 280 x $3/GPU-h = $840/h;" in out


OVERFLOW = "the chain overflows at"
TOO_LARGE = "the assumptions are too large, or a rate too small, to size"
FINITE = f"(not a finite number): {TOO_LARGE}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--users", "-10"], "--users must be >= 0, got -10"),
        (["--mid-generation", "1.5"], "--mid-generation must be between 0 and 1, got 1.5"),
        (["--cache-hit", "-0.1"], "--cache-hit must be between 0 and 1, got -0.1"),
        (
            ["--cached-tokens", "2000"],
            "--cached-tokens (2,000) must not exceed --prompt-tokens (1,500)",
        ),
        (
            ["--prompt-tokens", "800"],
            "--cached-tokens (1,000) must not exceed --prompt-tokens (800)",
        ),
        (["--tpot-slo-ms", "0"], "--tpot-slo-ms must be > 0, got 0"),
        (["--answer-tokens", "0"], "--answer-tokens must be > 0, got 0"),
        (["--model", "gpt-5"], "unknown model 'gpt-5'; known: llama-3.1-70b, llama-3.1-8b"),
        (
            ["--model", "gpt-5", "--tp", "8"],
            "unknown model 'gpt-5'; known: llama-3.1-70b, llama-3.1-8b",
        ),
        (["--gpu", "FOO"], "unknown GPU 'FOO'; known: H100, H200"),
        (["--measure", "--tp", "100000"], "--tp must be at most 64, got 100000"),
        (
            ["--gpus-per-replica", "1" + "0" * 400],
            "--gpus-per-replica is too large (401 digits)",
        ),
        (["--gpus-per-replica", "513"], "--gpus-per-replica must be at most 512, got 513"),
        (
            ["--prompt-tokens", "9" * 400],
            "--prompt-tokens is too large (400 digits)",
        ),
        (["--headroom", "1e308"], f"{OVERFLOW} the replicas with headroom {FINITE}"),
        (["--decode-goodput", "1e-310"], f"{OVERFLOW} the decode replicas {FINITE}"),
        (
            ["--gpu-price", "1e300", "--hours-per-month", "1e300"],
            f"{OVERFLOW} the cost per month {FINITE}",
        ),
        (
            ["--gpu-price", "1e300", "--hours-per-month", "1e300", "--json"],
            f"{OVERFLOW} the cost per month {FINITE}",
        ),
        (
            ["--think-s", "1e308", "--answer-s", "1e308"],
            f"{OVERFLOW} the answer and think time {FINITE}",
        ),
        (
            ["--users", "1e300"],
            f"{OVERFLOW} the replicas with headroom (4.46e+297 > 1e+12): {TOO_LARGE}",
        ),
        (
            ["--measure", "--tpot-slo-ms", "5"],
            "llama-3.1-70b on 8x H100: no decode batch meets the 5 ms TPOT SLO (one "
            "sequence's step takes 12.8 ms)",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_saying_why(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *argv]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"homing plan: {message}\n")

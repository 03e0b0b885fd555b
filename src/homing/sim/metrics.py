"""Prometheus metrics of one simulated worker, under SGLang's metric names.

Rule of this file: read-only. A `SimMetricsCollector` reads the worker's figures when scraped
(no counters are kept here, so nothing can drift from the scheduler's own numbers); each
worker has its own `CollectorRegistry`, so two workers in one process never share a series.

Names follow SGLang's `sglang:` metrics (`srt/metrics/collector.py`) with the `model_name`
label: running / queued requests, used and total KV tokens, token usage, cache hit rate,
generation and prefill throughput (tokens/s over the last 5 s of simulated time), token and
request counters, and `sglang:num_retracted_reqs_total` (decode retractions since start).
`homing_sim_*` series describe the simulator itself: steps run, modelled wall seconds, how
late steps ended (sum and maximum) and the backlog forgiven (slip: simulated progress lost
because the process could not keep up with its own clock), speedup, and the faults in force.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from homing.sim.engine_loop import LoopStats
from homing.sim.faults import FaultState
from homing.sim.scheduler import LoadStats


@dataclass(frozen=True)
class WorkerSnapshot:
    """What one scrape reads from a worker (None load when the worker is down)."""

    model_name: str
    load: LoadStats | None
    loop: LoopStats
    speedup: float
    faults: FaultState
    restarts: int


class SimMetricsCollector:
    """Yields the worker's metrics from `snapshot()` at every scrape (see the module
    docstring)."""

    def __init__(self, snapshot: Callable[[], WorkerSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        labels = ["model_name"]
        values = [snap.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric(values, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(values, value)
            return family

        load = snap.load
        if load is not None:
            yield gauge("sglang:num_running_reqs", "Running requests.", load.num_running)
            yield gauge("sglang:num_queue_reqs", "Requests in the waiting queue.", load.num_waiting)
            yield gauge(
                "sglang:num_used_tokens",
                "KV tokens held by running requests.",
                load.num_used_tokens,
            )
            yield gauge(
                "sglang:max_total_num_tokens", "KV pool size in tokens.", load.max_total_num_tokens
            )
            yield gauge("sglang:token_usage", "Share of the KV pool in use.", load.token_usage)
            yield gauge(
                "sglang:cache_hit_rate",
                "Prefix-cache hit rate (cached / prompt tokens).",
                load.cache_hit_rate,
            )
            yield gauge(
                "sglang:gen_throughput", "Generation throughput (tokens/s).", load.gen_throughput
            )
            yield gauge(
                "sglang:prefill_throughput",
                "Prefill throughput (tokens/s).",
                load.prefill_throughput,
            )
            yield gauge(
                "sglang:new_token_ratio",
                "Share of remaining output tokens admission reserves.",
                load.new_token_ratio,
            )
            yield counter(
                "sglang:prompt_tokens", "Prompt tokens admitted.", load.prompt_tokens_total
            )
            yield counter(
                "sglang:cached_tokens",
                "Prompt tokens served from the cache.",
                load.cached_tokens_total,
            )
            yield counter(
                "sglang:generation_tokens", "Tokens generated.", load.generation_tokens_total
            )
            yield counter(
                "sglang:prefill_tokens", "Prefill tokens computed.", load.prefill_tokens_total
            )
            yield counter("sglang:num_requests", "Requests finished.", load.requests_finished_total)
            yield counter(
                "sglang:num_retracted_reqs",
                "Requests retracted (preempted) because decode ran out of KV.",
                load.num_retracted,
            )
            yield counter(
                "sglang:num_rejected_reqs",
                "Requests refused because the waiting queue was full.",
                load.requests_rejected_total,
            )
            yield counter(
                "homing_sim_first_tokens",
                "Requests that produced their first token.",
                load.first_tokens_total,
            )
            yield counter(
                "homing_sim_time_to_first_token_seconds",
                "Sum of simulated seconds from arrival to the end of the first token's step.",
                load.ttft_seconds_total,
            )
        yield gauge("homing_sim_up", "1 while the worker serves.", 0.0 if load is None else 1.0)
        yield counter("homing_sim_steps", "Scheduler steps run.", snap.loop.steps)
        yield counter(
            "homing_sim_modeled_wall_seconds",
            "Wall seconds the steps should have taken at this speedup.",
            snap.loop.modeled_wall_s,
        )
        yield counter(
            "homing_sim_lag_wall_seconds",
            "Sum over steps of how late each ended against its deadline (wall seconds).",
            snap.loop.lag_wall_s,
        )
        yield gauge(
            "homing_sim_max_lag_wall_seconds",
            "Latest any step ended against its deadline (wall seconds).",
            snap.loop.max_lag_wall_s,
        )
        yield counter(
            "homing_sim_slip_wall_seconds",
            "Backlog forgiven: wall seconds of simulated progress lost (the process fell behind).",
            snap.loop.slip_wall_s,
        )
        yield gauge("homing_sim_speedup", "Simulated seconds per wall second.", snap.speedup)
        yield gauge("homing_sim_fault_slowdown", "Injected slowdown factor.", snap.faults.slowdown)
        yield gauge(
            "homing_sim_fault_healthy",
            "0 while health is injected false.",
            float(snap.faults.healthy),
        )
        yield counter("homing_sim_restarts", "Injected restarts.", snap.restarts)


def worker_registry(snapshot: Callable[[], WorkerSnapshot]) -> CollectorRegistry:
    """A fresh registry holding one worker's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SimMetricsCollector(snapshot))
    return registry


def scrape_total(text: str, sample: str) -> float:
    """Sum over label sets of the samples named `sample` (e.g.
    "homing_sim_slip_wall_seconds_total") in Prometheus exposition `text`; 0 when absent.
    Parsed with prometheus-client's own text parser."""
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == sample
    )

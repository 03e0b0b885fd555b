"""Router metrics of several models share one Prometheus registry; fleet metrics count
worker lifecycle transitions and report workers per phase."""

from __future__ import annotations

import gc
import weakref

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from smg_grpc_proto.generated import common_pb2

from homing.config import RouterSettings
from homing.obs.metrics import FleetMetrics, RouterMetrics
from homing.router import Router, RouteRequest, WorkerSnapshot
from homing.router.settings import router_from_settings

TOKENS = list(range(100, 132))  # two blocks of 16


def stored_batch(seq: int, tokens: list[int], base_hash: int) -> common_pb2.KvEventBatch:
    """A wire batch storing every full 16-token block of `tokens` as one chain."""
    batch = common_pb2.KvEventBatch(sequence_number=seq)
    ev = batch.events.add(event_id=seq)
    for i in range(len(tokens) // 16):
        ev.stored.blocks.add(block_hash=base_hash + i, token_ids=tokens[i * 16 : (i + 1) * 16])
    return batch


def scrape(registry: CollectorRegistry) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The exposition text of `registry`, parsed: sample name -> sorted labels -> value."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    text = generate_latest(registry).decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def two_models() -> tuple[CollectorRegistry, Router, Router, RouterMetrics, RouterMetrics]:
    """Routers for models "a" and "b" observed by RouterMetrics on one registry."""
    registry = CollectorRegistry()
    ra = router_from_settings(RouterSettings())
    rb = router_from_settings(RouterSettings())
    ma = RouterMetrics(ra, model="a", registry=registry).attach()
    mb = RouterMetrics(rb, model="b", registry=registry).attach()
    return registry, ra, rb, ma, mb


def test_two_models_on_one_registry_count_decisions_under_their_own_label() -> None:
    """Each model's decisions, batches and flushes count under its `model` label only."""
    registry, ra, rb, ma, mb = two_models()
    ra.apply_kv_batch("w1", stored_batch(1, TOKENS, 10), lag_s=0.002)
    da = ra.select(RouteRequest(TOKENS), [WorkerSnapshot("w0"), WorkerSnapshot("w1")])
    db = rb.select(RouteRequest(TOKENS), [WorkerSnapshot("x0")])
    rb.select(RouteRequest(TOKENS), [WorkerSnapshot("x0")])
    rb.flush_worker("x0", "gap")
    assert da.branch == "exact_hit"
    decisions = "homing_router_decisions_total"
    assert ma.value(decisions, policy="cache_aware", branch="exact_hit") == 1
    assert mb.value(decisions, policy="cache_aware", branch=db.branch) == 2
    if db.branch != "exact_hit":
        assert mb.value(decisions, policy="cache_aware", branch="exact_hit") == 0
    assert ma.value("homing_router_kv_event_batches_total", worker="w1") == 1
    assert mb.value("homing_router_kv_event_batches_total", worker="w1") == 0
    assert mb.value("homing_router_kv_gaps_total", worker="x0") == 1
    assert ma.value("homing_router_kv_gaps_total", worker="x0") == 0
    assert registry.get_sample_value("homing_router_matched_prefix_tokens_count", {"model": "a"})
    assert (
        registry.get_sample_value("homing_router_matched_prefix_tokens_count", {"model": "b"}) == 2
    )


def test_scrape_reports_index_gauges_of_every_model() -> None:
    """One scrape has the index, mode and stream gauges of both models, each its own."""
    registry = CollectorRegistry()
    ra = router_from_settings(RouterSettings())
    rb = router_from_settings(RouterSettings())
    RouterMetrics(ra, model="a", registry=registry, streams=lambda: {"w1": "open"}).attach()
    RouterMetrics(rb, model="b", registry=registry, streams=lambda: {"x0": "down"}).attach()
    ra.apply_kv_batch("w1", stored_batch(1, TOKENS, 10), lag_s=None)
    rb.apply_kv_batch("x0", stored_batch(1, TOKENS[:16], 99), lag_s=None)
    samples = scrape(registry)
    blocks = samples["homing_router_index_blocks"]
    assert blocks[(("model", "a"), ("worker", "w1"))] == 2
    assert blocks[(("model", "b"), ("worker", "x0"))] == 1
    assert (("model", "a"), ("worker", "x0")) not in blocks
    totals = samples["homing_router_index_blocks_total"]
    assert totals == {(("model", "a"),): 2, (("model", "b"),): 1}
    assert set(samples["homing_router_index_bytes_total"]) == {(("model", "a"),), (("model", "b"),)}
    assert samples["homing_router_index_evicted_blocks_total"] == {
        (("model", "a"),): 0,
        (("model", "b"),): 0,
    }
    modes = samples["homing_router_worker_mode"]
    assert {labels[0] for labels in modes} == {("mode", "approximate"), ("mode", "exact")}
    assert {dict(labels)["model"] for labels in modes} == {"a", "b"}
    assert samples["homing_router_kv_stream_up"] == {
        (("model", "a"), ("worker", "w1")): 1,
        (("model", "b"), ("worker", "x0")): 0,
    }


def test_same_model_twice_on_one_registry_is_refused_until_detached() -> None:
    """A second RouterMetrics for a model is a ValueError; after `detach` it is allowed and
    goes on counting the model's counters."""
    registry, ra, _, ma, _ = two_models()
    ra.select(RouteRequest(TOKENS), [WorkerSnapshot("w0")])
    with pytest.raises(ValueError, match="'a'"):
        RouterMetrics(ra, model="a", registry=registry)
    ma.detach()
    ma.detach()  # idempotent
    again = RouterMetrics(ra, model="a", registry=registry).attach()
    ra.select(RouteRequest(TOKENS), [WorkerSnapshot("w0")])
    name = "homing_router_matched_prefix_tokens_count"
    assert again.value(name) == 2


def test_detached_model_leaves_the_scrape_time_gauges() -> None:
    """After `detach`, the scrape has only the other model's index gauges."""
    registry, ra, rb, ma, _ = two_models()
    ra.apply_kv_batch("w1", stored_batch(1, TOKENS, 10), lag_s=None)
    rb.apply_kv_batch("x0", stored_batch(1, TOKENS, 20), lag_s=None)
    ma.detach()
    samples = scrape(registry)
    assert samples["homing_router_index_blocks_total"] == {(("model", "b"),): 2}
    assert all(dict(k)["model"] == "b" for k in samples["homing_router_index_blocks"])


def test_registry_and_routers_are_freed_once_unreferenced() -> None:
    """The per-registry series do not keep a registry (or its routers) alive."""
    registry, ra, rb, ma, mb = two_models()
    gone = weakref.ref(registry)
    router_gone = weakref.ref(ra)
    del registry, ra, rb, ma, mb
    gc.collect()
    assert gone() is None and router_gone() is None


def test_fleet_counts_transitions_by_model_action_and_phases() -> None:
    """`on_transition` counts under model, action, from_phase and to_phase."""
    registry = CollectorRegistry()
    fleet = FleetMetrics(registry)
    fleet.on_transition("a", "joined", "joining", "ready")
    fleet.on_transition("a", "joined", "joining", "ready")
    fleet.on_transition("b", "cordon", "ready", "cordoned")
    name = "homing_worker_transitions_total"
    labels = {"action": "joined", "from_phase": "joining", "to_phase": "ready"}
    assert registry.get_sample_value(name, {"model": "a", **labels}) == 2
    assert registry.get_sample_value(name, {"model": "b", **labels}) is None
    assert (
        fleet.value(name, model="b", action="cordon", from_phase="ready", to_phase="cordoned") == 1
    )


def test_fleet_reports_workers_per_phase_and_drops_emptied_phases_to_zero() -> None:
    """`homing_workers` counts each watched model's workers by phase at scrape time; a phase
    seen before reads 0 once empty rather than vanishing."""
    registry = CollectorRegistry()
    fleet = FleetMetrics(registry)
    phases_a = ["joining", "ready", "ready"]
    phases_b = ["ready"]
    fleet.watch("a", lambda: list(phases_a))
    fleet.watch("b", lambda: list(phases_b))
    assert scrape(registry)["homing_workers"] == {
        (("model", "a"), ("phase", "joining")): 1,
        (("model", "a"), ("phase", "ready")): 2,
        (("model", "b"), ("phase", "ready")): 1,
    }
    phases_a[:] = ["ready", "draining"]
    phases_b.clear()
    assert scrape(registry)["homing_workers"] == {
        (("model", "a"), ("phase", "draining")): 1,
        (("model", "a"), ("phase", "joining")): 0,
        (("model", "a"), ("phase", "ready")): 1,
        (("model", "b"), ("phase", "ready")): 0,
    }
    fleet.unwatch("b")
    assert {dict(k)["model"] for k in scrape(registry)["homing_workers"]} == {"a"}


def test_second_fleet_metrics_on_one_registry_is_refused() -> None:
    """FleetMetrics is one per registry: a second is prometheus-client's ValueError."""
    registry = CollectorRegistry()
    FleetMetrics(registry)
    with pytest.raises(ValueError, match="homing_worker"):
        FleetMetrics(registry)


def test_router_and_fleet_metrics_share_one_registry() -> None:
    """The App's case: both kinds of metrics of two models on one registry, one scrape."""
    registry, ra, _, _, _ = two_models()
    fleet = FleetMetrics(registry)
    fleet.watch("a", lambda: ["ready"])
    ra.select(RouteRequest(TOKENS), [WorkerSnapshot("w0")])
    samples = scrape(registry)
    assert samples["homing_workers"] == {(("model", "a"), ("phase", "ready")): 1}
    assert set(samples["homing_router_index_blocks_total"]) == {
        (("model", "a"),),
        (("model", "b"),),
    }

"""Routing policies: round robin cycles, least load picks the minimum, consistent hashing
keeps keys on their worker under a load bound, and cache_aware prices prefix affinity
against queue and load with one cost rule and never lets affinity override an overloaded
worker."""

from __future__ import annotations

import math
import random

import pytest

from homing.router import (
    CacheAwareConfig,
    CacheAwarePolicy,
    ConsistentHashPolicy,
    CostWeights,
    LeastLoadPolicy,
    NoWorkerAvailable,
    PrefixIndex,
    RoundRobinPolicy,
    RouteRequest,
    WorkerSnapshot,
    estimated_cost,
    load_bound,
)
from homing.router.events import TIER_HOST, BlocksStored, StoredBlock
from homing.router.filters import OverloadThresholds, overloaded
from homing.router.ledger import DispatchLedger

BS = 16


def snap(worker_id: str, **kw: float) -> WorkerSnapshot:
    """A snapshot with the given load fields (zeros otherwise)."""
    return WorkerSnapshot(worker_id=worker_id, **kw)  # type: ignore[arg-type]


def store(index: PrefixIndex, worker_id: str, tokens: list[int], tier: int | None = None) -> None:
    """Credit `worker_id` with every full block of `tokens`."""
    n = len(tokens) // BS
    blocks = tuple(
        StoredBlock(
            engine_hash=hash((worker_id, i)), token_ids=tuple(tokens[i * BS : (i + 1) * BS])
        )
        for i in range(n)
    )
    if tier is None:
        index.apply(worker_id, BlocksStored(blocks=blocks))
    else:
        index.apply(worker_id, BlocksStored(blocks=blocks, tier=tier))


PROMPT = list(range(1000, 1256))  # 256 tokens = 16 blocks
REQUEST = RouteRequest(prompt_ids=PROMPT)
FOUR = [snap(f"w{i}") for i in range(4)]


class TestRoundRobin:
    def test_cycles_over_workers_in_id_order(self) -> None:
        """Turn k picks the k-th worker by id, whatever order the snapshots come in."""
        policy = RoundRobinPolicy()
        workers = [snap("w2"), snap("w0"), snap("w1")]
        picks = [policy.select(REQUEST, workers).worker_id for _ in range(4)]
        assert picks == ["w0", "w1", "w2", "w0"]

    def test_empty_candidates_raise(self) -> None:
        """No candidates is NoWorkerAvailable."""
        with pytest.raises(NoWorkerAvailable):
            RoundRobinPolicy().select(REQUEST, [])


class TestLeastLoad:
    def test_picks_min_load(self) -> None:
        """The worker with the fewest requests wins; load = max(in_flight, running+waiting)."""
        workers = [
            snap("w0", in_flight=3),
            snap("w1", running=1, waiting=1),
            snap("w2", in_flight=5),
        ]
        assert LeastLoadPolicy().select(REQUEST, workers).worker_id == "w1"

    def test_full_ties_rotate(self) -> None:
        """Equal workers share sequential requests in turn."""
        policy = LeastLoadPolicy()
        assert [policy.select(REQUEST, FOUR[:2]).worker_id for _ in range(3)] == ["w0", "w1", "w0"]


class TestConsistentHash:
    def test_session_key_sticks_to_one_worker(self) -> None:
        """Requests with the same session key go to the same worker at equal load."""
        policy = ConsistentHashPolicy(BS)
        picks = {
            policy.select(
                RouteRequest(list(range(i, i + 40)), session_key="conv-7"), FOUR
            ).worker_id
            for i in range(20)
        }
        assert len(picks) == 1

    def test_without_session_the_first_block_is_the_key(self) -> None:
        """Prompts sharing their first block start at the same ring point; others spread."""
        policy = ConsistentHashPolicy(BS)
        system = list(range(5000, 5016))
        same = {policy.select(RouteRequest(system + [i] * 20), FOUR).worker_id for i in range(20)}
        assert len(same) == 1
        spread = {
            policy.select(RouteRequest(list(range(i * 100, i * 100 + 40))), FOUR).worker_id
            for i in range(40)
        }
        assert len(spread) == 4

    def test_full_worker_is_passed_with_branch_overflow(self) -> None:
        """The key's worker at the bound sends the request on clockwise ("overflow")."""
        policy = ConsistentHashPolicy(BS)
        home = policy.select(REQUEST, FOUR)
        assert home.branch == "ring"
        loaded = [
            snap(w.worker_id, in_flight=20 if w.worker_id == home.worker_id else 1) for w in FOUR
        ]
        moved = policy.select(REQUEST, loaded)
        assert moved.worker_id != home.worker_id and moved.branch == "overflow"

    def test_one_hot_key_spreads_within_the_bound(self) -> None:
        """400 concurrent requests with one key: no worker ends above c x mean (+1)."""
        policy = ConsistentHashPolicy(BS)
        loads = {f"w{i}": 0 for i in range(4)}
        for _ in range(400):
            workers = [snap(w, in_flight=n) for w, n in loads.items()]
            loads[policy.select(REQUEST, workers).worker_id] += 1
        assert max(loads.values()) <= load_bound(399, 4, 1.25)
        assert min(loads.values()) > 0


class TestCacheAware:
    def setup_method(self) -> None:
        self.index = PrefixIndex(BS)
        self.policy = CacheAwarePolicy(self.index)

    def test_prefers_the_holder_of_the_prefix(self) -> None:
        """The worker holding the whole prompt wins at equal load ("exact_hit")."""
        store(self.index, "w2", PROMPT)
        decision = self.policy.select(REQUEST, FOUR)
        assert (decision.worker_id, decision.branch) == ("w2", "exact_hit")
        assert (decision.matched_tokens, decision.uncached_tokens) == (256, 0)

    def test_longer_prefix_wins(self) -> None:
        """Of two holders the one with more of the prompt is cheaper."""
        store(self.index, "w0", PROMPT[:64])
        store(self.index, "w1", PROMPT[:192])
        assert self.policy.select(REQUEST, FOUR).worker_id == "w1"

    def test_a_holder_keeps_its_hit_over_a_shorter_queue_elsewhere(self) -> None:
        """Affinity first: a holder with more queued prefill than its hit saves still takes
        the request ("exact_hit"; the cost rule alone never trades a hit away)."""
        store(self.index, "w0", PROMPT)
        workers = [
            snap("w0", running=1, queued_prefill_tokens=3000),
            snap("w1", running=1, queued_prefill_tokens=1000),
        ]  # cost 3,000 + 128 against 1,000 + 3 x 256 + 128
        decision = self.policy.select(REQUEST, workers)
        assert (decision.worker_id, decision.branch) == ("w0", "exact_hit")

    def test_own_dispatches_since_the_last_record_count_as_queue(self) -> None:
        """Between two holders of the prompt, the ledger's tokens sent after the load record
        make one costlier; those sent before it were absorbed by the record."""
        ledger = DispatchLedger()
        policy = CacheAwarePolicy(self.index, ledger=ledger)
        store(self.index, "w0", PROMPT)
        store(self.index, "w1", PROMPT)
        workers = [snap("w0", load_at=10.0), snap("w1", load_at=10.0), snap("w2")]
        assert policy.select(REQUEST, workers).worker_id == "w0"  # a tie, broken by id
        ledger.record("w0", 9.0, 100_000)  # before the record: already counted by the engine
        assert policy.select(REQUEST, workers).worker_id == "w0"
        ledger.record("w0", 11.0, 100_000)  # after it: not yet in the engine's figures
        assert policy.select(REQUEST, workers).worker_id == "w1"

    @pytest.mark.parametrize(
        "overload",
        [
            {"running": 2, "waiting": 1, "token_usage": 0.97},
            {"running": 8, "token_usage": 0.97, "max_running_requests": 8},
            {"running": 1, "waiting": 40},
            {"in_flight": 30},
        ],
        ids=["kv_usage_queueing", "kv_usage_window_full", "waiting_queue", "load_bound"],
    )
    def test_overloaded_holder_is_vetoed(self, overload: dict[str, float]) -> None:
        """KV usage while queueing or at a full admission window, queue length or the
        bounded-load cap veto affinity ("veto")."""
        store(self.index, "w0", PROMPT)
        workers = [snap("w0", **overload), snap("w1", in_flight=1), snap("w2", in_flight=1)]
        decision = self.policy.select(REQUEST, workers)
        assert decision.worker_id != "w0" and decision.branch == "veto"

    def test_a_decision_names_the_best_holder_and_the_prefix_it_gave_up(self) -> None:
        """`best_worker_id` / `best_tokens` are the index's longest holder whether or not it
        was chosen: a vetoed holder's 256 tokens against the chosen worker's 64."""
        store(self.index, "w0", PROMPT)
        store(self.index, "w1", PROMPT[:64])
        workers = [snap("w0", in_flight=30), snap("w1", in_flight=1), snap("w2", in_flight=1)]
        decision = self.policy.select(REQUEST, workers)
        assert (decision.best_worker_id, decision.best_tokens) == ("w0", 256)
        assert (decision.worker_id, decision.matched_tokens) == ("w1", 64)
        taken = self.policy.select(REQUEST, [snap("w0"), snap("w1")])
        assert (taken.worker_id, taken.matched_tokens, taken.best_tokens) == ("w0", 256, 256)
        cold = self.policy.select(RouteRequest(prompt_ids=list(range(5000, 5256))), FOUR)
        assert (cold.best_worker_id, cold.best_tokens) == ("", 0)

    def test_the_best_holder_of_a_tie_is_the_first_the_index_names(self) -> None:
        """Two workers hold the whole prompt: `best_worker_id` is the first of them in the
        index's match (as `max` over the match keeps the first), whichever one is chosen."""
        store(self.index, "w2", PROMPT)
        store(self.index, "w1", PROMPT)
        store(self.index, "w0", PROMPT[:64])
        held = self.index.lookup(REQUEST.prompt_ids).tokens
        first_longest = next(w for w, t in held.items() if t == 256)
        workers = [snap("w0"), snap("w1", in_flight=5), snap("w2", in_flight=1)]
        decision = self.policy.select(REQUEST, workers)
        assert (decision.best_worker_id, decision.best_tokens) == (first_longest, 256)
        assert decision.best_worker_id == max(held, key=held.__getitem__)

    def test_full_kv_without_a_queue_does_not_veto_the_holder(self) -> None:
        """KV usage is a stock: a holder at 0.99 with nothing waiting and free slots keeps
        its affinity, and so does one whose usage is evictable cache (`active_token_usage`)
        while a short queue forms, and an idle one whatever it reports."""
        store(self.index, "w0", PROMPT)
        others = [snap("w1", in_flight=1), snap("w2", in_flight=1)]
        for holder in (
            snap("w0", running=3, token_usage=0.99, max_running_requests=64),
            snap("w0", running=3, waiting=2, token_usage=0.99, active_token_usage=0.3),
            snap("w0", token_usage=0.99, active_token_usage=0.99),
        ):
            decision = self.policy.select(REQUEST, [holder, *others])
            assert (decision.worker_id, decision.branch) == ("w0", "exact_hit")

    def test_everyone_overloaded_takes_the_near_best(self) -> None:
        """When every worker is over a threshold the near-best of all wins ("overload")."""
        store(self.index, "w1", PROMPT)
        busy = {"running": 4, "waiting": 1, "token_usage": 0.99}
        workers = [snap("w0", **busy), snap("w1", **busy)]
        decision = self.policy.select(REQUEST, workers)
        assert (decision.worker_id, decision.branch) == ("w1", "overload")

    def test_no_match_goes_to_the_ring(self) -> None:
        """A cold prompt is placed by consistent hashing ("ring"), the same way each time."""
        first = self.policy.select(REQUEST, FOUR)
        assert first.branch == "ring"
        assert all(self.policy.select(REQUEST, FOUR).worker_id == first.worker_id for _ in range(5))

    def test_a_prefix_every_worker_holds_does_not_count(self) -> None:
        """A system prompt cached everywhere tells workers apart by nothing: ring."""
        for w in FOUR:
            store(self.index, w.worker_id, PROMPT[:128])
        assert self.policy.select(REQUEST, FOUR).branch == "ring"

    def test_tiny_match_is_not_useful(self) -> None:
        """A one-block match of a long prompt (< 5%) does not pull the request."""
        long_prompt = list(range(10_000, 10_640))  # 640 tokens; 5% = 32 tokens
        store(self.index, "w3", long_prompt[:16])
        assert self.policy.select(RouteRequest(long_prompt), FOUR).branch == "ring"

    def test_approximate_credit_is_its_own_branch(self) -> None:
        """A hit credited by the router's own records reports "approx_hit"."""
        self.index.record_approximate("w1", PROMPT, now=0.0)
        decision = self.policy.select(REQUEST, FOUR)
        assert (decision.worker_id, decision.branch) == ("w1", "approx_hit")

    def test_host_tier_is_worth_less_than_device(self) -> None:
        """The same prefix on device beats it on the host."""
        store(self.index, "w0", PROMPT, tier=TIER_HOST)
        store(self.index, "w1", PROMPT)
        assert self.policy.select(REQUEST, FOUR[:2]).worker_id == "w1"

    def test_weights_decide_among_holders_of_near_equal_prefixes(self) -> None:
        """Holders within the useful margin (16 tokens here) of the longest prefix compete on
        cost: one block less but less load wins by default (3 x 16 < 128 x 2), a heavy
        prefill weight keeps the longest; a worker holding nothing never competes."""
        store(self.index, "w0", PROMPT)
        store(self.index, "w1", PROMPT[:-BS])
        queued = {"queued_prefill_tokens": 10_000}  # w2 would be cheapest if it competed
        workers = [snap("w0", in_flight=3, **queued), snap("w1", in_flight=1, **queued), snap("w2")]
        assert self.policy.select(REQUEST, workers).worker_id == "w1"
        heavy = CacheAwareConfig(weights=CostWeights(prefill=1000.0))
        assert CacheAwarePolicy(self.index, heavy).select(REQUEST, workers).worker_id == "w0"

    def test_near_best_leaves_out_a_holder_without_a_useful_advantage(self) -> None:
        """When the best advantage is under twice the useful margin the tolerance shrinks to
        what keeps every competitor useful: best 256 over a floor of 240 (u = 16), so the
        holder of 240 (advantage 0 over the floor) never competes, however idle."""
        store(self.index, "w0", PROMPT)
        store(self.index, "w1", PROMPT[:-BS])
        store(self.index, "w2", PROMPT[:-BS])
        workers = [snap("w0", in_flight=5, queued_prefill_tokens=10_000), snap("w1"), snap("w2")]
        decision = self.policy.select(REQUEST, workers)
        assert (decision.worker_id, decision.branch) == ("w0", "exact_hit")

    def test_admissions_per_replica_cap_bounds_hits_and_the_ring(self) -> None:
        """With `max_in_flight` 2 (admission's per-replica cap) a holder with 2 in flight is
        vetoed far below the affinity capacity's floor of 8, and the ring places a cold
        prompt only on a worker under 2."""
        capped = CacheAwareConfig(overload=OverloadThresholds(max_in_flight=2))
        policy = CacheAwarePolicy(self.index, capped)
        store(self.index, "w0", PROMPT)
        workers = [snap("w0", in_flight=2), snap("w1", in_flight=1), snap("w2", in_flight=2)]
        decision = policy.select(REQUEST, workers)
        assert (decision.worker_id, decision.branch) == ("w1", "veto")
        assert CacheAwarePolicy(self.index).select(REQUEST, workers).worker_id == "w0"
        cold = RouteRequest(list(range(50_000, 50_256)))
        for _ in range(20):
            assert policy.select(cold, workers).worker_id == "w1"

    def test_a_veto_that_changed_nothing_is_not_called_a_veto(self) -> None:
        """A vetoed holder of the whole prompt, an eligible holder of as much and a cheaper
        near-best one: the choice is an ordinary hit, since the veto took nothing away."""
        store(self.index, "w0", PROMPT)
        store(self.index, "w1", PROMPT)
        store(self.index, "w2", PROMPT[:-BS])
        workers = [
            snap("w0", waiting=40),
            snap("w1", in_flight=3, queued_prefill_tokens=10_000),
            snap("w2"),
            snap("w3"),
        ]
        decision = self.policy.select(REQUEST, workers)
        assert (decision.worker_id, decision.branch) == ("w2", "exact_hit")

    def test_draining_workers_are_skipped_unless_all_drain(self) -> None:
        """A draining holder gets nothing while another worker can serve."""
        store(self.index, "w0", PROMPT)
        assert (
            self.policy.select(REQUEST, [snap("w0", draining=True), snap("w1")]).worker_id == "w1"
        )
        assert self.policy.select(REQUEST, [snap("w0", draining=True)]).worker_id == "w0"

    def test_the_inlined_cost_equals_the_documented_rule(self) -> None:
        """The policy's cost ordering is `cost.estimated_cost` (checked on a mixed pool)."""
        store(self.index, "w0", PROMPT[:128])
        store(self.index, "w1", PROMPT[:64], tier=None)
        workers = [
            snap("w0", in_flight=4, queued_prefill_tokens=900),
            snap("w1", running=2, waiting=1, queued_prefill_tokens=100),
            snap("w2", in_flight=1),
        ]
        matched = self.index.match(PROMPT)
        weights = CostWeights()
        costs = {
            w.worker_id: estimated_cost(
                weights,
                prompt_tokens=len(PROMPT),
                device_tokens=matched.get(w.worker_id, 0),
                lower_tier_tokens=0,
                engine_queued=w.queued_prefill_tokens,
                dispatched_since_record=0,
                in_flight=w.in_flight,
                running=w.running,
                waiting=w.waiting,
            )
            for w in workers
        }
        chosen, *_ = self.policy._cheapest(
            workers, self.index.lookup(PROMPT), len(PROMPT), None, []
        )
        assert chosen.worker_id == min(costs, key=lambda w: costs[w])

    def test_the_inlined_ledger_read_equals_pending(self) -> None:
        """Dispatches after a worker's load record count as queued prefill; those before it
        were absorbed by the record and count for nothing (the ledger's `pending`)."""
        ledger = self.policy.ledger
        ledger.record("w0", 5.0, 4000)
        ledger.record("w0", 6.0, 1000)
        found = self.index.lookup(PROMPT)
        workers = [snap("w0", load_at=5.5), snap("w1", load_at=5.5)]
        chosen, *_ = self.policy._cheapest(workers, found, len(PROMPT), None, [])
        assert chosen.worker_id == "w1"  # w0 still has 1,000 tokens pending
        assert ledger.pending("w0", 5.5) == 1000
        workers = [snap("w0", load_at=6.5), snap("w1", load_at=6.5)]
        chosen, *_ = self.policy._cheapest(workers, found, len(PROMPT), None, [])
        assert chosen.worker_id == "w0"  # all absorbed: a tie, broken by id
        assert "w0" not in ledger.oldest

    def test_the_inlined_veto_equals_the_filter(self) -> None:
        """The policy's one-pass veto vetoes exactly what `filters.overloaded` returns."""
        workers = [
            snap("kv", running=1, waiting=1, token_usage=0.96),
            snap("kv_free", running=1, token_usage=0.96),
            snap("kv_window", running=4, token_usage=0.96, max_running_requests=4),
            snap("evictable", running=1, waiting=1, token_usage=0.96, active_token_usage=0.1),
            snap("queue", running=1, waiting=33),
            snap("idle", token_usage=0.99),
            snap("queued_only", waiting=33, token_usage=0.99),  # a queue: not idle
            snap("busy", in_flight=12),
            snap("fine", in_flight=3),
        ]
        vetoed: list[str] = []
        self.policy._cheapest(workers, self.index.lookup(PROMPT), len(PROMPT), 12, vetoed)
        assert set(vetoed) == overloaded(workers, OverloadThresholds(), bound=12)
        assert set(vetoed) == {"kv", "kv_window", "queue", "queued_only", "busy"}

    def test_the_inlined_veto_equals_the_filter_on_random_snapshots(self) -> None:
        """On random loads, usages, windows and bounds the one-pass veto (Python and, where
        built, C) is `filters.overloaded`."""
        rng = random.Random(5)
        for _ in range(2000):
            workers = [
                snap(
                    f"w{i}",
                    in_flight=rng.choice([0, 0, 1, 3, 9]),
                    running=rng.choice([0, 0, 1, 4, 8]),
                    waiting=rng.choice([0, 0, 1, 31, 32]),
                    token_usage=rng.choice([0.0, 0.5, 0.95, 0.99]),
                    active_token_usage=rng.choice([None, 0.1, 0.95]),
                    max_running_requests=rng.choice([0, 4, 8, 64]),
                )
                for i in range(rng.randrange(1, 6))
            ]
            bound = rng.choice([1, 4, 8, 12])
            want = overloaded(workers, OverloadThresholds(), bound=bound)
            found = self.index.lookup(PROMPT)
            vetoed: list[str] = []
            self.policy._cheapest_python(workers, found, len(PROMPT), bound, vetoed)
            assert set(vetoed) == want
            vetoed = []
            self.policy._cheapest(workers, found, len(PROMPT), bound, vetoed)
            assert set(vetoed) == want

    def test_the_filter_caps_its_bound_at_admissions_per_replica_cap(self) -> None:
        """`filters.overloaded` with `max_in_flight` 2 vetoes as the policy does with its
        bound capped there (`CacheAwarePolicy.select`), and with no bound at all."""
        workers = [snap("two", in_flight=2), snap("one", in_flight=1), snap("idle")]
        capped = OverloadThresholds(max_in_flight=2)
        assert overloaded(workers, capped, bound=12) == {"two"}
        assert overloaded(workers, capped) == {"two"}
        assert overloaded(workers, OverloadThresholds(), bound=12) == set()
        vetoed: list[str] = []
        self.policy._cheapest(workers, self.index.lookup(PROMPT), len(PROMPT), 2, vetoed)
        assert set(vetoed) == overloaded(workers, capped, bound=12)

    def test_empty_candidates_raise(self) -> None:
        """No candidates is NoWorkerAvailable."""
        with pytest.raises(NoWorkerAvailable):
            self.policy.select(REQUEST, [])


class TestFiltersAndLedger:
    def test_overloaded_by_each_threshold(self) -> None:
        """KV usage, waiting queue and the load bound each veto; the rest pass."""
        thresholds = OverloadThresholds(max_token_usage=0.9, max_waiting=10)
        workers = [
            snap("kv", running=1, waiting=1, token_usage=0.9),
            snap("queue", running=1, waiting=10),
            snap("busy", in_flight=7),
            snap("fine", in_flight=6, token_usage=0.5),
        ]
        assert overloaded(workers, thresholds, bound=7) == {"kv", "queue", "busy"}
        assert overloaded(workers, thresholds) == {"kv", "queue"}

    def test_ledger_counts_only_dispatches_after_the_record(self) -> None:
        """pending(since) sums entries at or after since; old ones age out."""
        ledger = DispatchLedger(horizon_s=10.0)
        ledger.record("w0", 1.0, 100)
        ledger.record("w0", 2.0, 50)
        assert ledger.pending("w0", None) == 150
        assert ledger.pending("w0", 1.5) == 50
        ledger.record("w0", 20.0, 7)
        assert ledger.pending("w0", None) == 7
        assert ledger.oldest["w0"] == 20.0 and ledger.sums["w0"] == 7
        ledger.forget("w0")
        assert ledger.pending("w0", None) == 0 and "w0" not in ledger.oldest


@pytest.mark.parametrize("value", [math.inf, math.nan, -1.0, 10**400])
def test_cost_weights_refuse_non_finite_or_negative_values(value: float) -> None:
    with pytest.raises(ValueError, match="cost weights must be finite and >= 0"):
        CostWeights(decode=value)

"""The C cost pass (`homing.router._cost`) decides what `_cheapest_python` decides."""

from __future__ import annotations

import copy
import math
import random
from types import SimpleNamespace

import pytest

from homing.router.cost import CostWeights
from homing.router.index import Matches, PrefixIndex
from homing.router.ledger import DispatchLedger
from homing.router.policies import cache_aware
from homing.router.policies.cache_aware import CacheAwareConfig, CacheAwarePolicy
from homing.router.types import WorkerSnapshot


def test_the_extension_is_built() -> None:
    assert cache_aware.native_cost is not None, (
        "homing.router._cost is not built: it needs a C compiler (Debian: apt-get install "
        "gcc); then `make clean && make`"
    )


needs_native = pytest.mark.skipif(cache_aware.native_cost is None, reason="not built")


def _scenario(rng: random.Random) -> tuple[list[WorkerSnapshot], Matches, DispatchLedger]:
    n = rng.choice([1, 2, 5, 16, 64, 65, 200])  # over 64: rows on the heap, not the stack
    workers = [
        WorkerSnapshot(
            worker_id=f"w{rng.randrange(100):02d}" if rng.random() < 0.3 else f"w{i}",
            in_flight=rng.choice([0, 0, *range(0, 20)]),
            running=rng.choice([0, 0, *range(0, 20)]),
            waiting=rng.choice([0, 0, 1, 5, 31, 32, 40]),
            token_usage=rng.choice([0, 0.3, 0.94, 0.95, 0.99]),
            active_token_usage=rng.choice([None, None, 0.1, 0.95, 0.99]),
            max_running_requests=rng.choice([0, 8, 16, 256]),
            queued_prefill_tokens=rng.choice([None, 0, 100, 5000, 40_000]),
            load_at=rng.choice([None, 1.0, 2.0, 3.0]),
            draining=rng.random() < 0.05,
        )
        for i in range(n)
    ]
    ids = [w.worker_id for w in workers]
    tokens = {w: rng.choice([16, 256, 1024, 2048]) for w in rng.sample(ids, rng.randrange(n + 1))}
    device = None
    if rng.random() < 0.3:
        device = {w: rng.choice([0, t // 2, t]) for w, t in tokens.items() if rng.random() < 0.8}
    ledger = DispatchLedger()
    for _ in range(rng.randrange(0, 3 * n)):
        ledger.record(rng.choice(ids), rng.choice([0.5, 1.5, 2.5, 3.5]), rng.randrange(5000))
    return workers, Matches(tokens, device), ledger


@needs_native
def test_cost_pass_equals_the_python_pass_on_random_scenarios() -> None:
    """Same winner, same largest/smallest/vetoed effective match, same vetoed list, and the
    same ledger afterwards, for random loads, tiers, ties, vetoes, useful margins and
    pending dispatches."""
    rng = random.Random(11)
    weights = [CostWeights(), CostWeights(prefill=1.0, decode=0.0), CostWeights(queue=0.0)]
    for trial in range(3000):
        workers, found, ledger = _scenario(rng)
        config = CacheAwareConfig(weights=weights[trial % 3])
        policies = []
        calls: list[list[tuple[str, float]]] = [[], []]
        for log in calls:
            policy = CacheAwarePolicy(PrefixIndex(16), config, copy.deepcopy(ledger))
            real = policy.ledger.pending

            def logged(wid: str, since: float, real=real, log=log) -> int:
                log.append((wid, since))
                return real(wid, since)

            policy.ledger.pending = logged  # type: ignore[method-assign]
            policies.append(policy)
        bound = rng.choice([None, 0, 3, 8, 20])
        prompt = rng.choice([0, 16, 1000, 2048, 4096])
        vetoed_c: list[str] = []
        vetoed_py: list[str] = []
        useful = rng.choice([math.inf, 16, 100, 1000])
        got = policies[0]._cheapest(workers, found, prompt, bound, vetoed_c, useful)
        want = policies[1]._cheapest_python(workers, found, prompt, bound, vetoed_py, useful)
        assert vetoed_c == vetoed_py
        if want is None:
            assert got is None
            continue
        assert got is not None
        assert got[0] is want[0]
        assert got[1:] == want[1:]  # floats from C, ints or floats from Python: equal values
        assert calls[0] == calls[1]  # `pending` (it mutates the ledger) called alike
        assert policies[0].ledger.sums == policies[1].ledger.sums
        assert policies[0].ledger.oldest == policies[1].ledger.oldest


@needs_native
def test_ring_loads_equal_the_python_ones_on_random_scenarios() -> None:
    """The ring's loads (vetoed workers at `full`) and queue and decode costs from C are the
    Python pass's, and leave the ledger in the same state."""
    rng = random.Random(17)
    native = cache_aware.native_cost
    assert native is not None
    for trial in range(2000):
        workers, _, ledger = _scenario(rng)
        vetoed = {w.worker_id for w in workers if rng.random() < 0.3}
        full = rng.choice([0, 4, 20])
        config = CacheAwareConfig(weights=CostWeights(queue=rng.choice([0.0, 1.0, 2.5])))
        policy = CacheAwarePolicy(PrefixIndex(16), config, copy.deepcopy(ledger))
        want = policy._ring_loads_python(workers, vetoed, full)
        weights = config.weights
        got = native.ring_loads(
            workers, weights.queue, weights.decode, ledger.oldest, ledger.sums, ledger.pending,
            vetoed, full,
        )  # fmt: skip
        assert got == want, trial
        assert (ledger.sums, ledger.oldest) == (policy.ledger.sums, policy.ledger.oldest)


@needs_native
def test_ring_loads_raise_what_their_inputs_raise() -> None:
    """A `pending` that raises, a snapshot without its fields and a `vetoed` whose membership
    test raises each surface as that exception, not a crash or a partial answer."""
    native = cache_aware.native_cost
    assert native is not None
    workers = [WorkerSnapshot(worker_id="w0", load_at=5.0)]

    def failing(wid: str, since: float) -> int:
        raise RuntimeError("ledger gone")

    with pytest.raises(RuntimeError, match="ledger gone"):
        native.ring_loads(workers, 1.0, 128.0, {"w0": 1.0}, {"w0": 3}, failing, set(), 4)
    with pytest.raises(AttributeError):
        native.ring_loads([object()], 1.0, 128.0, {}, {}, failing, set(), 4)

    class Hostile:
        def __contains__(self, item: object) -> bool:
            raise KeyError(item)

    with pytest.raises(KeyError):
        native.ring_loads(workers, 1.0, 128.0, {}, {}, failing, Hostile(), 4)


@needs_native
def test_load_total_and_other_snapshot_types() -> None:
    """Objects that are not `WorkerSnapshot`s are read by attribute name, with the same
    answer; the load total and the draining flag match the Python sum."""
    rng = random.Random(3)
    workers, found, ledger = _scenario(rng)
    lookalikes = [SimpleNamespace(**{f: getattr(w, f) for f in w.__slots__}) for w in workers]
    native = cache_aware.native_cost
    assert native is not None
    total, draining = native.load_total(lookalikes)
    assert total == sum(w.load for w in workers)
    assert draining == any(w.draining for w in workers)
    policy = CacheAwarePolicy(PrefixIndex(16), ledger=ledger)
    a = policy._cheapest(lookalikes, found, 2048, None, [])  # type: ignore[arg-type]
    b = policy._cheapest(workers, found, 2048, None, [])
    assert a is not None and b is not None
    assert a[0].worker_id == b[0].worker_id and a[1:] == b[1:]


@needs_native
def test_bad_snapshots_raise() -> None:
    native = cache_aware.native_cost
    assert native is not None
    with pytest.raises(AttributeError):
        native.load_total([object()])
    with pytest.raises(TypeError):
        native.load_total([WorkerSnapshot(worker_id="w0", in_flight="3")])  # type: ignore[arg-type]


@needs_native
def test_hostile_inputs_raise_instead_of_crashing() -> None:
    """A `pending` that empties the worker list mid-pass, request counts beyond 64 bits and
    a type borrowing WorkerSnapshot's slot descriptors neither crash nor give a silently
    wrong answer."""
    native = cache_aware.native_cost
    assert native is not None
    workers = [WorkerSnapshot(worker_id=f"w{i}", load_at=5.0) for i in range(4)]
    oldest = {w.worker_id: 1.0 for w in workers}
    sums = dict.fromkeys(oldest, 10)

    def pending(wid: str, since: float) -> int:
        workers.clear()
        return 0

    best = native.cheapest(
        workers, {}, None, 100, 3.0, 1.0, 128.0, 0.8, 0.95, 32, None, math.inf, oldest,
        sums, pending, [],
    )  # fmt: skip
    assert best is not None and best[0].worker_id == "w0"
    huge = [WorkerSnapshot(worker_id="a", running=2**63 - 1, waiting=1)]
    with pytest.raises(OverflowError, match="request counts out of range"):
        native.load_total(huge)

    class Fake:
        worker_id = WorkerSnapshot.worker_id  # another type's slot descriptor

    for name in ("in_flight", "running", "waiting", "token_usage", "queued_prefill_tokens",
                 "load_at", "draining", "active_token_usage",
                 "max_running_requests"):  # fmt: skip
        setattr(Fake, name, getattr(WorkerSnapshot, name))
    with pytest.raises(TypeError, match="is not a slot"):
        native.bind(Fake)
    native.bind(WorkerSnapshot)  # still bound to the real type
    assert native.load_total([WorkerSnapshot(worker_id="w", in_flight=3)]) == (3, False)

"""Bounded growth under prefix churn: a stream of unique prompts with no removals (a worker
that never reports evictions) levels off in index blocks and process RSS. The full 1M-prompt
run is `make bench-router` (`homing.bench.router_micro --churn 1000000`)."""

from __future__ import annotations

from array import array

from homing.bench.router_micro import _rss_bytes
from homing.router.index import PrefixIndex

BS = 16
PROMPTS = 60_000
BUDGET = 40_000


def test_unique_prompt_churn_levels_off_in_blocks_and_rss() -> None:
    """60k unique 8-block prompts against a 40k-block budget: blocks <= budget, RSS flat."""
    index = PrefixIndex(BS, max_blocks=BUDGET)
    samples: list[tuple[int, int]] = []
    for p in range(PROMPTS):
        base = p * 8 * BS
        items = []
        for b in range(8):
            data = array("I", range(base + b * BS, base + (b + 1) * BS)).tobytes()
            items.append((p * 8 + b + 1, p * 8 + b if b else None, data, 1))
        index.store_blocks(f"w{p % 8}", items)
        if (p + 1) % (PROMPTS // 10) == 0:
            samples.append((index.num_blocks, _rss_bytes()))
    assert all(blocks <= BUDGET for blocks, _ in samples)
    assert samples[-1][0] >= BUDGET * 0.9
    assert index.stats.evicted >= PROMPTS * 8 - BUDGET
    rss_after_warmup = samples[2][1]  # the budget is reached at ~8% of the run
    assert samples[-1][1] - rss_after_warmup < 8 * 2**20
    assert len(index._eng) <= 2 * BUDGET + 1024

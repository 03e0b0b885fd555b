"""Where a router's prefix hits go: each request's chosen worker against the worker that held
the longest prefix of its prompt at the instant of the decision (pure).

Rule of this file: the truth is the engines' own KV events. Each worker's cache is rebuilt from
its stored / removed / cleared events in the order of their batch timestamps (the engine's
publish time), and a request is judged against the caches as they were at its decision time.
A prompt's blocks are found by their engine block hashes (SGLang's SHA-256 chain,
`homing.sim.radix_cache.block_hash_chain`); the radix tree holds a block only with its whole
prefix, so a worker's cached prefix is the run of the prompt's chain it holds from block 0.

Per request, with `best` the longest prefix any worker held (tokens), `held` the chosen
worker's and `lost = best - held`:

- "nothing_cached": `best` is 0 (no worker held any of the prompt);
- "taken": `lost` is 0 (the chosen worker held the longest prefix, or one as long);
- for `lost > 0`, where the router said what its index believed (`Routed.index_*`):
  - "stale_phantom": the index credited the chosen worker, or the worker it named as the
    best holder, with more than that worker held (a removal not applied, or applied late);
  - "stale_missing": no worker was credited with `best` tokens (a store not applied, or late);
  - "traded_<branch>": the index knew a worker held `best`, and the decision rule chose
    another (its branch: veto, overflow, ring, ...);
- "missed": `lost > 0` and the router reported nothing of its index (smg).

Separately, `evicted_in_flight` sums `held - served` where the engine reported fewer cached
tokens than the chosen worker held at the decision (evicted before the request arrived).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

STORED = "stored"
REMOVED = "removed"
CLEARED = "cleared"


@dataclass(frozen=True)
class CacheChange:
    """One KV event of `worker` published at `at` (Unix s): `kind` STORED / REMOVED (with
    the blocks' engine hashes) or CLEARED."""

    at: float
    worker: str
    kind: str
    hashes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Routed:
    """One routed request: decided at `at` (Unix s) for a prompt of `prompt_len` tokens whose
    full blocks have the engine hashes `chain`, sent to `worker`, which reported `served`
    cached tokens. `index_branch`,
    `index_matched` and `index_best` are what the router's index said at the decision (the
    chosen worker's prefix and the longest credited to any worker, tokens) and
    `index_best_worker` that worker; None when the router does not say."""

    request_id: str
    at: float
    prompt_len: int
    chain: tuple[int, ...]
    worker: str
    served: int
    index_branch: str | None = None
    index_matched: int | None = None
    index_best: int | None = None
    index_best_worker: str | None = None


@dataclass(frozen=True)
class Judged:
    """One request's verdict: `category` (module docstring), `best` and `held` tokens, and
    `evicted` = max(0, held - served)."""

    request_id: str
    category: str
    best: int
    held: int
    evicted: int

    @property
    def lost(self) -> int:
        """Tokens of cached prefix the decision gave up."""
        return self.best - self.held


@dataclass
class Summary:
    """Totals over judged requests: per category, the requests and the tokens lost; the
    prompt tokens, the longest-prefix tokens available (`best`), those held by the chosen
    workers (`held`), those the engines served as cached (`served`) and `evicted`."""

    requests: Counter[str] = field(default_factory=Counter)
    lost: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    best: int = 0
    held: int = 0
    served: int = 0
    evicted: int = 0

    def rows(self) -> list[tuple[str, int, int, float]]:
        """(category, requests, tokens lost, share of all tokens lost), most lost first."""
        total = sum(self.lost.values())
        order = sorted(self.requests, key=lambda c: (-self.lost[c], -self.requests[c], c))
        return [
            (c, self.requests[c], self.lost[c], self.lost[c] / total if total else 0.0)
            for c in order
        ]


def judge(
    routed: Sequence[Routed], changes: Iterable[CacheChange], block_size: int
) -> tuple[list[Judged], Summary]:
    """Judge every request of `routed` against the caches `changes` rebuild (module
    docstring). Changes apply in timestamp order (stable for equal times), each before a
    request decided at the same instant. A prefix counts up to the last full block before
    the prompt's last token (an engine computes that token whatever it holds). Returns the
    verdicts in `routed` order, and their summary."""
    ordered_changes = sorted(changes, key=lambda c: c.at)
    times = [c.at for c in ordered_changes]
    held_by: dict[str, set[int]] = {}
    applied = 0
    verdicts: dict[int, Judged] = {}
    summary = Summary()
    for i in sorted(range(len(routed)), key=lambda k: routed[k].at):
        r = routed[i]
        upto = bisect.bisect_right(times, r.at)
        for change in ordered_changes[applied:upto]:
            blocks = held_by.setdefault(change.worker, set())
            if change.kind == STORED:
                blocks.update(change.hashes)
            elif change.kind == REMOVED:
                blocks.difference_update(change.hashes)
            else:
                blocks.clear()
        applied = max(applied, upto)
        usable = max(0, (r.prompt_len - 1) // block_size)
        chain = r.chain[:usable]
        prefix = {w: _prefix_blocks(chain, blocks) * block_size for w, blocks in held_by.items()}
        best = max(prefix.values(), default=0)
        held = prefix.get(r.worker, 0)
        category = _category(r, best, held, prefix)
        verdict = Judged(r.request_id, category, best, held, max(0, held - r.served))
        verdicts[i] = verdict
        summary.requests[verdict.category] += 1
        summary.lost[verdict.category] += verdict.lost
        summary.best += best
        summary.held += held
        summary.served += r.served
        summary.evicted += verdict.evicted
        summary.prompt_tokens += r.prompt_len
    return [verdicts[i] for i in range(len(routed))], summary


def _prefix_blocks(chain: Sequence[int], blocks: set[int]) -> int:
    n = 0
    for h in chain:
        if h not in blocks:
            break
        n += 1
    return n


def _category(r: Routed, best: int, held: int, prefix: dict[str, int]) -> str:
    if best == 0:
        return "nothing_cached"
    if held >= best:
        return "taken"
    if r.index_best is None or r.index_matched is None:
        return "missed"
    if r.index_matched > held:
        return "stale_phantom"
    if r.index_best < best:
        return "stale_missing"
    if r.index_best_worker is not None and prefix.get(r.index_best_worker, 0) < best:
        return "stale_phantom"  # the holder it knew of held less: the true one was unknown
    return f"traded_{r.index_branch or 'unknown'}"


def markdown(summary: Summary, title: str) -> str:
    """`summary` as a markdown table under a line naming `title` and the token totals."""
    p = max(1, summary.prompt_tokens)
    head = (
        f"{title}: prompt tokens {summary.prompt_tokens:,}; longest prefix held anywhere "
        f"{summary.best / p:.1%}; held by the chosen worker {summary.held / p:.1%}; served as "
        f"cached {summary.served / p:.1%}; evicted before arrival {summary.evicted / p:.1%}"
    )
    lines = [
        head,
        "",
        "| category | requests | tokens lost | share of lost |",
        "|---|---:|---:|---:|",
    ]
    for category, n, lost, share in summary.rows():
        lines.append(f"| {category} | {n:,} | {lost:,} | {share:.1%} |")
    return "\n".join(lines)

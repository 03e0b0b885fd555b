"""The global GPU budget across pools: trims the pools' scale-ups so their GPUs fit. Pure.

Rule of this file: each pool first keeps, free of the budget's choice, what it has now
(`current`: ready + warm + starting) or its minimum, whichever is more, up to what it
wants, ready before warm: kept ready = min(desired_ready, max(current, min_ready)), kept
warm = min(desired_warm, max(0, current - kept ready)). These may already exceed the
budget (it is never enforced by taking replicas away). The GPUs left are handed out one
replica at a time, every pool's ready replicas before any warm one, each replica to the
pool with the largest shortfall relative to what it wants ((wanted - given) / wanted; ties:
the pool name, in order), skipping a pool whose replica no longer fits while a smaller one
may. A pool given less than it wanted gets `held_by` "gpu_budget" and its chain's
`budget_trimmed_ready` and `budget_trimmed_warm` (replicas cut).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from homing.scaler.policy import Decision


def apportion(
    wants: Mapping[str, Decision],
    current: Mapping[str, int],
    gpus_per_replica: Mapping[str, int],
    gpu_budget: int | None,
    *,
    min_ready: Mapping[str, int] | None = None,
) -> dict[str, Decision]:
    """Trim scale-ups (warm first: ready keeps priority over warm) so the sum over pools of
    (desired_ready + desired_warm) x gpus fits `gpu_budget` GPUs; never below what a pool
    has now (`current[pool]`: its ready + warm + starting, 0 when absent) nor below its
    minimum (`min_ready[pool]`, 0 when absent). Pools with the largest shortfall relative
    to their desired get GPUs first (the module docstring's rule).

    `gpus_per_replica` must name every pool of `wants` (KeyError). `gpu_budget` None: no
    budget, `wants` returned as they are. ValueError for a negative budget or a pool's
    GPUs per replica below 1.
    """
    if gpu_budget is None:
        return dict(wants)
    if gpu_budget < 0:
        raise ValueError("gpu_budget must not be negative")
    mins = min_ready or {}
    gpus: dict[str, int] = {}
    ready: dict[str, int] = {}
    warm: dict[str, int] = {}
    for pool, d in wants.items():
        g = gpus_per_replica[pool]
        if g < 1:
            raise ValueError(f"gpus_per_replica[{pool!r}] must be at least 1")
        gpus[pool] = g
        have = max(0, current.get(pool, 0))
        ready[pool] = min(d.desired_ready, max(have, mins.get(pool, 0)))
        warm[pool] = min(d.desired_warm, max(0, have - ready[pool]))
    left = gpu_budget - sum((ready[p] + warm[p]) * gpus[p] for p in wants)
    for given, wanted in (
        (ready, {p: d.desired_ready for p, d in wants.items()}),
        (warm, {p: d.desired_warm for p, d in wants.items()}),
    ):
        while True:
            open_pools = [p for p in wants if given[p] < wanted[p] and gpus[p] <= left]
            if not open_pools:
                break
            pool = min(open_pools, key=lambda p: (-(wanted[p] - given[p]) / wanted[p], p))
            given[pool] += 1
            left -= gpus[pool]
    out: dict[str, Decision] = {}
    for pool, d in wants.items():
        cut_ready = d.desired_ready - ready[pool]
        cut_warm = d.desired_warm - warm[pool]
        if cut_ready <= 0 and cut_warm <= 0:
            out[pool] = d
            continue
        chain = dataclasses.replace(
            d.chain, budget_trimmed_ready=float(cut_ready), budget_trimmed_warm=float(cut_warm)
        )
        out[pool] = dataclasses.replace(
            d,
            desired_ready=ready[pool],
            desired_warm=warm[pool],
            chain=chain,
            held_by="gpu_budget",
        )
    return out

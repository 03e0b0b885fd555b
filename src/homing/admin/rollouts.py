"""The admin API's rollout messages: a model's split, rollout, comparison and verdict as a
`homing.v1.RolloutStatus` (proto/homing/v1/admin.proto)."""

from __future__ import annotations

import math

from homing.fleet import ModelDispatch
from homing.rollout.compare import Check, VersionStats
from homing.rollout.controller import InvalidRollout, RolloutStatus
from homing.v1 import admin_pb2 as pb


def figures_message(stats: VersionStats | None, model: ModelDispatch) -> pb.VersionFigures:
    """The `VersionFigures` of one version's `stats` (empty for None), with its ready
    workers now."""
    if stats is None:
        return pb.VersionFigures()
    message = pb.VersionFigures(
        version=stats.version,
        requests=stats.requests,
        judged=stats.judged,
        failed=stats.failed,
        met=stats.met,
        ttft_samples=stats.ttft_samples,
        tpot_samples=stats.tpot_samples,
        finish_reasons=[
            pb.FinishReasonShare(reason=reason, share=share)
            for reason, share in sorted(stats.finish_reasons.items())
        ],
        ready_workers=sum(1 for w in model.pool.routable_workers() if w.version == stats.version),
    )
    for name in (
        "error_rate",
        "attainment",
        "ttft_per_uncached_token_s",
        "tpot_p50_s",
        "output_tokens_mean",
        "output_tokens_p50",
    ):
        value = getattr(stats, name)
        if value is not None:
            setattr(message, name, value)
    return message


def _check_message(c: Check) -> pb.RolloutCheck:
    message = pb.RolloutCheck(name=c.name, result=c.result, detail=c.detail)
    if c.baseline is not None and math.isfinite(c.baseline):
        message.baseline = c.baseline
    if c.canary is not None and math.isfinite(c.canary):
        message.canary = c.canary
    return message


def status_message(s: RolloutStatus, model: ModelDispatch) -> pb.RolloutStatus:
    """The `RolloutStatus` message of `s`, the status of `model`."""
    message = pb.RolloutStatus(
        model=s.model,
        split=[pb.VersionWeight(version=v, weight=w) for v, w in sorted((s.split or {}).items())],
    )
    r = s.rollout
    if r is None:
        return message
    message.has_rollout = True
    message.baseline = r.baseline
    message.canary = r.canary
    message.phase = r.phase
    message.steps.extend(r.steps)
    message.step = r.step
    message.weight = r.weight
    message.bake_s = r.bake_s
    message.baked_s = s.baked_s
    message.reason = r.reason
    message.baseline_figures.CopyFrom(figures_message(s.baseline, model))
    message.canary_figures.CopyFrom(figures_message(s.canary, model))
    if s.verdict is not None:
        message.verdict = s.verdict.result
        message.verdict_reason = s.verdict.reason
        message.checks.extend(_check_message(c) for c in s.verdict.checks)
    message.history.extend(
        pb.RolloutEvent(at_unix_s=e.at, event=e.event, weight=e.weight, reason=e.reason)
        for e in r.history
    )
    return message


def weights_of(request: pb.SetVersionsRequest) -> dict[str, float]:
    """The split a `SetVersionsRequest` asks for; `InvalidRollout` for a version listed
    twice, weights given with `reset`, or none without it."""
    weights: dict[str, float] = {}
    for vw in request.weights:
        if vw.version in weights:
            raise InvalidRollout(f"version {vw.version!r} is listed twice")
        weights[vw.version] = vw.weight
    if request.reset and weights:
        raise InvalidRollout("reset returns to the config's split: give no weights with it")
    if not request.reset and not weights:
        raise InvalidRollout("give each version's weight (VERSION=WEIGHT), or reset")
    return weights

"""From the config's `[scaler]` section to the policy's `ScalerConfig` and the seeds of its
capacity estimate.

Rule of this file: pure translation. The seed of a replica's goodput is, in order: the
section's `decode_streams_per_replica` / `prefill_tokens_per_s_per_replica`; for a
simulated pool, the sim's timing model at the model's TPOT SLO (`homing.plan.measure`,
with the sizing chain's default token shapes, and the sim's `speedup`: a sim `speedup` x
faster meets a TPOT target with the batch that meets `speedup` x that target, and prefills
`speedup` x as many tokens per second); else `FALLBACK_DECODE_STREAMS` and
`FALLBACK_PREFILL_TOKENS_PER_S`. The live estimate moves from the seed as replicas report.
"""

from __future__ import annotations

from homing.config import ScalerSettings, SimSettings
from homing.obs.slo import Slo
from homing.plan.chain import Assumptions
from homing.plan.measure import measure
from homing.scaler.policy import ScalerConfig
from homing.sim.timing import model_spec

#: Decode streams one replica is assumed to hold at its TPOT SLO when nothing says more:
#: SGLang's smallest common `max_running_requests` on one GPU is far higher, so the live
#: estimate only ever raises it (a lower bound from every replica not at its limit).
FALLBACK_DECODE_STREAMS = 16.0
#: Uncached prompt tokens/s one replica is assumed to prefill when nothing says more (an 8B
#: model on one H100 prefills ~10x this; kept low so the first decisions err on capacity).
FALLBACK_PREFILL_TOKENS_PER_S = 2000.0


def seed_capacity(
    settings: ScalerSettings, sim: SimSettings | None, slo: Slo
) -> tuple[float, float, str]:
    """(decode streams per replica, prefill tokens/s per replica, where they came from)."""
    decode = settings.decode_streams_per_replica
    prefill = settings.prefill_tokens_per_s_per_replica
    source = "config"
    if (decode is None or prefill is None) and sim is not None:
        try:
            tp = sim.tp if sim.tp is not None else model_spec(sim.model).default_tp
            m = measure(
                Assumptions(
                    model=sim.model,
                    gpu=sim.gpu,
                    tp=tp,
                    tpot_slo_ms=slo.rule_tpot_s * 1000.0 * sim.speedup,
                )
            )
        except ValueError:
            pass
        else:
            decode = decode if decode is not None else float(m.decode_batch)
            prefill = prefill if prefill is not None else m.prefill_rate_tok_s * sim.speedup
            source = "timing model"
    if decode is None or prefill is None:
        source = "fallback"
    return (
        decode if decode is not None else FALLBACK_DECODE_STREAMS,
        prefill if prefill is not None else FALLBACK_PREFILL_TOKENS_PER_S,
        source,
    )


def scaler_config(settings: ScalerSettings, *, gpus: int) -> ScalerConfig:
    """The policy's config from the section."""
    return ScalerConfig(
        min_replicas=settings.min_replicas,
        max_replicas=settings.max_replicas,
        headroom=settings.headroom,
        target_utilisation=settings.target_utilisation,
        tick_s=settings.tick_s,
        scale_down_window_s=settings.scale_down_window_s,
        scale_down_cooldown_s=settings.scale_down_cooldown_s,
        hysteresis=settings.hysteresis,
        max_scale_down_fraction=settings.max_scale_down_fraction,
        max_scale_up_replicas=settings.max_scale_up_replicas,
        max_scale_up_fraction=settings.max_scale_up_fraction,
        warm_replicas=settings.warm_replicas,
        max_warm_replicas=settings.max_warm_replicas,
        default_cold_start_s=settings.default_cold_start_s,
        scale_to_zero=settings.scale_to_zero,
        idle_to_zero_s=settings.idle_to_zero_s,
        gpus_per_replica=gpus,
    )

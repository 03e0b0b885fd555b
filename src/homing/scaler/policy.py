"""The autoscaler's policy for one pool: one `Decision` per tick from that tick's
`PoolSignals` and the policy's own history. Pure: no I/O, no asyncio, no wall clock (time
comes in as `PoolSignals.now`, seconds on the loop's clock).

Rules of `ScalingPolicy.decide` (replica counts; "current" is ready + starting, the
replicas already taking requests or already asked for):

1. Chain (the seed's, `homing.plan.chain`, from live signals): decode need = (in_flight +
   queued) / (decode_streams_per_replica x target_utilisation); prefill need =
   prefill_tokens_per_s / (prefill_tokens_per_s_per_replica x target_utilisation); a
   replica time-shares both, so raw = decode + prefill (the seed's "/ (1 - prefill share)"
   with share = prefill / raw); with_headroom = raw x (1 + headroom); need =
   ceil(with_headroom - EPSILON) clamped to [floor, max_replicas]. Every division is guarded:
   zero demand gives 0 (never NaN), demand with no usable capacity figure gives
   max_replicas. `desired_ready` is always a target total, so replicas that are starting
   are never asked for again (the loop starts desired - ready - warm - starting).
2. Fast path, when a leading indicator fires: `queued` grew on `queue_growth_ticks` ticks in
   a row, every ready replica reported a waiting queue on `queue_growth_ticks` ticks in a
   row, or, while the pool is loaded, ttft_p95 > ttft_slo or burn_rate >
   `burn_rate_threshold`. Loaded: something is queued, every ready replica reports a waiting
   queue, or raw > 0 and raw >= `loaded_utilisation` x ready. Latency on a pool with free
   capacity comes from elsewhere (a slow replica, long prompts, the host), and replicas do
   not fix it. Target = max(need, current) + step, step = max(fast_step_min, ceil(growth x
   cold_start)); growth (>= 0, replicas/s) = the least-squares slopes of the demand over the
   last `growth_ticks` ticks, in its own units (streams/s, prefill tokens/s/s), divided by
   the capacity figures, so a changed capacity estimate is not growth; cold_start =
   `cold_start_s` or `default_cold_start_s`. At most one step per cold_start, and none
   within a cold start of the scale-up that began the replicas now starting (timed from the
   first scale-up since nothing was starting, so a ramp's every-tick chain increase does not
   extend it): they are the answer, and the indicators (windows of TTFT and burn rate) lag
   their landing (held_by "starting"); replicas still starting a cold start after that are
   late, and one more step goes. A tick with an indicator firing counts as "current was not
   enough" in the scale-down window.
3. Scale-down (need < current, no indicator firing), each check in this order, the first
   that fails naming `held_by`: the surplus current - need must exceed hysteresis x
   current and be >= 1 ("hysteresis"); the policy must have ticked for
   `scale_down_window_s` and the largest need over that window must clear the same
   surplus test ("window"); no scale-up within `scale_down_cooldown_s` ("cooldown"). Then
   target = max(window's largest need, current - max(1, floor(max_scale_down_fraction x
   ready)), floor). A held scale-down keeps current. A scale-up is a decision whose target
   exceeds the previous decision's (the first decision: exceeds current). Current above
   max_replicas goes to max_replicas at once ("bounds").
4. Zero: the floor is min_replicas, but min_replicas 0 is honoured only with
   `scale_to_zero`, and then only while idle: nothing in flight or queued, arrivals_per_s
   0 and no arrival for `idle_to_zero_s` (no arrival ever: since the policy's first tick).
   Idle gives target 0 at once ("to_zero"); otherwise the floor is 1, so a queued request
   or an arrival at zero gives >= 1 at once, with no window. Any target above 0 at 0 ready
   is "from_zero".
4b. Scale-up rate: a target is at most current + max(`max_scale_up_replicas`,
   ceil(`max_scale_up_fraction` x ready)) (held_by "scale_up_rate"): the Kubernetes HPA's
   default scale-up policy (4 pods or 100% per period), so a burst never starts a whole
   cluster in one tick.
5. Warm pool: `warm_replicas` when set, else 0 at a target of 0 and otherwise
   min(max_warm_replicas, ceil(raw + growth x cold_start - target)), target before the
   scale-up rate cap (so the warm pool never carries what the cap held back): the replicas
   the demand expected one cold start from now needs beyond the target, whose headroom
   absorbs the rest (a steady load keeps none, a ramp what one cold start of it outgrows).
   Warm replicas held now (warm ones this target does not promote, plus those starting for
   the warm pool) are kept up to the largest figure over `scale_down_window_s` (a warm
   replica costs a cold start to bring back), but a promoted one is replaced only when the
   figure of this tick asks for it; clamped so desired_ready + desired_warm <= max_replicas.
6. A decision depends on the signals and the policy's previous ticks only; call `decide`
   once per tick.

Defaults and their sources: headroom 0.2 (the seed's +20%); burn_rate_threshold 14.4 (the
Google SRE workbook's fast-burn page: 2% of a 30-day budget in one hour);
default_cold_start_s 60 (the seed: a 70B replica takes a minute or more to load);
scale_down_window_s 120 and scale_down_cooldown_s 60 (Knative's stable window is 60 s and
the Kubernetes HPA's scale-down stabilisation 300 s; an LLM replica costs a cold start of
about a minute to bring back, so twice that); tick_s 5 (a decode stream lasts seconds, so
one tick sees a step); queue_growth_ticks 2 (one noisy tick never fires); growth_ticks 12
(points 5 s apart over 55 s, about one default cold start: a ramp of integer streams steps a
few times in it; counted in ticks, so a shorter tick_s shortens it); loaded_utilisation 0.9
(above the 1 / 1.2 = 0.83 of ready capacity that the default headroom leaves a right-sized
pool at); hysteresis 0.1 and max_scale_down_fraction 0.25 (a tenth of slack is noise; a
quarter per tick takes a pool down gradually while streams drain); max_warm_replicas 2;
idle_to_zero_s 300 (five minutes without a request).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, fields

#: A fraction of a replica this small is rounding, not demand (a pool's prefill term is
#: often ~1e-8 replicas): `ceil` takes it off before rounding up.
EPSILON = 1e-6


@dataclass(frozen=True)
class ScalerConfig:
    """One pool's scaling constants (module docstring: meaning and source of each). Seconds
    for `*_s`; replica counts for `*_replicas`. ValueError for values out of range."""

    min_replicas: int = 1
    max_replicas: int = 8
    headroom: float = 0.2
    target_utilisation: float = 1.0
    tick_s: float = 5.0
    fast_step_min: int = 1
    burn_rate_threshold: float = 14.4
    queue_growth_ticks: int = 2
    scale_down_window_s: float = 120.0
    scale_down_cooldown_s: float = 60.0
    hysteresis: float = 0.1
    max_scale_down_fraction: float = 0.25
    warm_replicas: int | None = None
    max_warm_replicas: int = 2
    default_cold_start_s: float = 60.0
    scale_to_zero: bool = False
    idle_to_zero_s: float = 300.0
    gpus_per_replica: int = 1
    growth_ticks: int = 12
    loaded_utilisation: float = 0.9
    max_scale_up_replicas: int = 4
    max_scale_up_fraction: float = 1.0

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.max_replicas < max(1, self.min_replicas):
            raise ValueError("need 0 <= min_replicas <= max_replicas and max_replicas >= 1")
        if self.headroom < 0:
            raise ValueError("headroom must not be negative")
        if not 0 < self.target_utilisation <= 1:
            raise ValueError("target_utilisation must be in (0, 1]")
        if self.tick_s <= 0 or self.default_cold_start_s <= 0:
            raise ValueError("tick_s and default_cold_start_s must be positive")
        if self.fast_step_min < 1 or self.queue_growth_ticks < 1 or self.growth_ticks < 2:
            raise ValueError("need fast_step_min >= 1, queue_growth_ticks >= 1, growth_ticks >= 2")
        if self.burn_rate_threshold <= 0:
            raise ValueError("burn_rate_threshold must be positive")
        if not 0 <= self.loaded_utilisation <= 1:
            raise ValueError("loaded_utilisation must be in [0, 1]")
        if self.scale_down_window_s < 0 or self.scale_down_cooldown_s < 0:
            raise ValueError("scale_down_window_s and scale_down_cooldown_s must not be negative")
        if not 0 <= self.hysteresis < 1:
            raise ValueError("hysteresis must be in [0, 1)")
        if not 0 < self.max_scale_down_fraction <= 1:
            raise ValueError("max_scale_down_fraction must be in (0, 1]")
        if self.warm_replicas is not None and self.warm_replicas < 0:
            raise ValueError("warm_replicas must not be negative")
        if self.max_warm_replicas < 0 or self.idle_to_zero_s < 0:
            raise ValueError("max_warm_replicas and idle_to_zero_s must not be negative")
        if self.gpus_per_replica < 1:
            raise ValueError("gpus_per_replica must be at least 1")
        if self.max_scale_up_replicas < 1 or not self.max_scale_up_fraction > 0:
            raise ValueError("need max_scale_up_replicas >= 1 and max_scale_up_fraction > 0")


@dataclass(frozen=True)
class PoolSignals:
    """One pool, one tick (built by the loop). Counts of replicas or requests; `now` and
    `*_at` are seconds on the loop's clock, `*_s` durations in seconds, rates per second.

    ready: replicas taking requests. warm: started, idle, not routable (promotable at once).
    starting: asked of the actuator, not yet ready. draining: being drained.
    in_flight: requests (streams) in flight on the pool. queued: requests in its admission
    queue. prefill_tokens_per_s: uncached prompt tokens routed per second (lost affinity
    included). arrivals_per_s: requests arriving per second. last_arrival_at: the newest
    request's arrival (None: never). ttft_p95_s / ttft_slo_s: recent p95 TTFT and its SLO
    (None: no data / none). burn_rate: the SLO's error-budget burn rate over the fast
    window (None: no data). workers_waiting: ready replicas whose engine reports a waiting
    queue. cold_start_s: measured by the actuator (None: not yet).
    decode_streams_per_replica / prefill_tokens_per_s_per_replica: the pool's
    `CapacityEstimator` figures. warm_starting: replicas starting for the warm pool (not in
    `starting`).
    """

    now: float
    ready: int
    warm: int
    starting: int
    draining: int
    in_flight: int
    queued: int
    prefill_tokens_per_s: float
    arrivals_per_s: float
    last_arrival_at: float | None
    ttft_p95_s: float | None
    ttft_slo_s: float | None
    burn_rate: float | None
    workers_waiting: int
    cold_start_s: float | None
    decode_streams_per_replica: float
    prefill_tokens_per_s_per_replica: float
    warm_starting: int = 0


@dataclass(frozen=True)
class ScalerChain:
    """The named steps of one decision (rules 1 to 3 of the module docstring), for logs,
    metrics and the admin API. Replica counts unless named otherwise; 0 for a step not
    computed.

    demand_streams: in_flight + queued. prefill_demand_tok_s: prefill tokens/s.
    decode_replicas / prefill_replicas: what each demand needs. prefill_share: prefill /
    raw (0 when raw is 0). raw: decode + prefill. with_headroom: raw x (1 + headroom).
    need: with_headroom rounded up, clamped to [floor, max_replicas]. floor: the least
    target this tick (rule 4: 0 only while idle with scale_to_zero). current: ready +
    starting. growth_per_s: replicas/s the demand grows by (>= 0). cold_start_s: the cold
    start used (seconds). step: the fast path's step (0: none). window_max: the largest
    need (under pressure, max(need, current)) over the scale-down window.
    budget_trimmed_ready / budget_trimmed_warm: replicas the GPU budget cut
    (`homing.scaler.budget`; None: not trimmed).
    """

    demand_streams: float = 0.0
    prefill_demand_tok_s: float = 0.0
    decode_replicas: float = 0.0
    prefill_replicas: float = 0.0
    prefill_share: float = 0.0
    raw: float = 0.0
    with_headroom: float = 0.0
    need: float = 0.0
    floor: float = 0.0
    current: float = 0.0
    growth_per_s: float = 0.0
    cold_start_s: float = 0.0
    step: float = 0.0
    window_max: float = 0.0
    budget_trimmed_ready: float | None = None
    budget_trimmed_warm: float | None = None

    def steps(self) -> tuple[tuple[str, float], ...]:
        """(name, value) of every step in the order the policy computes them, the budget's
        two last and only when set."""
        return tuple(
            (f.name, value) for f in fields(self) if (value := getattr(self, f.name)) is not None
        )


@dataclass(frozen=True)
class Decision:
    """What one tick decided for one pool.

    desired_ready: replicas that should take requests (a total, starting ones included).
    desired_warm: replicas to keep started but idle. reason: "steady", "scale_up",
    "fast_path", "scale_down", "held", "to_zero", "from_zero" or "bounds". fast: a fast
    step was added this tick. chain: the named steps (`ScalerChain`). held_by: why a wanted
    change did not (fully) happen: "hysteresis", "window", "cooldown", "starting",
    "max_replicas", "scale_up_rate", or the budget's "gpu_budget"; None: nothing held.
    """

    desired_ready: int
    desired_warm: int
    reason: str
    fast: bool
    chain: ScalerChain
    held_by: str | None = None


def _number(value: float | None) -> float:
    """`value` when finite and positive, else 0."""
    if value is None or not math.isfinite(value) or value <= 0:
        return 0.0
    return float(value)


def _replicas(demand: float, per_replica: float, cap: int) -> float:
    """Replicas that `demand` needs at `per_replica` each: 0 for no demand, `cap` when the
    per-replica figure is unusable (not finite or not positive)."""
    if demand <= 0:
        return 0.0
    if not math.isfinite(per_replica) or per_replica <= 0:
        return float(cap)
    return demand / per_replica


def _prune(window: deque[tuple[float, int]], before: float) -> None:
    """Drop the (time, value) points of `window` older than `before` (oldest first)."""
    while window and window[0][0] < before:
        window.popleft()


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points (y per x); 0 with fewer than two distinct x."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx <= 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


class ScalingPolicy:
    """One pool's scaling decisions over time (rules: the module docstring)."""

    def __init__(self, config: ScalerConfig) -> None:
        self.config = config
        self._first_at: float | None = None
        self._streams: deque[tuple[float, float]] = deque(maxlen=config.growth_ticks)
        self._prefill: deque[tuple[float, float]] = deque(maxlen=config.growth_ticks)
        self._prev_queued: int | None = None
        self._queue_growth = 0
        self._window: deque[tuple[float, int]] = deque()
        self._last_up_at: float | None = None
        self._batch_at: float | None = None
        self._prev_target: int | None = None
        self._waiting_ticks = 0
        self._warm_window: deque[tuple[float, int]] = deque()
        self._fast_at: float | None = None

    def decide(self, s: PoolSignals) -> Decision:
        """This tick's decision for the pool; records it in the policy's history."""
        cfg = self.config
        now = s.now
        if self._first_at is None:
            self._first_at = now
        ready = max(0, s.ready)
        starting = max(0, s.starting)
        in_flight = max(0, s.in_flight)
        queued = max(0, s.queued)
        current = ready + starting
        if starting == 0:
            self._batch_at = None

        # 1. the chain
        streams = float(in_flight + queued)
        prefill_demand = _number(s.prefill_tokens_per_s)
        decode = _replicas(
            streams, s.decode_streams_per_replica * cfg.target_utilisation, cfg.max_replicas
        )
        prefill = _replicas(
            prefill_demand,
            s.prefill_tokens_per_s_per_replica * cfg.target_utilisation,
            cfg.max_replicas,
        )
        raw = decode + prefill
        with_headroom = raw * (1.0 + cfg.headroom)
        need_raw = max(0, math.ceil(with_headroom - EPSILON))
        growth = self._growth(now, streams, prefill_demand, s)
        cold = _number(s.cold_start_s) or cfg.default_cold_start_s

        # leading indicators
        if self._prev_queued is not None and queued > self._prev_queued:
            self._queue_growth += 1
        else:
            self._queue_growth = 0
        self._prev_queued = queued
        # A request waits one scheduler step before its prefill: one tick's waiting queue
        # is noise, one on every replica for `queue_growth_ticks` ticks is saturation.
        if ready > 0 and s.workers_waiting >= ready:
            self._waiting_ticks += 1
        else:
            self._waiting_ticks = 0
        loaded = (
            queued > 0
            or (ready > 0 and s.workers_waiting >= ready)
            or (raw > 0 and raw >= cfg.loaded_utilisation * ready)
        )
        slow = (
            s.ttft_p95_s is not None and s.ttft_slo_s is not None and s.ttft_p95_s > s.ttft_slo_s
        ) or (s.burn_rate is not None and s.burn_rate > cfg.burn_rate_threshold)
        pressure = (
            self._queue_growth >= cfg.queue_growth_ticks
            or self._waiting_ticks >= cfg.queue_growth_ticks
            or (slow and loaded)
        )

        # 4. the floor, and zero
        floor = cfg.min_replicas if cfg.scale_to_zero else max(1, cfg.min_replicas)
        last = s.last_arrival_at if s.last_arrival_at is not None else self._first_at
        idle = (
            in_flight == 0
            and queued == 0
            and _number(s.arrivals_per_s) == 0
            and now - last >= cfg.idle_to_zero_s
        )
        if floor == 0 and not idle:
            floor = 1
        need = min(cfg.max_replicas, max(floor, need_raw))
        held_by: str | None = "max_replicas" if need_raw > cfg.max_replicas else None

        fast = False
        step = 0
        if floor == 0:
            target = 0
            reason = "to_zero" if current > 0 else "steady"
            held_by = None
            window_value = 0
        elif pressure:
            base = max(need, current)
            target = base
            # One step per cold start: before that the last step's replicas are starting, or
            # have just landed while the indicators (windows of TTFT and burn) still lag; and
            # none while the replicas starting since a scale-up within a cold start are on
            # their way (timed from the scale-up that began them: a ramp's chain raises the
            # target every tick, and that must not hold the step off for the whole ramp).
            recent = (self._fast_at is not None and now - self._fast_at < cold) or (
                self._batch_at is not None and now - self._batch_at < cold
            )
            if not recent:
                step = max(cfg.fast_step_min, math.ceil(growth * cold - EPSILON))
                if base + step > cfg.max_replicas:
                    held_by = "max_replicas"
                target = min(cfg.max_replicas, base + step)
                if target > base:
                    fast = True
                    self._fast_at = now
            else:
                held_by = "starting"
            reason = self._reason(target, current, fast)
            if not fast and target == current and held_by == "starting":
                reason = "held"
            window_value = base
        else:
            window_value = need
            target, reason, down_held = self._scale(need, need_raw, current, ready, floor, now)
            held_by = down_held or held_by
        self._window.append((now, window_value))
        _prune(self._window, now - cfg.scale_down_window_s)
        # Scale-up rate: at most max(max_scale_up_replicas, fraction x ready) more replicas
        # than current per tick, so one burst cannot start a whole cluster at once.
        rate_cap = current + max(
            cfg.max_scale_up_replicas, math.ceil(cfg.max_scale_up_fraction * ready - EPSILON)
        )
        uncapped = target
        if target > rate_cap:
            target = rate_cap
            held_by = "scale_up_rate"
        if ready == 0 and target > 0:
            reason = "from_zero"

        previous = self._prev_target if self._prev_target is not None else current
        if target > previous:
            self._last_up_at = now
            if self._batch_at is None:
                self._batch_at = now
        self._prev_target = target

        # 5. the warm pool
        if cfg.warm_replicas is not None:
            warm = cfg.warm_replicas
        elif target == 0:
            warm = 0
        else:
            outgrown = raw + growth * cold - uncapped
            warm = min(cfg.max_warm_replicas, max(0, math.ceil(outgrown - EPSILON)))
        # Held: a warm replica held now, and not promoted by this target, is kept while the
        # stable window asked for it (it costs a cold start to bring back); a promoted one
        # is replaced only on this tick's figure.
        self._warm_window.append((now, warm))
        _prune(self._warm_window, now - cfg.scale_down_window_s)
        if target > 0 or cfg.warm_replicas is not None:
            held = max(v for _, v in self._warm_window)
            kept = max(0, s.warm - max(0, target - ready)) + max(0, s.warm_starting)
            warm = max(warm, min(held, kept))
        warm = max(0, min(warm, cfg.max_replicas - target))

        chain = ScalerChain(
            demand_streams=streams,
            prefill_demand_tok_s=prefill_demand,
            decode_replicas=decode,
            prefill_replicas=prefill,
            prefill_share=prefill / raw if raw > 0 else 0.0,
            raw=raw,
            with_headroom=with_headroom,
            need=float(need),
            floor=float(floor),
            current=float(current),
            growth_per_s=growth,
            cold_start_s=cold,
            step=float(step),
            window_max=float(max(v for _, v in self._window)),
        )
        return Decision(target, warm, reason, fast, chain, held_by)

    def _growth(self, now: float, streams: float, prefill: float, s: PoolSignals) -> float:
        """Replicas/s the demand grows by (>= 0): the slopes of streams and of prefill
        tokens/s over the last `growth_ticks` ticks, each over its capacity figure (0 where
        that figure is unusable)."""
        cfg = self.config
        self._streams.append((now, streams))
        self._prefill.append((now, prefill))
        growth = 0.0
        for points, per_replica in (
            (self._streams, s.decode_streams_per_replica),
            (self._prefill, s.prefill_tokens_per_s_per_replica),
        ):
            capacity = _number(per_replica) * cfg.target_utilisation
            if capacity > 0:
                growth += slope(list(points)) / capacity
        return max(0.0, growth)

    def _scale(
        self, need: int, need_raw: int, current: int, ready: int, floor: int, now: float
    ) -> tuple[int, str, str | None]:
        """(target, reason, held_by) without a leading indicator (rules 1 and 3). The
        window already holds every earlier tick; this tick's `need` is counted here."""
        cfg = self.config
        if need >= current:
            reason = (
                "bounds"
                if need > current and need_raw < floor
                else self._reason(need, current, False)
            )
            return need, reason, None
        if current > cfg.max_replicas:
            return cfg.max_replicas, "bounds", None

        def surplus(value: int) -> bool:
            gap = current - value
            return gap >= 1 and gap > cfg.hysteresis * current

        if not surplus(need):
            return current, "held", "hysteresis"
        assert self._first_at is not None
        since = now - cfg.scale_down_window_s
        window_max = max([need, *(v for t, v in self._window if t >= since)])
        if now - self._first_at < cfg.scale_down_window_s or not surplus(window_max):
            return current, "held", "window"
        if self._last_up_at is not None and now - self._last_up_at < cfg.scale_down_cooldown_s:
            return current, "held", "cooldown"
        step = max(1, math.floor(cfg.max_scale_down_fraction * ready))
        return max(window_max, current - step, floor), "scale_down", None

    @staticmethod
    def _reason(target: int, current: int, fast: bool) -> str:
        if fast:
            return "fast_path"
        if target > current:
            return "scale_up"
        if target < current:
            return "scale_down"
        return "steady"

"""Continuous-batching scheduler of one simulated SGLang worker (pure: plain data in and out).

Rule of this file: decisions only. Time comes in as `now` (seconds of simulated time); there is
no clock, no sleep, no I/O and no randomness here, so the same code runs under the live worker
(`homing.sim.engine_loop`) and under a virtual-clock fleet simulator.

Each rule follows SGLang's scheduler (`managers/scheduler.py`, `schedule_policy.py`,
`schedule_batch.py`). One `step(now)` is one iteration in mixed-chunk mode (the decode batch and
prefill chunks run together):

1. decode: every request whose prefill is done needs one more KV slot. When the pool has no
   room even after evicting unreferenced cache pages, requests are retracted newest first
   (issue 3's rule; SGLang's `retract_decode` instead picks, among decoding requests only,
   the one with the fewest output tokens, longest prompt first — a known deviation)
   (at least one, then until the rest have room for `retract_decode_steps` more tokens each):
   a retracted request frees its KV (without inserting it into the cache, as SGLang's
   `release_kv_cache(is_insert=False)`), goes to the back of the waiting queue, is counted in
   `num_retracted`, and later re-prefills prompt + output so far. A retraction resets
   `new_token_ratio` to SGLang's new estimate (decoded + retract_decode_steps x requests) /
   sum(max_new_tokens); a step without one decays it by (init - min) / decay_steps down to
   its minimum;
2. prefill: token budget = chunked_prefill_size - decode tokens. The request whose prefill is
   in progress continues first. Then the waiting queue is ordered by the schedule policy --
   `fcfs` (arrival order) or `lpm` (longest cached prefix first; among requests with at most
   32 cached tokens, one whose prefix at least 32 tokens long is shared with an earlier
   waiting request waits behind it so that it can reuse its KV: SGLang's in-batch prefix
   caching; above 128 waiting requests `lpm` falls back to `fcfs`) -- and requests are
   admitted in that order while the budget lasts and `max_running_requests` is not reached,
   if their KV footprint fits: uncached prompt tokens plus min(max_new_tokens, 4096)
   (CLIP_MAX_NEW_TOKENS) must fit in the free plus evictable pages, less what running
   requests still reserve (their remaining min(max_new_tokens - output, 4096) tokens x
   `new_token_ratio`, SGLang's PrefillAdder). The first request that does not fit stops
   admission. A chunk that does not finish a prompt is cut to a page multiple;
3. the step's duration comes from the timing model over the whole batch;
4. results: a prefill that completes produces the first output token, each decode one token;
   requests finish on max_new_tokens ("length"), an EOS or stop token ("stop", matched token
   id; both ignored under ignore_eos, as SGLang does), or abort. Computed full pages enter the
   radix cache after each prefill chunk and at finish (SGLang's cache_unfinished_req /
   cache_finished_req), which is when `BlockStored` events appear. Tokens are handed out
   every `stream_interval` tokens (SGLang: when len(output) % interval == 1 for an interval
   above 1, so the first token goes at once; always at finish; every 50 tokens for a
   non-streaming request).

`add_request` refuses a request with `QueueFull` when `max_queued_requests` requests already
wait (SGLang answers 503, which the gRPC servicer maps to UNAVAILABLE). State changes are
applied at the start of the step; the shell makes them visible after `duration_s`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from homing.sim.radix_cache import KvEvent, KvHandle, RadixCache
from homing.sim.timing import PrefillChunk

CLIP_MAX_NEW_TOKENS = 4096
"""Output tokens reserved per request at admission at most (SGLang's CLIP_MAX_NEW_TOKENS)."""

GEN_THROUGHPUT_WINDOW_S = 5.0
"""Window (simulated seconds) over which `gen_throughput` / `prefill_throughput` average."""

INIT_NEW_TOKEN_RATIO = 0.7
"""SGLang's `init_new_token_ratio` (SGLANG_INIT_NEW_TOKEN_RATIO default): the share of a running
request's remaining max_new_tokens that admission reserves for it."""

MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
"""SGLang's `min_new_token_ratio` = init x this factor (SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR)."""

NEW_TOKEN_RATIO_DECAY_STEPS = 600
"""SGLang's SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS: decode steps from init to min ratio."""

RETRACT_DECODE_STEPS = 20
"""SGLang's `retract_decode_steps`: after a retraction, the rest must have room for this many
more tokens each."""

LPM_MAX_WAITING = 128
"""Above this many waiting requests SGLang's `lpm` falls back to `fcfs` (sorting is costly)."""

IN_BATCH_PREFIX_THRESHOLD = 32
"""SGLang's IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD / _DEPRIORITIZE_THRESHOLD (tokens)."""

NON_STREAM_OUTPUT_INTERVAL = 50
"""SGLang's DEFAULT_FORCE_STREAM_INTERVAL: a non-streaming request's tokens leave every 50."""

SchedulePolicy = Literal["fcfs", "lpm"]
SCHEDULE_POLICIES: tuple[SchedulePolicy, ...] = ("fcfs", "lpm")


class QueueFull(Exception):
    """The waiting queue already holds `max_queued_requests` requests (SGLang: 503)."""


class TokenSource(Protocol):
    """The output a request would sample: token `index` (0-based) of its answer."""

    def token_at(self, index: int) -> int: ...


class StepTimer(Protocol):
    """What the scheduler needs from a timing model (`homing.sim.timing.TimingModel`)."""

    def step_time_s(
        self,
        prefill: Sequence[PrefillChunk] = (),
        decode_batch: int = 0,
        decode_context_tokens: int = 0,
    ) -> float: ...


@dataclass(frozen=True)
class SimRequest:
    """A generate request as the scheduler sees it (already validated).

    max_new_tokens >= 0; `output` decides which tokens the request produces; `stream` and
    `stream_interval` (None = the worker's) decide how often its tokens are handed out.
    `cache_limit`: at most this many prompt tokens may come from the radix cache (SGLang
    limits the prefix match to `logprob_start_len` for a request with prompt logprobs, whose
    positions must be computed); None: no limit beyond the prompt.
    """

    request_id: str
    input_ids: tuple[int, ...]
    max_new_tokens: int
    output: TokenSource
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    stream: bool = True
    stream_interval: int | None = None
    cache_limit: int | None = None


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits and policy of one worker's scheduler (tokens unless stated).

    clip_max_new_tokens caps the output reserved per request at admission; max_queued_requests
    None means an unbounded waiting queue (SGLang's default); stream_interval >= 1 tokens.
    """

    kv_capacity_tokens: int
    max_running_requests: int
    page_size: int = 16
    chunked_prefill_size: int = 8192
    eos_token_ids: frozenset[int] = frozenset()
    clip_max_new_tokens: int = CLIP_MAX_NEW_TOKENS
    schedule_policy: SchedulePolicy = "fcfs"
    max_queued_requests: int | None = None
    stream_interval: int = 1
    init_new_token_ratio: float = INIT_NEW_TOKEN_RATIO
    retract_decode_steps: int = RETRACT_DECODE_STEPS


@dataclass(frozen=True)
class RequestOutput:
    """Tokens one request produced in a step, with its cumulative counts after the step."""

    request_id: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class RequestFinished:
    """A request left the scheduler: finish_reason is "stop", "length" or "abort";
    matched_token_id is the EOS/stop token that ended it (finish_reason "stop")."""

    request_id: str
    finish_reason: str
    matched_token_id: int | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class StepResult:
    """What one step did, effective `duration_s` (simulated seconds) after `started_at`."""

    started_at: float
    duration_s: float
    outputs: tuple[RequestOutput, ...]
    finished: tuple[RequestFinished, ...]
    kv_events: tuple[KvEvent, ...]
    prefill_tokens: int
    decode_tokens: int
    admitted: int
    retracted: int

    @property
    def did_work(self) -> bool:
        """True when the step ran any prefill or decode token."""
        return self.prefill_tokens + self.decode_tokens > 0


@dataclass(frozen=True)
class LoadStats:
    """The figures GetLoads, EngineLoad and /metrics report (tokens unless stated).

    gen_throughput / prefill_throughput: tokens/s over the last GEN_THROUGHPUT_WINDOW_S;
    cache_hit_rate: cached / prompt tokens of every admitted request so far; the `*_total`
    figures count since the scheduler was created; `first_tokens_total` requests produced a
    first token, `ttft_seconds_total` the sum of their times from arrival to the end of the
    step that produced it (simulated seconds).
    """

    num_running: int
    num_waiting: int
    waiting_uncached_tokens: int
    prefill_pending_tokens: int
    num_used_tokens: int
    evictable_tokens: int
    max_total_num_tokens: int
    token_usage: float
    gen_throughput: float
    cache_hit_rate: float
    max_running_requests: int
    num_retracted: int
    prefill_throughput: float = 0.0
    new_token_ratio: float = INIT_NEW_TOKEN_RATIO
    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0
    generation_tokens_total: int = 0
    prefill_tokens_total: int = 0
    requests_finished_total: int = 0
    requests_rejected_total: int = 0
    first_tokens_total: int = 0
    ttft_seconds_total: float = 0.0


@dataclass(eq=False)
class _Req:
    """Scheduler-side state of one request."""

    req: SimRequest
    arrival: float
    all_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    handle: KvHandle | None = None
    fill_len: int = 0
    kv_len: int = 0
    cached_tokens: int = 0
    admitted_once: bool = False
    admit_seq: int = 0
    known_uncached: int = 0
    unsent: list[int] = field(default_factory=list)

    @property
    def prefilling(self) -> bool:
        return self.kv_len < self.fill_len

    @property
    def match_limit(self) -> int:
        """Tokens a prefix match may cover: all but the last to fill, and the request's
        `cache_limit`."""
        limit = self.req.cache_limit
        return self.fill_len - 1 if limit is None else min(self.fill_len - 1, limit)

    @property
    def prompt_len(self) -> int:
        return len(self.req.input_ids)


class Scheduler:
    """SGLang-style continuous batching over a `RadixCache` (see the module docstring).

    `add_request` / `abort` / `flush_cache` change the queue between steps; `step(now)` runs one
    iteration. Raises ValueError on a config that does not give at least one KV page, an
    unknown schedule policy, or stream_interval < 1.
    """

    def __init__(self, config: SchedulerConfig, timer: StepTimer) -> None:
        total_pages = config.kv_capacity_tokens // config.page_size
        if total_pages < 1:
            raise ValueError("kv_capacity_tokens must hold at least one page")
        if config.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(
                f"unknown schedule policy {config.schedule_policy!r}; "
                f"known: {', '.join(SCHEDULE_POLICIES)}"
            )
        if config.stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {config.stream_interval}")
        self.config = config
        self.timer = timer
        self.cache = RadixCache(total_pages, config.page_size)
        self._waiting: deque[_Req] = deque()
        self._running: list[_Req] = []
        self._by_id: dict[str, _Req] = {}
        self._admit_counter = 0
        self._retracted_total = 0
        self._prompt_tokens_total = 0
        self._cached_tokens_total = 0
        self._generated_total = 0
        self._prefill_total = 0
        self._finished_total = 0
        self._rejected_total = 0
        self._first_tokens_total = 0
        self._ttft_total_s = 0.0
        self._recent: deque[tuple[float, int, int]] = deque()
        self.min_new_token_ratio = min(
            config.init_new_token_ratio * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0
        )
        self.new_token_ratio_decay = (
            config.init_new_token_ratio - self.min_new_token_ratio
        ) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = config.init_new_token_ratio

    # ---- queue ----

    @property
    def num_running(self) -> int:
        """Requests admitted (prefilling or decoding)."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests queued for admission."""
        return len(self._waiting)

    @property
    def has_work(self) -> bool:
        """True while any request is running or waiting."""
        return bool(self._running or self._waiting)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_id

    def add_request(self, request: SimRequest, now: float) -> None:
        """Queue `request`. Raises ValueError on an empty prompt or a request id already in the
        scheduler, QueueFull when max_queued_requests requests already wait."""
        if request.request_id in self._by_id:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if not request.input_ids:
            raise ValueError("empty input_ids")
        limit = self.config.max_queued_requests
        if limit is not None and len(self._waiting) >= limit:
            self._rejected_total += 1
            raise QueueFull(f"The request queue is full ({limit} requests waiting).")
        state = _Req(req=request, arrival=now, all_ids=list(request.input_ids))
        state.fill_len = len(state.all_ids)
        match = self.cache.match_prefix(
            state.all_ids, now, max_tokens=state.match_limit, touch=False
        )
        state.known_uncached = state.fill_len - match.num_tokens
        self._by_id[request.request_id] = state
        self._waiting.append(state)

    def abort(self, request_id: str, now: float) -> tuple[RequestFinished | None, list[KvEvent]]:
        """Remove a request at once: a running one releases its KV (its computed full pages
        stay in the cache, unreferenced). Returns its `RequestFinished` (finish_reason
        "abort"), or None when the id is unknown, plus the KV events this caused."""
        state = self._by_id.pop(request_id, None)
        if state is None:
            return None, []
        if state.handle is not None:
            self._running.remove(state)
            self._release(state, now)
        else:
            self._waiting.remove(state)
        return self._finished(state, "abort", None), self.cache.take_events()

    def flush_cache(self) -> list[KvEvent]:
        """Drop the whole prefix cache (FlushCache); returns [AllBlocksCleared].
        Raises RuntimeError while any request is running or waiting."""
        if self.has_work:
            raise RuntimeError("cache not flushed: requests are running or waiting")
        self.cache.reset()
        return self.cache.take_events()

    # ---- one iteration ----

    def step(self, now: float) -> StepResult:
        """Run one scheduler iteration at simulated time `now` (see the module docstring)."""
        cfg = self.config
        finished: list[RequestFinished] = []
        emitted: list[_Req] = []

        # 1. decode: one more KV slot per decoding request; retract the newest when full.
        decode, retracted = self._prepare_decode(now, finished)

        # 2. prefill: continue the chunked request, then admit by policy within the budget.
        budget = max(cfg.chunked_prefill_size, cfg.page_size) - len(decode)
        chunks: list[tuple[_Req, int]] = []
        for state in [r for r in self._running if r.kv_len < r.fill_len]:
            size = self._chunk_size(state.fill_len - state.kv_len, budget)
            if size == 0 or state.handle is None:
                break
            if not self.cache.grow(state.handle, state.kv_len + size, now):
                break  # decodes outgrew the reservations; wait for pages to come back
            chunks.append((state, size))
            budget -= size
        admitted = 0
        if self._waiting and budget > 0 and len(self._running) < cfg.max_running_requests:
            self._order_waiting(now)
            admitted = self._admit(now, budget, chunks)

        # 3. duration of the whole batch.
        prefill_work = [PrefillChunk(size, state.kv_len) for state, size in chunks]
        decode_context = sum(state.kv_len + 1 for state in decode)
        duration = self.timer.step_time_s(prefill_work, len(decode), decode_context)

        # 4. results.
        for state in decode:
            state.kv_len += 1
            self._emit_token(state, emitted, finished, now)
        prefill_tokens = 0
        for state, size in chunks:
            state.kv_len += size
            prefill_tokens += size
            assert state.handle is not None
            if state.prefilling:
                self.cache.checkpoint(state.handle, state.all_ids[: state.kv_len], now)
                continue
            if len(state.output_ids) >= state.req.max_new_tokens:
                self._finish(state, "length", None, finished, now)
                continue
            self.cache.checkpoint(state.handle, state.all_ids[: state.kv_len], now)
            self._emit_token(state, emitted, finished, now)

        ended = now + duration
        outputs = []
        for state in emitted:
            if len(state.output_ids) == 1:  # its first token: visible when the step ends
                self._first_tokens_total += 1
                self._ttft_total_s += ended - state.arrival
            if state.unsent and (state.req.request_id not in self._by_id or self._due(state)):
                outputs.append(
                    RequestOutput(
                        request_id=state.req.request_id,
                        token_ids=tuple(state.unsent),
                        prompt_tokens=state.prompt_len,
                        completion_tokens=len(state.output_ids),
                        cached_tokens=state.cached_tokens,
                    )
                )
                state.unsent = []
        generated = len(emitted)
        self._generated_total += generated
        self._prefill_total += prefill_tokens
        if generated or prefill_tokens:
            self._recent.append((now, generated, prefill_tokens))
        return StepResult(
            started_at=now,
            duration_s=duration,
            outputs=tuple(outputs),
            finished=tuple(finished),
            kv_events=tuple(self.cache.take_events()),
            prefill_tokens=prefill_tokens,
            decode_tokens=len(decode),
            admitted=admitted,
            retracted=retracted,
        )

    # ---- load ----

    def core_load(self) -> tuple[int, int, int]:
        """(running, waiting, waiting uncached tokens): the figures whose change makes the
        KV-event stream send a load record; cheaper than `load`."""
        return (
            len(self._running),
            len(self._waiting),
            sum(r.known_uncached for r in self._waiting),
        )

    def load(self, now: float) -> LoadStats:
        """Current load figures; throughputs are tokens/s over the last
        GEN_THROUGHPUT_WINDOW_S of simulated time before `now`."""
        page = self.config.page_size
        total_tokens = self.cache.total_pages * page
        used_tokens = self.cache.used_pages * page
        while self._recent and self._recent[0][0] <= now - GEN_THROUGHPUT_WINDOW_S:
            self._recent.popleft()
        recent_generated = sum(n for _, n, _ in self._recent)
        recent_prefill = sum(n for _, _, n in self._recent)
        prefill_pending = sum(r.fill_len for r in self._waiting) + sum(
            r.fill_len for r in self._running if not r.output_ids
        )
        return LoadStats(
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            waiting_uncached_tokens=sum(r.known_uncached for r in self._waiting),
            prefill_pending_tokens=prefill_pending,
            num_used_tokens=used_tokens,
            evictable_tokens=self.cache.evictable_pages * page,
            max_total_num_tokens=total_tokens,
            token_usage=used_tokens / total_tokens,
            gen_throughput=recent_generated / GEN_THROUGHPUT_WINDOW_S,
            cache_hit_rate=(
                self._cached_tokens_total / self._prompt_tokens_total
                if self._prompt_tokens_total
                else 0.0
            ),
            max_running_requests=self.config.max_running_requests,
            num_retracted=self._retracted_total,
            prefill_throughput=recent_prefill / GEN_THROUGHPUT_WINDOW_S,
            new_token_ratio=self.new_token_ratio,
            prompt_tokens_total=self._prompt_tokens_total,
            cached_tokens_total=self._cached_tokens_total,
            generation_tokens_total=self._generated_total,
            prefill_tokens_total=self._prefill_total,
            requests_finished_total=self._finished_total,
            requests_rejected_total=self._rejected_total,
            first_tokens_total=self._first_tokens_total,
            ttft_seconds_total=self._ttft_total_s,
        )

    # ---- internals ----

    def _prepare_decode(
        self, now: float, finished: list[RequestFinished]
    ) -> tuple[list[_Req], int]:
        """Give every decoding request its next KV slot, retracting newest-first when the pool
        is out of room; returns the decode batch and how many requests were retracted.
        (`_running` is kept in admission order, so no sorting is needed.)"""
        page = self.config.page_size
        pool_tokens = self.cache.total_pages * page
        decoding = [r for r in self._running if r.kv_len >= r.fill_len]
        for state in [r for r in decoding if r.kv_len + 1 > pool_tokens]:
            self._finish(state, "length", None, finished, now)  # longer than the whole pool
            decoding.remove(state)
        need = 0
        for state in decoding:
            handle = state.handle
            assert handle is not None
            if state.kv_len + 1 > handle.capacity_tokens(page):
                need += 1
        retracted = 0
        if need > self.cache.available_pages:
            # SGLang's retract_decode: at least one, then until the rest have headroom.
            while self._running:
                if retracted and (
                    sum(self._pages_to_grow(r, self.config.retract_decode_steps) for r in decoding)
                    <= self.cache.available_pages
                ):
                    break
                candidates = (
                    self._running
                    if len(decoding) > 1
                    else [r for r in self._running if r not in decoding]
                )
                if not candidates:
                    break
                victim = max(candidates, key=lambda r: r.admit_seq)
                self._retract(victim, now)
                retracted += 1
                if victim in decoding:
                    decoding.remove(victim)
            total_max_new = sum(r.req.max_new_tokens for r in decoding)
            decoded = sum(len(r.output_ids) for r in decoding)
            self.new_token_ratio = (
                min(
                    (decoded + self.config.retract_decode_steps * len(decoding)) / total_max_new,
                    1.0,
                )
                if total_max_new
                else self.config.init_new_token_ratio
            )
        elif decoding:
            self.new_token_ratio = max(
                self.new_token_ratio - self.new_token_ratio_decay, self.min_new_token_ratio
            )
        elif not self._running:
            self.new_token_ratio = self.config.init_new_token_ratio
        batch = []
        for state in decoding:
            handle = state.handle
            assert handle is not None
            if state.kv_len + 1 <= handle.capacity_tokens(page) or self.cache.grow(
                handle, state.kv_len + 1, now
            ):
                batch.append(state)
            else:  # a single request that outgrew the pool even alone: retract it too
                self._retract(state, now)
                retracted += 1
        return batch, retracted

    def _pages_to_grow(self, state: _Req, tokens: int) -> int:
        """Pages a running request must add to hold `tokens` more tokens of KV."""
        assert state.handle is not None
        held = state.handle.shared_pages + state.handle.private_pages
        return max(self.cache.pages_for(state.kv_len + tokens) - held, 0)

    def _order_waiting(self, now: float) -> None:
        """Sort the waiting queue by the schedule policy (see the module docstring)."""
        if self.config.schedule_policy != "lpm" or len(self._waiting) > LPM_MAX_WAITING:
            return
        page = self.config.page_size
        seen: set[int] = set()
        keyed: list[tuple[int, int, _Req]] = []
        for state in self._waiting:
            match = self.cache.match_prefix(
                state.all_ids, now, max_tokens=state.match_limit, touch=False
            )
            state.known_uncached = state.fill_len - match.num_tokens
            deprioritized = 0
            if match.num_tokens <= IN_BATCH_PREFIX_THRESHOLD:
                chain = _page_chain(state.all_ids, page, state.fill_len - 1)
                shared = 0
                for key in chain:
                    if key not in seen:
                        break
                    shared += page
                if shared > IN_BATCH_PREFIX_THRESHOLD:
                    deprioritized = 1
                else:
                    seen.update(chain)
            keyed.append((deprioritized, -match.num_tokens, state))
        keyed.sort(key=lambda item: (item[0], item[1]))  # stable: ties keep arrival order
        self._waiting = deque(state for _, _, state in keyed)

    def _chunk_size(self, remaining: int, budget: int) -> int:
        """Prefill tokens to run within `budget`: all `remaining` when they fit, else the
        budget cut to a page multiple (0 when not even a page fits)."""
        if remaining <= budget:
            return max(remaining, 0)
        return max(budget, 0) // self.config.page_size * self.config.page_size

    def _running_reserve_pages(self) -> int:
        """Pages running requests still reserve: their remaining min(max_new - output, clip)
        tokens x new_token_ratio (SGLang's PrefillAdder), beyond what they hold; a request
        still prefilling also reserves the rest of its prompt."""
        total = 0.0
        clip = self.config.clip_max_new_tokens
        for state in self._running:
            assert state.handle is not None
            held = state.handle.capacity_tokens(self.config.page_size)
            remaining_out = max(state.req.max_new_tokens - len(state.output_ids), 0)
            want = state.fill_len + min(remaining_out, clip) * self.new_token_ratio
            total += max(want - held, 0.0)
        return self.cache.pages_for(int(total + 0.999999))

    def _admit(self, now: float, budget: int, chunks: list[tuple[_Req, int]]) -> int:
        """Admit waiting requests in queue order; appends their first chunks; returns how
        many."""
        admitted = 0
        clip = self.config.clip_max_new_tokens
        outstanding = self._running_reserve_pages()
        while (
            self._waiting and budget > 0 and len(self._running) < self.config.max_running_requests
        ):
            state = self._waiting[0]
            handle = self.cache.acquire(state.all_ids, now, max_tokens=state.match_limit)
            cached = handle.shared_pages * self.config.page_size
            state.known_uncached = state.fill_len - cached
            remaining_out = max(state.req.max_new_tokens - len(state.output_ids), 0)
            # uncached prompt + clipped output, as pages beyond the cached prefix (now locked,
            # so no longer counted as available)
            need = self.cache.pages_for(state.fill_len + min(remaining_out, clip)) - (
                handle.shared_pages
            )
            size = self._chunk_size(state.fill_len - cached, budget)
            if need > self.cache.available_pages - outstanding or size == 0:
                self.cache.release(handle, (), now, insert=False)
                break
            self._waiting.popleft()
            state.handle = handle
            state.kv_len = cached
            self._admit_counter += 1
            state.admit_seq = self._admit_counter
            if not state.admitted_once:
                state.admitted_once = True
                state.cached_tokens = cached
                self._prompt_tokens_total += state.prompt_len
                self._cached_tokens_total += cached
            self._running.append(state)
            admitted += 1
            grown = self.cache.grow(handle, state.kv_len + size, now)
            assert grown, "admission checked the headroom"
            outstanding += max(need - handle.private_pages, 0)
            chunks.append((state, size))
            budget -= size
        return admitted

    def _due(self, state: _Req) -> bool:
        """SGLang's should_output for a request that did not finish this step."""
        if not state.req.stream:
            return len(state.output_ids) % NON_STREAM_OUTPUT_INTERVAL == 0
        interval = state.req.stream_interval or self.config.stream_interval
        if interval > 1:
            return len(state.output_ids) % interval == 1
        return True

    def _emit_token(
        self,
        state: _Req,
        emitted: list[_Req],
        finished: list[RequestFinished],
        now: float,
    ) -> None:
        """Append the request's next output token and apply SGLang's finish checks."""
        token = state.req.output.token_at(len(state.output_ids))
        state.output_ids.append(token)
        state.all_ids.append(token)
        state.unsent.append(token)
        emitted.append(state)
        if len(state.output_ids) >= state.req.max_new_tokens:
            self._finish(state, "length", None, finished, now)
        elif not state.req.ignore_eos and (
            token in state.req.stop_token_ids or token in self.config.eos_token_ids
        ):
            self._finish(state, "stop", token, finished, now)

    def _finish(
        self,
        state: _Req,
        reason: str,
        matched: int | None,
        finished: list[RequestFinished],
        now: float,
    ) -> None:
        self._running.remove(state)
        self._release(state, now)
        del self._by_id[state.req.request_id]
        self._finished_total += 1
        finished.append(self._finished(state, reason, matched))

    def _release(self, state: _Req, now: float, *, insert: bool = True) -> None:
        """Return the request's KV: computed full pages into the cache (when `insert`), the
        rest freed."""
        assert state.handle is not None
        self.cache.release(state.handle, state.all_ids[: state.kv_len], now, insert=insert)
        state.handle = None

    def _retract(self, state: _Req, now: float) -> None:
        """Preempt a running request: free its KV and queue it at the back; it will re-prefill
        its prompt plus the output so far and then continue."""
        self._running.remove(state)
        self._release(state, now, insert=False)
        self._retracted_total += 1
        state.fill_len = len(state.all_ids)
        state.kv_len = 0
        state.known_uncached = state.fill_len
        self._waiting.append(state)

    def _finished(self, state: _Req, reason: str, matched: int | None) -> RequestFinished:
        return RequestFinished(
            request_id=state.req.request_id,
            finish_reason=reason,
            matched_token_id=matched,
            prompt_tokens=state.prompt_len,
            completion_tokens=len(state.output_ids),
            cached_tokens=state.cached_tokens,
        )


def _page_chain(token_ids: Sequence[int], page_size: int, max_tokens: int) -> list[int]:
    """Identities of the full pages of `token_ids[:max_tokens]`, each folding in its prefix
    (so equal identities mean equal prefixes); Python's int/tuple hash is not salted."""
    chain: list[int] = []
    key = 0
    for start in range(0, max(max_tokens, 0) // page_size * page_size, page_size):
        key = hash((key, tuple(token_ids[start : start + page_size])))
        chain.append(key)
    return chain

"""Continuous-batching scheduler of one simulated SGLang worker (pure: plain data in and out).

Rule of this file: decisions only. Time comes in as `now` (seconds of simulated time); there is
no clock, no sleep, no I/O and no randomness here, so the same code runs under the live worker
(`homing.sim.engine_loop`) and under a virtual-clock fleet simulator.

One `step(now)` is one SGLang scheduler iteration (mixed-chunk mode, each iteration runs the
decode batch and prefill chunks together):

1. decode: every request whose prefill is done gets one more KV slot; if the pool has no
   room even after evicting unreferenced cache pages, the newest running request is retracted
   (its KV released into the cache, the request back at the head of the queue; it resumes by
   re-prefilling prompt + output so far);
2. prefill: token budget = chunked_prefill_size - decode tokens. The request whose prefill is
   in progress continues first; then waiting requests are admitted first-come first-served
   while the budget lasts, `max_running_requests` is not reached, and the request's KV
   footprint fits: its uncached prompt tokens plus a reservation for its output
   (min(max_new_tokens, 4096) tokens, SGLang's CLIP_MAX_NEW_TOKENS) must fit in the free plus
   evictable pages not already reserved by running requests. Otherwise it waits (FCFS: the
   queue head blocks the rest). A chunk that does not finish a prompt is cut to a page
   multiple;
3. the step's duration comes from the timing model over the whole batch;
4. results: a prefill that completes produces the first output token, each decode one token;
   requests finish on max_new_tokens ("length"), an EOS or stop token ("stop", matched token
   id; both ignored under ignore_eos, as SGLang does), or abort. Computed full pages enter the
   radix cache after each prefill chunk and at finish (SGLang's cache_unfinished_req /
   cache_finished_req), which is when `BlockStored` events appear.

State changes are applied at the start of the step; the shell makes them visible after
`duration_s` (tokens streamed, events published).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from homing.sim.radix_cache import KvEvent, KvHandle, RadixCache
from homing.sim.timing import PrefillChunk

CLIP_MAX_NEW_TOKENS = 4096
"""Output tokens reserved per request at admission at most (SGLang's CLIP_MAX_NEW_TOKENS)."""

GEN_THROUGHPUT_WINDOW_S = 5.0
"""Window (simulated seconds) over which `gen_throughput` averages generated tokens."""


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

    max_new_tokens >= 0; `output` decides which tokens the request produces.
    """

    request_id: str
    input_ids: tuple[int, ...]
    max_new_tokens: int
    output: TokenSource
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one worker's scheduler (tokens unless stated); `clip_max_new_tokens` caps the
    output reserved per request at admission."""

    kv_capacity_tokens: int
    max_running_requests: int
    page_size: int = 16
    chunked_prefill_size: int = 8192
    eos_token_ids: frozenset[int] = frozenset()
    clip_max_new_tokens: int = CLIP_MAX_NEW_TOKENS


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
    """The figures GetLoads and EngineLoad report (tokens unless stated)."""

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

    @property
    def prefilling(self) -> bool:
        return self.kv_len < self.fill_len

    @property
    def prompt_len(self) -> int:
        return len(self.req.input_ids)


class Scheduler:
    """SGLang-style continuous batching over a `RadixCache` (see the module docstring).

    `add_request` / `abort` / `flush_cache` change the queue between steps; `step(now)` runs one
    iteration. Raises ValueError on a duplicate request id or a config that does not give at
    least one KV page.
    """

    def __init__(self, config: SchedulerConfig, timer: StepTimer) -> None:
        total_pages = config.kv_capacity_tokens // config.page_size
        if total_pages < 1:
            raise ValueError("kv_capacity_tokens must hold at least one page")
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
        self._recent: deque[tuple[float, int]] = deque()

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
        """Queue `request` (FCFS). Raises ValueError on an empty prompt or a request id that is
        already in the scheduler."""
        if request.request_id in self._by_id:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if not request.input_ids:
            raise ValueError("empty input_ids")
        state = _Req(req=request, arrival=now, all_ids=list(request.input_ids))
        state.fill_len = len(state.all_ids)
        match = self.cache.match_prefix(
            state.all_ids, now, max_tokens=state.fill_len - 1, touch=False
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
        retracted = 0
        produced: dict[str, tuple[_Req, list[int]]] = {}
        finished: list[RequestFinished] = []
        pool_tokens = self.cache.total_pages * cfg.page_size

        # 1. decode: one more KV slot per decoding request; retract the newest when full.
        decode: list[_Req] = []
        for state in sorted(
            (r for r in self._running if not r.prefilling), key=lambda r: r.admit_seq
        ):
            if state.handle is None:  # retracted while making room for an older request
                continue
            if state.kv_len + 1 > pool_tokens:  # longer than the whole pool: stop it here
                self._finish(state, "length", None, finished, now)
                continue
            while not self.cache.grow(state.handle, state.kv_len + 1, now):
                victim = max(self._running, key=lambda r: r.admit_seq)
                self._retract(victim, now)
                retracted += 1
                if victim is state:
                    break
            if state.handle is not None:
                decode.append(state)

        # 2. prefill: continue the chunked request, then admit FCFS within the token budget.
        budget = max(cfg.chunked_prefill_size, cfg.page_size) - len(decode)
        chunks: list[tuple[_Req, int]] = []
        for state in sorted((r for r in self._running if r.prefilling), key=lambda r: r.admit_seq):
            size = self._chunk_size(state.fill_len - state.kv_len, budget)
            if size == 0 or state.handle is None:
                break
            while not self.cache.grow(state.handle, state.kv_len + size, now):
                # decodes outgrew their reservations: make room from newer prefills
                newer = [r for r in self._running if r.prefilling and r.admit_seq > state.admit_seq]
                if not newer:
                    break
                self._retract(max(newer, key=lambda r: r.admit_seq), now)
                retracted += 1
            else:
                chunks.append((state, size))
                budget -= size
                continue
            break
        admitted = 0
        if self._waiting and budget > 0:
            admitted = self._admit(now, budget, chunks)

        # 3. duration of the whole batch.
        prefill_work = [PrefillChunk(size, state.kv_len) for state, size in chunks]
        decode_context = sum(state.kv_len + 1 for state in decode)
        duration = self.timer.step_time_s(prefill_work, len(decode), decode_context)

        # 4. results.
        for state in decode:
            state.kv_len += 1
            self._emit_token(state, produced, finished, now)
        for state, size in chunks:
            state.kv_len += size
            assert state.handle is not None
            if state.prefilling:
                self.cache.checkpoint(state.handle, state.all_ids[: state.kv_len], now)
                continue
            if len(state.output_ids) >= state.req.max_new_tokens:
                self._finish(state, "length", None, finished, now)
                continue
            self.cache.checkpoint(state.handle, state.all_ids[: state.kv_len], now)
            self._emit_token(state, produced, finished, now)

        outputs = tuple(
            RequestOutput(
                request_id=rid,
                token_ids=tuple(tokens),
                prompt_tokens=state.prompt_len,
                completion_tokens=len(state.output_ids),
                cached_tokens=state.cached_tokens,
            )
            for rid, (state, tokens) in produced.items()
        )
        generated = sum(len(tokens) for _, tokens in produced.values())
        if generated:
            self._recent.append((now, generated))
        return StepResult(
            started_at=now,
            duration_s=duration,
            outputs=outputs,
            finished=tuple(finished),
            kv_events=tuple(self.cache.take_events()),
            prefill_tokens=sum(size for _, size in chunks),
            decode_tokens=len(decode),
            admitted=admitted,
            retracted=retracted,
        )

    # ---- load ----

    def load(self, now: float) -> LoadStats:
        """Current load figures; `gen_throughput` is tokens/s over the last
        GEN_THROUGHPUT_WINDOW_S of simulated time before `now`."""
        page = self.config.page_size
        total_tokens = self.cache.total_pages * page
        used_tokens = self.cache.used_pages * page
        while self._recent and self._recent[0][0] <= now - GEN_THROUGHPUT_WINDOW_S:
            self._recent.popleft()
        recent_tokens = sum(n for _, n in self._recent)
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
            gen_throughput=recent_tokens / GEN_THROUGHPUT_WINDOW_S,
            cache_hit_rate=(
                self._cached_tokens_total / self._prompt_tokens_total
                if self._prompt_tokens_total
                else 0.0
            ),
            max_running_requests=self.config.max_running_requests,
            num_retracted=self._retracted_total,
        )

    # ---- internals ----

    def _chunk_size(self, remaining: int, budget: int) -> int:
        """Prefill tokens to run within `budget`: all `remaining` when they fit, else the
        budget cut to a page multiple (0 when not even a page fits)."""
        if remaining <= budget:
            return max(remaining, 0)
        return max(budget, 0) // self.config.page_size * self.config.page_size

    def _reserve_tokens(self, state: _Req) -> int:
        """KV tokens a running request may grow to: prompt and output so far plus up to
        clip_max_new_tokens more output, never more than the pool."""
        remaining = max(state.req.max_new_tokens - len(state.output_ids), 0)
        want = state.fill_len + min(remaining, self.config.clip_max_new_tokens)
        return min(want, self.cache.total_pages * self.config.page_size)

    def _outstanding_pages(self) -> int:
        """Pages running requests have reserved but not yet allocated."""
        total = 0
        for state in self._running:
            assert state.handle is not None
            held = state.handle.shared_pages + state.handle.private_pages
            total += max(self.cache.pages_for(self._reserve_tokens(state)) - held, 0)
        return total

    def _admit(self, now: float, budget: int, chunks: list[tuple[_Req, int]]) -> int:
        """Admit waiting requests FCFS; appends their first chunks; returns how many."""
        admitted = 0
        outstanding = self._outstanding_pages()
        while (
            self._waiting and budget > 0 and len(self._running) < self.config.max_running_requests
        ):
            state = self._waiting[0]
            handle = self.cache.acquire(state.all_ids, now, max_tokens=state.fill_len - 1)
            cached = handle.shared_pages * self.config.page_size
            state.known_uncached = state.fill_len - cached
            # pages the request may still need beyond its cached prefix (now locked, so no
            # longer counted as available)
            need = self.cache.pages_for(self._reserve_tokens(state)) - handle.shared_pages
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
            outstanding += need - handle.private_pages
            chunks.append((state, size))
            budget -= size
        return admitted

    def _emit_token(
        self,
        state: _Req,
        produced: dict[str, tuple[_Req, list[int]]],
        finished: list[RequestFinished],
        now: float,
    ) -> None:
        """Append the request's next output token and apply SGLang's finish checks."""
        token = state.req.output.token_at(len(state.output_ids))
        state.output_ids.append(token)
        state.all_ids.append(token)
        produced.setdefault(state.req.request_id, (state, []))[1].append(token)
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
        finished.append(self._finished(state, reason, matched))

    def _release(self, state: _Req, now: float) -> None:
        """Return the request's KV: computed full pages into the cache, the rest freed."""
        assert state.handle is not None
        self.cache.release(state.handle, state.all_ids[: state.kv_len], now)
        state.handle = None

    def _retract(self, state: _Req, now: float) -> None:
        """Preempt a running request: release its KV and queue it first; it will re-prefill
        its prompt plus the output so far and then continue."""
        self._running.remove(state)
        self._release(state, now)
        self._retracted_total += 1
        state.fill_len = len(state.all_ids)
        state.kv_len = 0
        state.known_uncached = state.fill_len
        self._waiting.appendleft(state)

    def _finished(self, state: _Req, reason: str, matched: int | None) -> RequestFinished:
        return RequestFinished(
            request_id=state.req.request_id,
            finish_reason=reason,
            matched_token_id=matched,
            prompt_tokens=state.prompt_len,
            completion_tokens=len(state.output_ids),
            cached_tokens=state.cached_tokens,
        )

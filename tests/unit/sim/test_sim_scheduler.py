"""The pure scheduler: continuous batching, chunked prefill, KV admission, schedule policies,
the queue bound, retraction, stream_interval, finish rules, abort."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from homing.sim.radix_cache import BlockRemoved, BlockStored, KvEvent
from homing.sim.scheduler import (
    QueueFull,
    RequestFinished,
    Scheduler,
    SchedulerConfig,
    SimRequest,
    StepResult,
)
from homing.sim.timing import TimingModel

EOS = 1
PAGE = 16
TIMING = TimingModel.from_names("llama-3.1-8b", "H100", 1)


@dataclass(frozen=True)
class Counting:
    """Output token i is `start + i`; token `eos_at` (if set) is the EOS id."""

    start: int = 1000
    eos_at: int | None = None

    def token_at(self, index: int) -> int:
        return EOS if index == self.eos_at else self.start + index


def make(
    kv_tokens: int = 16 * 1024,
    max_running: int = 64,
    chunk: int = 8192,
    clip: int = 4096,
    **options: object,
) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            kv_capacity_tokens=kv_tokens,
            max_running_requests=max_running,
            page_size=PAGE,
            chunked_prefill_size=chunk,
            eos_token_ids=frozenset({EOS}),
            clip_max_new_tokens=clip,
            **options,  # type: ignore[arg-type]
        ),
        TIMING,
    )


def request(
    rid: str,
    prompt_len: int = 40,
    max_new: int = 10,
    *,
    base: int = 10_000,
    output: Counting | None = None,
    stop: frozenset[int] = frozenset(),
    ignore_eos: bool = False,
    prefix: tuple[int, ...] = (),
    stream: bool = True,
    stream_interval: int | None = None,
) -> SimRequest:
    return SimRequest(
        request_id=rid,
        input_ids=prefix + tuple(range(base, base + prompt_len)),
        max_new_tokens=max_new,
        output=output or Counting(),
        stop_token_ids=stop,
        ignore_eos=ignore_eos,
        stream=stream,
        stream_interval=stream_interval,
    )


def run(sched: Scheduler, now: float = 0.0, limit: int = 100_000) -> tuple[list[StepResult], float]:
    """Step until idle; returns the steps and the final time."""
    steps = []
    while sched.has_work and len(steps) < limit:
        result = sched.step(now)
        assert result.did_work or result.finished, "a step with work pending must progress"
        now += result.duration_s
        steps.append(result)
    return steps, now


def finished_by_id(steps: list[StepResult]) -> dict[str, RequestFinished]:
    return {f.request_id: f for s in steps for f in s.finished}


def tokens_by_id(steps: list[StepResult]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for step in steps:
        for o in step.outputs:
            out.setdefault(o.request_id, []).extend(o.token_ids)
    return out


class TestBatching:
    def test_chunked_prefill_runs_alongside_decode(self) -> None:
        """A long prompt is prefilled in page-aligned chunks within the step budget while a
        running request keeps decoding one token per step."""
        sched = make(chunk=256)
        sched.add_request(request("short", prompt_len=20, max_new=50), 0.0)
        first = sched.step(0.0)
        assert [o.request_id for o in first.outputs] == ["short"]
        sched.add_request(request("long", prompt_len=1000, max_new=5, base=50_000), 0.0)
        mixed = []
        now = first.duration_s
        while not any(o.request_id == "long" for s in mixed for o in s.outputs):
            step = sched.step(now)
            now += step.duration_s
            mixed.append(step)
        assert len(mixed) >= 4  # 1000 tokens at < 256 per step
        for step in mixed:
            assert step.decode_tokens == 1
            assert "short" in {o.request_id for o in step.outputs}
            assert step.prefill_tokens <= 256 - step.decode_tokens
        assert all(s.prefill_tokens % PAGE == 0 for s in mixed[:-1])
        assert sum(s.prefill_tokens for s in mixed) == 1000

    def test_max_running_requests_caps_the_batch(self) -> None:
        """No more than max_running_requests run at once; the rest wait and finish later."""
        sched = make(max_running=2)
        for i in range(5):
            sched.add_request(request(f"r{i}", base=10_000 * (i + 1)), 0.0)
        sched.step(0.0)
        assert (sched.num_running, sched.num_waiting) == (2, 3)
        steps, _ = run(sched)
        assert len(finished_by_id(steps)) == 5

    def test_step_duration_comes_from_the_timing_model(self) -> None:
        """A decode-only step lasts what the roofline says for that batch and context."""
        sched = make()
        sched.add_request(request("a", prompt_len=100, max_new=5), 0.0)
        sched.step(0.0)
        decode = sched.step(1.0)
        assert decode.prefill_tokens == 0
        assert decode.duration_s == pytest.approx(TIMING.decode_step_time_s(1, 101))


class TestKvAdmission:
    def test_requests_queue_while_the_pool_is_full_and_complete_later(self) -> None:
        """With room for one request's prompt plus reserved output, the second waits in the
        queue (not an error) and completes after the first frees its pages."""
        sched = make(kv_tokens=16 * 12)  # 12 pages
        sched.add_request(request("a", prompt_len=100, max_new=60, base=10_000), 0.0)
        sched.add_request(request("b", prompt_len=100, max_new=60, base=20_000), 0.0)
        sched.step(0.0)
        assert (sched.num_running, sched.num_waiting) == (1, 1)
        assert sched.load(0.0).waiting_uncached_tokens == 100
        steps, _ = run(sched)
        done = finished_by_id(steps)
        assert {r: f.finish_reason for r, f in done.items()} == {"a": "length", "b": "length"}
        assert done["b"].completion_tokens == 60

    def test_decode_beyond_the_reservation_retracts_the_newest_and_all_finish(self) -> None:
        """When outputs outgrow their admission reservation and the pool runs dry, the newest
        request is retracted, re-queued, and still produces exactly its answer."""
        sched = make(kv_tokens=512, clip=32)
        for i in range(2):
            sched.add_request(
                request(f"r{i}", prompt_len=32, max_new=300, base=1000 * (i + 1)), 0.0
            )
        steps, _ = run(sched)
        assert sum(s.retracted for s in steps) >= 1
        assert sched.load(0.0).num_retracted >= 1
        outputs = tokens_by_id(steps)
        for i in range(2):
            assert outputs[f"r{i}"] == [1000 + k for k in range(300)]
        assert sched.cache.used_pages == 0

    def test_a_repeated_prompt_reports_cached_tokens(self) -> None:
        """The second request with the same prompt matches the cached full pages (at most
        prompt length - 1), and its prefill is shorter."""
        sched = make()
        sched.add_request(request("a", prompt_len=2000, max_new=3), 0.0)
        first, now = run(sched)
        sched.add_request(request("b", prompt_len=2000, max_new=3), now)
        second, _ = run(sched, now)
        assert finished_by_id(first)["a"].cached_tokens == 0
        assert finished_by_id(second)["b"].cached_tokens == 1984
        assert second[0].prefill_tokens == 16
        assert second[0].duration_s < first[0].duration_s
        assert sched.load(now).cache_hit_rate == pytest.approx(1984 / 4000)

    def test_time_to_first_token_sums_arrival_to_the_end_of_the_first_tokens_step(
        self,
    ) -> None:
        """Two requests arriving at 0.0 and 0.5 get their first tokens at the end of the
        steps that prefilled them; later tokens add nothing."""
        sched = make()
        sched.add_request(request("a", prompt_len=2000, max_new=3), 0.0)
        first, now = run(sched)
        sched.add_request(request("b", prompt_len=3000, max_new=4), now + 0.5)
        second, _ = run(sched, now + 0.5)
        want = first[0].duration_s + second[0].duration_s
        load = sched.load(now)
        assert load.first_tokens_total == 2
        assert load.ttft_seconds_total == pytest.approx(want)

    def test_kv_pages_enter_the_cache_after_prefill_and_at_finish(self) -> None:
        """Prompt pages are stored when prefill completes, output pages when the request ends:
        each insert one event with all its new pages (a radix node, as SGLang's)."""
        sched = make()
        sched.add_request(request("a", prompt_len=40, max_new=30), 0.0)
        steps, _ = run(sched)
        stored = [[e for e in s.kv_events if isinstance(e, BlockStored)] for s in steps]
        blocks_per_step = [[len(e.block_hashes) for e in events] for events in stored]
        assert blocks_per_step[0] == [2]  # 40 prompt tokens -> 2 full pages
        assert blocks_per_step[-1] == [2]  # 40 + 30 - 1 = 69 tokens with KV -> 4 pages in all
        assert sum(n for step in blocks_per_step for n in step) == 4
        assert stored[-1][0].parent_block_hash == stored[0][0].block_hashes[-1]


class TestFinishRules:
    def test_max_new_tokens_ends_with_length(self) -> None:
        """Exactly max_new_tokens tokens, finish_reason "length"."""
        sched = make()
        sched.add_request(request("a", max_new=7), 0.0)
        steps, _ = run(sched)
        assert tokens_by_id(steps)["a"] == [1000 + i for i in range(7)]
        done = finished_by_id(steps)["a"]
        assert (done.finish_reason, done.completion_tokens, done.matched_token_id) == (
            "length",
            7,
            None,
        )

    def test_eos_ends_with_stop_and_the_matched_token(self) -> None:
        """The EOS token is emitted, then the request stops with matched_token_id = EOS."""
        sched = make()
        sched.add_request(request("a", max_new=50, output=Counting(eos_at=4)), 0.0)
        steps, _ = run(sched)
        assert tokens_by_id(steps)["a"] == [1000, 1001, 1002, 1003, EOS]
        done = finished_by_id(steps)["a"]
        assert (done.finish_reason, done.matched_token_id) == ("stop", EOS)

    def test_stop_token_ids_end_with_stop(self) -> None:
        """A token listed in stop_token_ids stops the request with that token matched."""
        sched = make()
        sched.add_request(request("a", max_new=50, stop=frozenset({1003})), 0.0)
        steps, _ = run(sched)
        done = finished_by_id(steps)["a"]
        assert (done.finish_reason, done.matched_token_id, done.completion_tokens) == (
            "stop",
            1003,
            4,
        )

    def test_ignore_eos_runs_to_max_new_tokens(self) -> None:
        """Under ignore_eos neither EOS nor stop_token_ids end the request (as SGLang)."""
        sched = make()
        sched.add_request(
            request(
                "a",
                max_new=12,
                output=Counting(eos_at=3),
                stop=frozenset({1005}),
                ignore_eos=True,
            ),
            0.0,
        )
        steps, _ = run(sched)
        done = finished_by_id(steps)["a"]
        assert (done.finish_reason, done.completion_tokens) == ("length", 12)

    def test_max_new_tokens_zero_prefills_and_ends_without_tokens(self) -> None:
        """max_new_tokens=0 runs the prefill and finishes with "length" and no output."""
        sched = make()
        sched.add_request(request("a", max_new=0), 0.0)
        steps, _ = run(sched)
        assert tokens_by_id(steps) == {}
        assert finished_by_id(steps)["a"].finish_reason == "length"


class TestAbort:
    def test_abort_of_a_running_request_frees_its_pages_at_once(self) -> None:
        """An aborted running request leaves the batch immediately and holds no KV pages;
        its computed full pages stay cached but unreferenced."""
        sched = make()
        sched.add_request(request("a", prompt_len=100, max_new=1000), 0.0)
        for i in range(5):
            sched.step(float(i))
        assert sched.cache.used_pages > 0
        done, _events = sched.abort("a", 5.0)
        assert done is not None
        assert (done.finish_reason, done.completion_tokens) == ("abort", 5)
        assert sched.num_running == 0
        assert sched.cache.used_pages == 0
        assert sched.cache.evictable_pages == 6  # 100 + 4 tokens with KV -> 6 full pages
        assert not sched.has_work

    def test_abort_of_a_waiting_request_and_of_an_unknown_id(self) -> None:
        """A queued request is simply dropped; an unknown id is reported as None."""
        sched = make(max_running=1)
        sched.add_request(request("a"), 0.0)
        sched.add_request(request("b", base=30_000), 0.0)
        sched.step(0.0)
        done, events = sched.abort("b", 0.1)
        assert done is not None and done.finish_reason == "abort"
        assert events == []
        assert sched.num_waiting == 0
        assert sched.abort("nope", 0.1) == (None, [])

    def test_duplicate_request_ids_are_refused(self) -> None:
        """A request id already in the scheduler cannot be added again."""
        sched = make()
        sched.add_request(request("a"), 0.0)
        with pytest.raises(ValueError):
            sched.add_request(request("a"), 0.0)


class TestEventStream:
    def test_events_replayed_in_order_mirror_the_cache_exactly(self) -> None:
        """Under eviction pressure every stored block's parent is live when it is stored (a
        run's blocks chain on each other), every removed block was stored and no live block is
        left under it, and the replayed set equals the cache's pages."""
        sched = make(kv_tokens=16 * 64, max_running=4, chunk=128)
        live: dict[int, int | None] = {}
        removed = 0
        now = 0.0

        def replay(event: KvEvent, check: bool) -> int:
            if isinstance(event, BlockStored):
                parent = event.parent_block_hash
                assert len(event.token_ids) == len(event.block_hashes) * event.block_size
                for block_hash in event.block_hashes:
                    assert not check or (
                        block_hash not in live and (parent is None or parent in live)
                    )
                    live[block_hash] = parent
                    parent = block_hash
                return 0
            assert isinstance(event, BlockRemoved)
            for block_hash in event.block_hashes:
                del live[block_hash]
            gone = set(event.block_hashes)
            assert not check or not gone & set(live.values())  # leaves of what stays
            return len(gone)

        for i in range(40):
            shared = list(range(7000, 7000 + 16 * (i % 5)))
            prompt = shared + list(range(100_000 + 97 * i, 100_000 + 97 * i + 30 + i % 7))
            sched.add_request(
                SimRequest(
                    request_id=f"r{i}",
                    input_ids=tuple(prompt),
                    max_new_tokens=20 + i % 13,
                    output=Counting(start=50_000 + i * 100),
                ),
                now,
            )
            for _ in range(3):
                if sched.has_work:
                    step = sched.step(now)
                    now += step.duration_s
                    for event in step.kv_events:
                        removed += replay(event, check=True)
        steps, _ = run(sched, now)
        for step in steps:
            for event in step.kv_events:
                replay(event, check=False)
        assert removed > 0
        assert len(live) == sched.cache.tree_pages
        assert sched.cache.tree_pages <= 64


def admitted_order(sched: Scheduler, now: float = 0.0) -> list[str]:
    """Step with one running slot until idle; the order in which requests produced output."""
    order: list[str] = []
    steps, _ = run(sched, now)
    for step in steps:
        for output in step.outputs:
            if output.request_id not in order:
                order.append(output.request_id)
    return order


class TestSchedulePolicy:
    def test_lpm_admits_the_longest_cached_prefix_first_and_fcfs_does_not(self) -> None:
        """With a 640-token prefix cached, lpm runs the request that reuses it before an older
        one that does not; fcfs keeps arrival order."""
        prefix = tuple(range(500_000, 500_640))
        orders = {}
        for policy in ("fcfs", "lpm"):
            sched = make(max_running=1, schedule_policy=policy)
            sched.add_request(request("warm", prompt_len=16, max_new=2, prefix=prefix), 0.0)
            _, now = run(sched)
            sched.add_request(request("other", prompt_len=400, max_new=2, base=70_000), now)
            sched.add_request(request("reuse", prompt_len=16, max_new=2, prefix=prefix), now)
            orders[policy] = admitted_order(sched, now)
        assert orders == {"fcfs": ["other", "reuse"], "lpm": ["reuse", "other"]}

    def test_lpm_holds_back_a_request_sharing_an_uncached_prefix_with_an_earlier_one(
        self,
    ) -> None:
        """SGLang's in-batch prefix caching: of two waiting requests that share 64 uncached
        tokens, the second waits behind an unrelated one (two slots: first and unrelated run)
        and then reuses the first's KV."""
        shared = tuple(range(600_000, 600_064))
        sched = make(max_running=2, schedule_policy="lpm")
        sched.add_request(request("first", prompt_len=16, max_new=2, prefix=shared), 0.0)
        sched.add_request(request("second", prompt_len=16, max_new=2, prefix=shared, base=1), 0.0)
        sched.add_request(request("unrelated", prompt_len=16, max_new=2, base=90_000), 0.0)
        step = sched.step(0.0)
        assert {o.request_id for o in step.outputs} == {"first", "unrelated"}
        steps, _ = run(sched, step.duration_s)
        assert finished_by_id(steps)["second"].cached_tokens == 64

    def test_lpm_falls_back_to_fcfs_above_128_waiting_requests(self) -> None:
        """With 129 requests waiting, lpm stops sorting: the queue head is admitted first."""
        prefix = tuple(range(500_000, 500_640))
        sched = make(max_running=1, schedule_policy="lpm")
        sched.add_request(request("warm", prompt_len=16, max_new=1, prefix=prefix), 0.0)
        _, now = run(sched)
        for i in range(128):
            sched.add_request(request(f"q{i}", prompt_len=16, max_new=1, base=100 * (i + 1)), now)
        sched.add_request(request("reuse", prompt_len=16, max_new=1, prefix=prefix), now)
        first = sched.step(now)
        assert [o.request_id for o in first.outputs] == ["q0"]

    def test_an_unknown_policy_is_refused(self) -> None:
        """Only fcfs and lpm are simulated."""
        with pytest.raises(ValueError, match="lpm"):
            make(schedule_policy="dfs-weight")


class TestQueueBound:
    def test_a_full_waiting_queue_refuses_new_requests_until_it_drains(self) -> None:
        """Beyond max_queued_requests waiting, add_request raises QueueFull (counted); once the
        queue moves, requests are accepted again."""
        sched = make(max_running=1, max_queued_requests=2)
        for i in range(3):  # one will run, two wait
            sched.add_request(request(f"r{i}", base=1000 * (i + 1)), 0.0)
            if i == 0:
                sched.step(0.0)
        with pytest.raises(QueueFull, match="queue is full"):
            sched.add_request(request("late", base=50_000), 0.0)
        assert sched.load(0.0).requests_rejected_total == 1
        assert "late" not in sched
        run(sched)
        sched.add_request(request("late", base=50_000), 10.0)
        assert "late" in sched


class TestRetraction:
    def test_optimistic_admission_retracts_under_pressure_and_everyone_finishes(self) -> None:
        """Admission reserves running requests' output at new_token_ratio (< 1), so a small
        pool over-admits, decode runs out, the newest requests are retracted and counted, and
        every request still produces exactly its answer."""
        sched = make(kv_tokens=16 * 48)
        for i in range(6):
            sched.add_request(
                request(f"r{i}", prompt_len=64, max_new=200, base=10_000 * (i + 1)), 0.0
            )
        steps, _ = run(sched)
        assert sum(s.retracted for s in steps) >= 1
        assert sched.load(0.0).num_retracted == sum(s.retracted for s in steps)
        outputs = tokens_by_id(steps)
        assert all(outputs[f"r{i}"] == [1000 + k for k in range(200)] for i in range(6))
        assert sched.cache.used_pages == 0

    def test_new_token_ratio_decays_per_decode_step_and_jumps_after_a_retraction(self) -> None:
        """The reserve ratio starts at 0.7, falls by (0.7 - 0.098) / 600 per decode step, and a
        retraction resets it to SGLang's estimate from the survivors' progress."""
        sched = make()
        sched.add_request(request("a", prompt_len=40, max_new=50), 0.0)
        sched.step(0.0)
        before = sched.new_token_ratio
        sched.step(1.0)
        assert before - sched.new_token_ratio == pytest.approx((0.7 - 0.7 * 0.14) / 600)
        small = make(kv_tokens=16 * 48)
        for i in range(6):
            small.add_request(request(f"r{i}", prompt_len=64, max_new=200, base=1000 * i), 0.0)
        now = 0.0
        while True:
            step = small.step(now)
            now += step.duration_s
            if step.retracted:
                break
        assert small.new_token_ratio > small.min_new_token_ratio
        assert small.new_token_ratio <= 1.0


class TestStreamInterval:
    def test_tokens_leave_every_interval_with_the_first_at_once(self) -> None:
        """stream_interval 4: outputs after tokens 1, 5, 9 and at finish (SGLang's rule), and
        together they are the whole answer."""
        sched = make(stream_interval=4)
        sched.add_request(request("a", max_new=11), 0.0)
        steps, _ = run(sched)
        counts = [o.completion_tokens for s in steps for o in s.outputs]
        assert counts == [1, 5, 9, 11]
        assert tokens_by_id(steps)["a"] == [1000 + i for i in range(11)]

    def test_a_request_can_ask_for_its_own_interval_and_non_streaming_waits(self) -> None:
        """A per-request interval overrides the worker's; a non-streaming request's tokens
        leave every 50 and at finish."""
        sched = make()
        sched.add_request(request("own", max_new=7, stream_interval=3), 0.0)
        sched.add_request(request("bulk", max_new=120, stream=False, base=40_000), 0.0)
        steps, _ = run(sched)
        by_id: dict[str, list[int]] = {}
        for step in steps:
            for o in step.outputs:
                by_id.setdefault(o.request_id, []).append(o.completion_tokens)
        assert by_id == {"own": [1, 4, 7], "bulk": [50, 100, 120]}

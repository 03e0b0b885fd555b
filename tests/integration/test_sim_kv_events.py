"""SubscribeKvEvents of a simulated worker over real gRPC: SGLang's blocks, numbering, load."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from kv_subscription import KvSubscription
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from homing.sim.config import SimConfig
from homing.sim.worker import SimWorker

PAGE = 16
PROMPT = list(range(3000, 3064))  # 4 full pages


def sglang_hashes(token_ids: list[int]) -> list[int]:
    """SGLang's per-page chain, recomputed independently (hex digests, int64 of 16 hex chars)."""
    out, prior = [], ""
    for start in range(0, len(token_ids) - PAGE + 1, PAGE):
        h = hashlib.sha256(bytes.fromhex(prior))
        for t in token_ids[start : start + PAGE]:
            h.update(t.to_bytes(4, "little"))
        prior = h.hexdigest()
        value = int(prior[:16], 16)
        out.append(value - 2**64 if value >= 2**63 else value)
    return out


@pytest_asyncio.fixture
async def worker() -> AsyncIterator[SimWorker]:
    """A worker at 20x speed with fast heartbeats."""
    async with SimWorker(
        SimConfig(speedup=20.0, heartbeat_busy_s=0.1, heartbeat_idle_s=0.2)
    ) as sim:
        yield sim


@pytest_asyncio.fixture
async def stub(worker: SimWorker) -> AsyncIterator[pb_grpc.SglangSchedulerStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{worker.port}") as channel:
        yield pb_grpc.SglangSchedulerStub(channel)


async def generate(
    stub: pb_grpc.SglangSchedulerStub, rid: str, max_new: int = 20
) -> pb.GenerateComplete:
    req = pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=PROMPT),
        sampling_params=pb.SamplingParams(temperature=0, max_new_tokens=max_new),
        stream=False,
    )
    return [r async for r in stub.Generate(req)][-1].complete


async def subscribe(stub: pb_grpc.SglangSchedulerStub, before_first: bool = True) -> KvSubscription:
    """A live subscription from sequence 0 (its headers are in)."""
    return await KvSubscription(stub, load_records_before_first_batch=before_first).open()


class TestStoredBlocks:
    async def test_a_prompt_is_stored_as_sglang_blocks_and_then_served_from_cache(
        self, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """The first request stores its prompt pages as one event (a radix node: 16 ids per
        block, SGLang's hash chain, unlinked under the root, locality LOCAL) and its output
        page at the end as another, linked to the last prompt page; the repeat reports cached
        tokens and stores no prompt page."""
        recorder = await subscribe(stub)
        await generate(stub, "first")

        def blocks(batches: list[common_pb2.KvEventBatch]) -> int:
            return sum(len(e.stored.blocks) for b in batches for e in b.events)

        await recorder.until(lambda bs: blocks(bs) >= 5)
        prompt_run, output_run = [e.stored for b in recorder.event_batches() for e in b.events]
        prompt_hashes = sglang_hashes(PROMPT)
        assert [b.block_hash for b in prompt_run.blocks] == prompt_hashes
        assert [list(b.token_ids) for b in prompt_run.blocks] == [
            PROMPT[i : i + PAGE] for i in range(0, 64, PAGE)
        ]
        assert not prompt_run.HasField("parent_block_hash")
        assert len(output_run.blocks) == 1 and output_run.parent_block_hash == prompt_hashes[-1]
        for run in (prompt_run, output_run):
            assert {b.block_size for b in run.blocks} == {PAGE}
            assert run.tier == common_pb2.KV_CACHE_TIER_DEVICE and run.medium == "GPU"
            assert run.locality == common_pb2.KV_CACHE_LOCALITY_LOCAL
        known = len(recorder.event_batches())

        second = await generate(stub, "second")
        assert second.cached_tokens == 48  # 63 tokens may match -> 3 full pages
        await asyncio.sleep(0.1)
        new_hashes = {
            block.block_hash
            for b in recorder.event_batches()[known:]
            for e in b.events
            if e.HasField("stored")
            for block in e.stored.blocks
        }
        assert not new_hashes & set(prompt_hashes)
        await recorder.close()

    async def test_eviction_removes_a_whole_run_in_one_event_before_the_store_it_made_room_for(
        self,
    ) -> None:
        """In a 64-page pool, five 200-token prompts leave five 12-page runs; the sixth evicts
        the least recently used run whole: one removed event with its 12 hashes in order
        (tier DEVICE, medium "GPU", locality LOCAL), in the same batch as, and before, the
        sixth prompt's stored run (as SGLang 0.5.23 with --max-total-tokens 1024)."""
        prompts = [list(range(20_000 + 1000 * i, 20_200 + 1000 * i)) for i in range(6)]
        config = SimConfig(speedup=50.0, kv_capacity_tokens=1024, max_context_length=4096)
        async with SimWorker(config, sidecar=False) as sim:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{sim.port}") as channel:
                stub = pb_grpc.SglangSchedulerStub(channel)
                recorder = await subscribe(stub)
                await recorder.until(bool)  # the subscription is live
                for i, prompt in enumerate(prompts):
                    request = pb.GenerateRequest(
                        request_id=f"p{i}",
                        tokenized=pb.TokenizedInput(input_ids=prompt),
                        sampling_params=pb.SamplingParams(
                            temperature=0, max_new_tokens=8, ignore_eos=True
                        ),
                    )
                    assert [r async for r in stub.Generate(request)][-1].HasField("complete")

                def has_removal(batches: list[common_pb2.KvEventBatch]) -> bool:
                    return any(e.HasField("removed") for b in batches for e in b.events)

                await recorder.until(has_removal)
                await recorder.close()
        (batch,) = [b for b in recorder.event_batches() if has_removal([b])]
        kinds = [e.WhichOneof("data") for e in batch.events]
        assert kinds == ["removed", "stored"]
        removed, stored = batch.events[0].removed, batch.events[1].stored
        assert list(removed.block_hashes) == sglang_hashes(prompts[0])
        assert removed.tier == common_pb2.KV_CACHE_TIER_DEVICE and removed.medium == "GPU"
        assert removed.locality == common_pb2.KV_CACHE_LOCALITY_LOCAL
        assert [b.block_hash for b in stored.blocks] == sglang_hashes(prompts[5])


class TestNumbering:
    async def test_batches_are_numbered_from_1_after_load_records_numbered_0(
        self, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """A subscriber asking for load records first gets load_only records numbered 0, then
        event batches 1, 2, 3, ... each with an EngineLoad; load_only records repeat the last
        number; samples increase."""
        recorder = await subscribe(stub, before_first=True)
        await recorder.until(lambda bs: len(bs) >= 1)
        assert recorder.batches[0].load.load_only and recorder.batches[0].sequence_number == 0
        for i in range(3):
            await generate(stub, f"r{i}", max_new=5 + 20 * i)
        await recorder.until(lambda bs: len([b for b in bs if not b.load.load_only]) >= 3)
        seqs = [b.sequence_number for b in recorder.event_batches()]
        assert seqs == list(range(1, len(seqs) + 1))
        last = 0
        for batch in recorder.batches:
            assert batch.HasField("load") and batch.dp_rank == 0
            if batch.load.load_only:
                assert not batch.events and batch.sequence_number == last
            else:
                last = batch.sequence_number
        samples = [b.load.sample for b in recorder.batches]
        assert samples == sorted(samples) and len(set(samples)) == len(samples)
        await recorder.close()

    async def test_without_the_flag_no_load_record_precedes_the_first_batch(
        self, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """A subscriber that did not ask for early load records gets the first event batch
        first."""
        recorder = await subscribe(stub, before_first=False)
        await asyncio.sleep(0.3)  # longer than the idle heartbeat
        assert recorder.batches == []
        await generate(stub, "x")
        await recorder.until(lambda bs: len(bs) >= 1)
        assert not recorder.batches[0].load.load_only
        assert recorder.batches[0].sequence_number == 1
        await recorder.close()

    async def test_idle_heartbeats_carry_the_load(self, stub: pb_grpc.SglangSchedulerStub) -> None:
        """An idle worker sends load_only heartbeats at its idle period, with telemetry."""
        recorder = await subscribe(stub)
        await recorder.until(lambda bs: len(bs) >= 3, within_s=2.0)
        beat = recorder.batches[-1]
        assert beat.load.load_only and beat.load.running_requests == 0
        assert beat.load.max_total_num_tokens > 0 and beat.load.max_running_requests > 0
        await recorder.close()

    async def test_a_nonzero_start_sequence_number_is_out_of_range(
        self, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """The simulated worker keeps no replay history."""
        call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=5))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE


class TestFlush:
    async def test_flush_cache_publishes_cleared_and_forgets_the_prefix(
        self, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """FlushCache on an idle worker emits a cleared event; the next repeat is a miss."""
        await generate(stub, "warm")
        recorder = await subscribe(stub)
        await recorder.until(bool)  # the subscription is live (its first load record is in)
        assert (await stub.FlushCache(common_pb2.FlushCacheRequest())).success
        await recorder.until(lambda bs: any(e.HasField("cleared") for b in bs for e in b.events))
        assert (await generate(stub, "cold")).cached_tokens == 0
        await recorder.close()

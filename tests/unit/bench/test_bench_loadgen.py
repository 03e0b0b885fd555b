"""The load generator against a loopback stand-in of the gateway's streaming contract."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from homing.bench.loadgen import GatewayError, LoadConfig, fetch_model_id, run_load
from homing.bench.traces import PromptBuilder, TraceRequest


def _req(
    index: int, prompt: int, output: int, arrival: float = 0.0, ids: Any = None
) -> TraceRequest:
    hash_ids = tuple(ids) if ids is not None else None
    return TraceRequest(
        index=index,
        arrival_s=arrival,
        prompt_tokens=prompt,
        output_tokens=output,
        hash_ids=hash_ids,
    )


def _config(url: str, **kw: Any) -> LoadConfig:
    return LoadConfig(url=url, model="fake-model", progress=False, **kw)


async def test_completed_requests_record_times_usage_and_worker(
    fake_gateway: tuple[Any, str],
) -> None:
    """Each request is sent per the contract and records status, worker, times and usage."""
    gateway, url = fake_gateway
    reqs = [
        _req(0, 600, 4, arrival=0.0, ids=[0, 1]),
        _req(1, 700, 3, arrival=0.02, ids=[0, 2]),
        _req(2, 33, 1, arrival=0.04),
    ]
    records = await run_load(reqs, PromptBuilder(), _config(url, speed=1.0))

    assert [r.index for r in records] == [0, 1, 2]
    for rec, req in zip(records, reqs, strict=True):
        assert rec.completed and rec.error is None and rec.status == 200
        assert rec.worker == gateway.worker_by_prompt_len[req.prompt_tokens]
        assert rec.prompt_tokens == req.prompt_tokens
        assert rec.completion_tokens == req.output_tokens
        assert rec.send_s is not None and rec.first_token_s is not None
        assert rec.send_s <= rec.first_token_s <= (rec.last_token_s or 0) <= (rec.end_s or 0)
        assert rec.send_s >= rec.scheduled_s
    assert {r.worker for r in records} == {"w0", "w1"}
    # the second request shares hash id 0 (512 tokens) with the first
    assert records[1].cached_tokens == 512
    body = gateway.bodies[0]
    assert body["max_tokens"] == 4 and len(body["prompt"]) == 600
    assert body["prompt"] == PromptBuilder().prompt_ids(reqs[0])


async def test_failures_are_errors_never_completions(gateway_factory: Any) -> None:
    """A 400, a missing [DONE], a missing usage chunk and a cut stream are each errors."""
    faults = {101: "400", 102: "no_done", 103: "no_usage", 104: "drop", 105: None}
    gateway, url = await gateway_factory(faults={k: v for k, v in faults.items() if v})
    reqs = [_req(i, prompt, 6) for i, prompt in enumerate(faults)]
    records = await run_load(reqs, PromptBuilder(), _config(url))

    by_len = {r.sent_prompt_tokens: r for r in records}
    assert by_len[101].status == 400 and by_len[101].error_kind == "http_400"
    assert "max_tokens is too large" in (by_len[101].error or "")
    assert by_len[101].worker == gateway.worker_by_prompt_len[101]
    assert by_len[102].error_kind == "no_done"
    assert by_len[103].error_kind == "no_usage"
    assert by_len[104].error_kind == "transport"
    assert by_len[105].completed
    assert sum(not r.completed for r in records) == 4


async def test_concurrency_caps_in_flight_and_queueing_is_recorded(gateway_factory: Any) -> None:
    """With concurrency 1, requests due together are sent one at a time and queue meanwhile."""
    gateway, url = await gateway_factory(token_delay_s=0.01)
    reqs = [_req(i, 20 + i, 3) for i in range(3)]
    records = await run_load(reqs, PromptBuilder(), _config(url, concurrency=1))

    assert all(r.completed for r in records)
    assert gateway.max_in_flight == 1
    sends = sorted(r.send_s or 0.0 for r in records)
    ends = sorted(r.end_s or 0.0 for r in records)
    assert sends[1] >= ends[0] and sends[2] >= ends[1]
    assert max(r.queue_delay_s or 0.0 for r in records) >= 0.02
    # TTFT is measured from the send, so it excludes the wait for a slot
    assert all((r.ttft_s or 1.0) < 0.5 for r in records)


async def test_arrivals_follow_the_trace_divided_by_speed(fake_gateway: Any) -> None:
    """A request due at 2 s in the trace is sent no earlier than 0.2 s at speed 10."""
    _, url = fake_gateway
    reqs = [_req(0, 20, 1, arrival=0.0), _req(1, 21, 1, arrival=2.0)]
    records = await run_load(reqs, PromptBuilder(), _config(url, speed=10.0))
    assert records[1].scheduled_s == pytest.approx(0.2)
    assert (records[1].send_s or 0.0) >= 0.2 - 1e-3


async def test_request_past_its_timeout_is_an_error(gateway_factory: Any) -> None:
    """A stream that does not finish within timeout_s is recorded as a timeout."""
    _, url = await gateway_factory(faults={50: "slow"})
    records = await run_load([_req(0, 50, 2)], PromptBuilder(), _config(url, timeout_s=0.3))
    assert records[0].error_kind == "timeout" and not records[0].completed
    assert 0.25 <= (records[0].end_s or 0.0) - (records[0].send_s or 0.0) < 5


async def test_stop_cancels_in_flight_and_stops_scheduling(gateway_factory: Any) -> None:
    """Setting stop cancels the running request and never sends later ones."""
    gateway, url = await gateway_factory(faults={50: "slow"})
    stop = asyncio.Event()
    reqs = [_req(0, 50, 2, arrival=0.0), _req(1, 60, 2, arrival=30.0)]
    run = asyncio.create_task(run_load(reqs, PromptBuilder(), _config(url), stop=stop))
    await asyncio.wait_for(gateway.received.wait(), 5)
    stop.set()
    records = await asyncio.wait_for(run, 5)
    assert [r.index for r in records] == [0]
    assert records[0].error_kind == "cancelled"
    assert len(gateway.bodies) == 1


async def test_model_id_comes_from_v1_models(fake_gateway: Any) -> None:
    """fetch_model_id returns data[0].id."""
    _, url = fake_gateway
    assert await fetch_model_id(url) == "fake-model"


async def test_unreachable_gateway_raises_gateway_error() -> None:
    """A refused connection is a GatewayError naming the endpoint."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(GatewayError, match="/v1/models"):
        await fetch_model_id(f"http://127.0.0.1:{port}", timeout_s=2)

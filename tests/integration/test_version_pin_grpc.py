"""A version pinned through gRPC metadata (`x-homing-version`): the call is served by a worker
of that version even at split weight 0, and says so in its initial metadata; an unknown
version ends the call with INVALID_ARGUMENT and the OpenAI error body, after the model's own
errors.

One `homing sim` process runs two workers: "v1" (weight 100) and "v2" (weight 0).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio
from helpers import eventually, own_app

from homing.app import App
from homing.config import GatewaySettings, HomingConfig, ModelSettings, WorkerEntry
from homing.sim.process import spawn_sim, terminate
from homing.v1 import inference_pb2 as pb
from homing.v1 import inference_pb2_grpc as pb_grpc

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "llama-3.1-8b"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app() -> AsyncIterator[App]:
    """A gateway over two simulated workers of one model, v1 (all of the split) and v2 (none
    of it), both routable."""
    args = ["--workers", "2", "--port", "0", "--speedup", "10", "--parent-pid", str(os.getpid())]
    process, ready = await spawn_sim(args)
    urls = [str(w["url"]) for w in ready["workers"]]
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        models=[
            ModelSettings(
                name=MODEL,
                workers=[
                    WorkerEntry(url=urls[0], version="v1"),
                    WorkerEntry(url=urls[1], version="v2"),
                ],
                versions={"v1": 100},
            )
        ],
    )
    try:
        async with own_app(config) as running:
            assert running.pool is not None
            pool = running.pool
            assert await eventually(lambda: len(pool.routable_workers()) == 2, 15.0)
            yield running
    finally:
        await terminate([process], 5.0)


def _worker_of(app: App, version: str) -> str:
    return next(w.worker_id for _, w in app.fleet.workers() if w.version == version)


def _chat(user: str) -> pb.ChatCompletionRequest:
    return pb.ChatCompletionRequest(
        model=MODEL,
        messages=[pb.ChatMessage(role="user", content=f"hello from {user}")],
        sampling=pb.SamplingOptions(max_tokens=4),
        stream=True,
        user=user,
    )


async def _call(
    app: App, request: pb.ChatCompletionRequest, version: str | None
) -> tuple[list[pb.CompletionChunk], dict[str, Any]]:
    """The chunks and initial metadata of a ChatCompletion call, pinned to `version`."""
    metadata = () if version is None else (("x-homing-version", version),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        call = pb_grpc.InferenceStub(channel).ChatCompletion(request, metadata=metadata)
        chunks = [c async for c in call]
        return chunks, dict(await call.initial_metadata())


async def test_a_version_pinned_in_metadata_is_served_by_it(app: App) -> None:
    """Pinned to v2 (weight 0), every call goes to the v2 worker and its initial metadata and
    chunks name it; unpinned, the split sends the same calls to v1."""
    v1, v2 = _worker_of(app, "v1"), _worker_of(app, "v2")
    for user in ("ann", "bob", "cy"):
        chunks, metadata = await _call(app, _chat(user), "v2")
        assert metadata["x-homing-version"] == "v2"
        assert metadata["x-homing-worker"] == v2
        assert {c.worker for c in chunks} == {v2}
        assert chunks[-1].choices[0].finish_reason == "length"
        chunks, metadata = await _call(app, _chat(user), None)
        assert metadata["x-homing-version"] == "v1"
        assert metadata["x-homing-worker"] == v1
        assert {c.worker for c in chunks} == {v1}


async def test_a_pinned_non_streamed_completion_is_served_by_it(app: App) -> None:
    """The Completion method takes the pin too."""
    v2 = _worker_of(app, "v2")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        call = pb_grpc.InferenceStub(channel).Completion(
            pb.CompletionRequest(
                model=MODEL,
                token_ids=pb.TokenIds(ids=list(range(1000, 1010))),
                sampling=pb.SamplingOptions(max_tokens=3, ignore_eos=True),
            ),
            metadata=(("x-homing-version", "v2"),),
        )
        chunks = [c async for c in call]
        metadata = dict(await call.initial_metadata())
    assert len(chunks) == 1 and chunks[0].worker == v2
    assert metadata["x-homing-version"] == "v2"
    assert chunks[0].usage.completion_tokens == 3


def _refusal(err: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str, Any]:
    trailing = dict(err.trailing_metadata() or ())
    return err.code(), err.details(), json.loads(trailing["x-error-json"])


async def test_an_unknown_version_in_metadata_is_invalid_argument(app: App) -> None:
    """An unknown version ends the call with INVALID_ARGUMENT, HTTP's message as details and
    its body in `x-error-json`; no chunk is sent."""
    message = f"Model '{MODEL}' has no version 'v9' (versions: 'v1', 'v2')."
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _call(app, _chat("ann"), "v9")
    assert _refusal(info.value) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        message,
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "x-homing-version",
                "code": "unknown_version",
            }
        },
    )


async def test_an_unknown_model_is_refused_before_its_version(app: App) -> None:
    """An unknown model with an unknown version is the model's NOT_FOUND, as over HTTP."""
    request = _chat("ann")
    request.model = "gpt-9"
    message = "The model 'gpt-9' does not exist or you do not have access to it."
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _call(app, request, "v9")
    assert _refusal(info.value) == (
        grpc.StatusCode.NOT_FOUND,
        message,
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }
        },
    )

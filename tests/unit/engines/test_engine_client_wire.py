"""The engine client's wire conversions: explicit sampling params, plain responses, errors."""

from __future__ import annotations

import grpc
import pytest
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

from homing.engines.client import (
    EngineError,
    GenerateDone,
    GenerateParams,
    TokenChunk,
    build_generate_request,
    convert_response,
    grpc_target,
)


def test_sampling_params_carry_semantic_defaults() -> None:
    """Defaults go on the wire explicitly (top_p 1, top_k -1, repetition_penalty 1)."""
    req = build_generate_request(
        GenerateParams(request_id="r1", input_ids=[1, 2, 3], max_new_tokens=7)
    )
    sp = req.sampling_params
    assert req.request_id == "r1" and list(req.tokenized.input_ids) == [1, 2, 3]
    assert sp.temperature == 1.0 and sp.top_p == 1.0 and sp.top_k == -1
    assert sp.repetition_penalty == 1.0
    assert sp.HasField("max_new_tokens") and sp.max_new_tokens == 7
    assert sp.skip_special_tokens and req.stream
    assert not sp.HasField("custom_params")


def test_bias_schema_stop_ids_and_greedy_are_sent() -> None:
    """logit_bias goes as SGLang's map of decimal id strings, the schema as the json_schema
    constraint, min_p and repetition_penalty as given; temperature 0 and stop ids are kept."""
    params = GenerateParams(
        request_id="r2",
        input_ids=[5],
        max_new_tokens=3,
        temperature=0.0,
        stop_token_ids=(9, 10),
        ignore_eos=True,
        stream=False,
        min_p=0.25,
        repetition_penalty=1.5,
        logit_bias={7: -100.0, 12: 2.5},
        json_schema='{"type":"object"}',
    )
    req = build_generate_request(params)
    sp = req.sampling_params
    assert sp.temperature == 0.0 and list(sp.stop_token_ids) == [9, 10] and sp.ignore_eos
    assert dict(sp.logit_bias) == {"7": -100.0, "12": 2.5}
    assert sp.WhichOneof("constraint") == "json_schema" and sp.json_schema == '{"type":"object"}'
    assert sp.min_p == 0.25 and sp.repetition_penalty == 1.5
    assert not sp.HasField("custom_params")
    assert not req.stream


def test_no_constraint_and_no_bias_by_default() -> None:
    """Without a schema no constraint is set, and the bias map is empty."""
    sp = build_generate_request(GenerateParams("r3", [1], max_new_tokens=1)).sampling_params
    assert sp.WhichOneof("constraint") is None and not sp.logit_bias
    assert sp.min_p == 0.0


def test_chunk_and_complete_convert_to_plain_data() -> None:
    """Chunk -> TokenChunk; complete -> GenerateDone with its output ids and matched stop."""
    chunk = pb.GenerateResponse(
        request_id="r",
        chunk=pb.GenerateStreamChunk(token_ids=[4, 5], prompt_tokens=10, completion_tokens=2),
    )
    assert convert_response(chunk) == TokenChunk((4, 5), 10, 2, 0)
    complete = pb.GenerateResponse(
        request_id="r",
        complete=pb.GenerateComplete(
            output_ids=[6],
            finish_reason="stop",
            prompt_tokens=10,
            completion_tokens=3,
            cached_tokens=8,
            matched_token_id=6,
        ),
    )
    assert convert_response(complete) == GenerateDone((6,), "stop", 10, 3, 8, 6)
    text_stop = pb.GenerateResponse(
        complete=pb.GenerateComplete(finish_reason="stop", matched_stop_str="END")
    )
    done = convert_response(text_stop)
    assert isinstance(done, GenerateDone) and done.matched_stop == "END"
    length = convert_response(
        pb.GenerateResponse(complete=pb.GenerateComplete(finish_reason="length"))
    )
    assert isinstance(length, GenerateDone) and length.matched_stop is None


@pytest.mark.parametrize(
    ("code", "transport"),
    [
        (grpc.StatusCode.UNAVAILABLE, True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, True),
        (grpc.StatusCode.INTERNAL, True),
        (grpc.StatusCode.INVALID_ARGUMENT, False),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, False),
        (grpc.StatusCode.CANCELLED, False),
    ],
)
def test_error_classification(code: grpc.StatusCode, transport: bool) -> None:
    """Only worker/connection faults are transport errors (they count toward health)."""
    err = EngineError(code, "x", worker_id="w0")
    assert err.transport is transport
    assert code.name in str(err) and "w0" in str(err)


def test_url_parsing() -> None:
    """grpc://host:port becomes a grpc target; anything else is rejected."""
    assert grpc_target("grpc://127.0.0.1:5000") == "127.0.0.1:5000"
    with pytest.raises(ValueError):
        grpc_target("http://127.0.0.1:5000")


def _done(output_ids: tuple[int, ...], completion_tokens: int) -> GenerateDone:
    return GenerateDone(output_ids, "length", 10, completion_tokens, 0, None)


@pytest.mark.parametrize(
    ("output_ids", "completion_tokens", "received", "expected"),
    [
        ((7, 8), 8, 8, ()),  # SGLang 0.5.x: the complete repeats the last chunk's tokens
        ((7, 8), 8, 6, (7, 8)),  # older servicers: the final step only in the complete
        ((1, 2, 3), 3, 0, (1, 2, 3)),  # not streamed: every token in the complete
        ((1, 2, 3), 3, 2, (3,)),  # a tail shorter than output_ids
        ((), 5, 5, ()),  # an empty final step
        ((1, 2), 0, 0, (1, 2)),  # no count from the servicer, nothing streamed
        ((1, 2), 0, 4, ()),  # no count from the servicer, tokens came in chunks
        ((1, 2), 9, 3, (1, 2)),  # a count beyond output_ids takes all of them, no more
    ],
)
def test_complete_adds_only_the_tail_the_chunks_missed(
    output_ids: tuple[int, ...], completion_tokens: int, received: int, expected: tuple[int, ...]
) -> None:
    """`GenerateDone.new_tokens` returns the tail of output_ids that completion_tokens says
    the chunks did not carry."""
    assert _done(output_ids, completion_tokens).new_tokens(received) == expected

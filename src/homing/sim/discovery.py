"""GetModelInfo and GetServerInfo as the simulated worker answers them, built from plain
values: the servicer (`homing.sim.servicer`) and the in-process engine double
(`homing.engines.testing.FakeEngine`) both answer with these, so they answer alike.

Rule of this file: pure message building; it imports protobuf and the protocol's messages
only. What the fields mean, and which SGLang figures they copy, is in the servicer's module
docstring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

REQ_INPUT_MARGIN = 5
"""SGLang 0.5.23's max_req_input_len = max_req_len - 5 (tp_worker.py)."""

SERVICER_DEFAULT_VOCAB_SIZE = 128256
SERVICER_DEFAULT_BOS_TOKEN_ID = 1
SERVICER_DEFAULT_PAD_TOKEN_ID = 0
"""GetModelInfo's vocab_size / bos_token_id / pad_token_id on SGLang: smg-grpc-servicer
0.14.1's defaults (sglang/server.py), since SGLang's scheduler info carries none of them;
eos_token_ids defaults to [] the same way."""

HF_DEFAULT_ID2LABEL_JSON = '{"0": "LABEL_0", "1": "LABEL_1"}'
"""GetModelInfo's id2label_json on SGLang for any model: a HuggingFace config's default labels
(num_labels 2)."""


def max_req_len(context_length: int, kv_capacity_tokens: int) -> int:
    """Tokens one request may span (SGLang's max_req_len): min(context - 1, pool - 1)."""
    return min(context_length - 1, kv_capacity_tokens - 1)


def max_req_input_len(context_length: int, kv_capacity_tokens: int) -> int:
    """Prompts must be shorter than this (SGLang's max_req_input_len): max_req_len - 5."""
    return max_req_len(context_length, kv_capacity_tokens) - REQ_INPUT_MARGIN


def model_info_response(
    *,
    model_path: str,
    served_model_name: str,
    kv_capacity_tokens: int,
    max_req_input_len: int,
    eos_token_ids: Sequence[int] = (),
) -> pb.GetModelInfoResponse:
    """GetModelInfo: `max_context_length` is the KV pool size (`kv_capacity_tokens`), as
    SGLang reports it; the token ids and labels are the servicer's defaults."""
    return pb.GetModelInfoResponse(
        model_path=model_path,
        tokenizer_path=model_path,
        is_generation=True,
        preferred_sampling_params="",
        weight_version="default",
        served_model_name=served_model_name,
        max_context_length=kv_capacity_tokens,
        vocab_size=SERVICER_DEFAULT_VOCAB_SIZE,
        supports_vision=False,
        model_type="llama",
        eos_token_ids=list(eos_token_ids),
        pad_token_id=SERVICER_DEFAULT_PAD_TOKEN_ID,
        bos_token_id=SERVICER_DEFAULT_BOS_TOKEN_ID,
        max_req_input_len=max_req_input_len,
        architectures=["LlamaForCausalLM"],
        id2label_json=HF_DEFAULT_ID2LABEL_JSON,
        num_labels=2,
    )


def server_info_response(
    server_args: Mapping[str, Any],
    *,
    kv_capacity_tokens: int,
    max_running_requests: int,
    max_req_input_len: int,
    sglang_version: str,
    active_requests: int = 0,
    last_receive_timestamp: float = 0.0,
    uptime_seconds: float = 0.0,
    start_time: Timestamp | None = None,
) -> pb.GetServerInfoResponse:
    """GetServerInfo: `server_args` (SGLang's ServerArgs names) as a Struct, the scheduler
    info's limits, and the live figures given (`active_requests`, `last_receive_timestamp`,
    `uptime_seconds` in seconds, `start_time`; unset when None)."""
    args = Struct()
    args.update(dict(server_args))
    scheduler_info = Struct()
    scheduler_info.update(
        {
            "max_total_num_tokens": kv_capacity_tokens,
            "max_running_requests": max_running_requests,
            "max_req_input_len": max_req_input_len,
            "is_generation": True,
        }
    )
    response = pb.GetServerInfoResponse(
        server_args=args,
        scheduler_info=scheduler_info,
        active_requests=active_requests,
        is_paused=False,
        last_receive_timestamp=last_receive_timestamp,
        uptime_seconds=uptime_seconds,
        sglang_version=sglang_version,
        server_type="grpc",
        max_total_num_tokens=kv_capacity_tokens,
    )
    if start_time is not None:
        response.start_time.CopyFrom(start_time)
    return response

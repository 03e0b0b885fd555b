"""Discovery: what a worker serves, and the pool's model facts.

A joining worker is asked for a first HealthCheck, then GetModelInfo, GetServerInfo and
(with `PoolConfig.check_tokenizer`) its GetTokenizer bundle (`fetch_discovery`). It is
accepted only when it serves the pool's model and, where both are known, the tokenizer
bundle with the pool's sha256 (`ModelFacts.admit`; `WorkerRefused` otherwise). The first
worker accepted gives the pool its model facts (`ModelFacts`: GetModelInfo, GetServerInfo,
the tokenizer bundle), kept when it leaves, and the views read from them (context window,
prompt limit, eos ids, KV page size).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import grpc
import structlog
from google.protobuf import struct_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

from homing.engines.client import EngineApi, EngineError
from homing.engines.pool.state import PoolConfig, Worker, WorkerRefused, WorkerState

log = structlog.get_logger(__name__)

#: The window beyond `max_req_input_len` that SGLang serves untrimmed: max_req_len =
#: max_req_input_len + 5 and max_new_tokens <= max_req_len - prompt - 1 (sglang 0.5.23).
SGLANG_WINDOW_OVER_INPUT = 4

#: What a worker's discovery fetched: GetModelInfo, GetServerInfo and its tokenizer bundle
#: (None: not fetched).
Discovered = tuple[pb.GetModelInfoResponse, pb.GetServerInfoResponse, bytes | None]


def served_name(info: pb.GetModelInfoResponse) -> str:
    """The model name a worker serves: `served_model_name`, else `model_path`."""
    return info.served_model_name or info.model_path


def _struct_number(struct: struct_pb2.Struct, key: str) -> float | None:
    """A numeric value from a protobuf Struct (None when absent or not a number)."""
    fields = struct.fields
    if key not in fields:
        return None
    value = fields[key]
    if value.WhichOneof("kind") != "number_value":
        return None
    return float(value.number_value)


async def fetch_discovery(w: Worker, config: PoolConfig) -> Discovered | None:
    """A first HealthCheck, then GetModelInfo, GetServerInfo and (with `check_tokenizer`)
    the tokenizer bundle; None (`last_error` set) when the worker cannot answer. A
    worker without GetTokenizer (UNIMPLEMENTED) is not checked for its tokenizer."""
    timeout = config.discovery_timeout_s
    bundle: bytes | None = None
    # The first check may open the channel too: it gets the longer of the two timeouts.
    first_s = max(config.health_timeout_s, timeout)
    if not await w.client.health_check(timeout_s=first_s):
        w.state.last_error = "health check failed"
        return None  # a worker joins only once it can generate
    try:
        info = await w.client.model_info(timeout_s=timeout)
        server = await w.client.server_info(timeout_s=timeout)
        if config.check_tokenizer:
            try:
                bundle = await w.client.tokenizer_bundle(timeout_s=timeout)
            except EngineError as err:
                if err.code != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                log.warning("tokenizer_unchecked", worker=w.state.worker_id, error=str(err))
    except EngineError as err:
        w.state.last_error = str(err)
        log.warning(
            "worker_discovery_failed", worker=w.state.worker_id, url=w.state.url, error=str(err)
        )
        return None
    return info, server, bundle


class ModelFacts:
    """The pool's model facts, from the first worker accepted (kept when it leaves), and
    the check of every worker that joins against them (`admit`)."""

    def __init__(self) -> None:
        self._model_info: pb.GetModelInfoResponse | None = None
        self._server_info: pb.GetServerInfoResponse | None = None
        self._tokenizer_sha256: str | None = None
        self._tokenizer_bundle: bytes | None = None

    def admit(
        self,
        w: Worker,
        model: str | None,
        discovered: Discovered,
        *,
        router_block_size: int,
    ) -> None:
        """Check a discovered worker against the pool's model (`model`, else the first
        accepted worker's) and tokenizer and record what it serves (`discovered` set); the
        first worker accepted gives the pool its facts, with a warning when its KV page size
        is not the router's `router_block_size`. Raises `WorkerRefused` (with `last_error`
        set and an error logged) when it serves another model or tokenizer."""
        info, server, bundle = discovered
        expected = model
        if expected is None and self._model_info is not None:
            expected = served_name(self._model_info)
        sha = hashlib.sha256(bundle).hexdigest() if bundle is not None else None
        problem = None
        if expected is not None and served_name(info) != expected:
            problem = f"serves model {served_name(info)!r}, the pool serves {expected!r}"
        elif sha is not None and self._tokenizer_sha256 not in (None, sha):
            problem = (
                f"has tokenizer bundle sha256 {sha[:12]}..., the pool's is "
                f"{self._tokenizer_sha256[:12]}... (another tokenizer or revision)"
            )
        if problem is not None:
            w.state.last_error = f"worker {w.state.url} {problem}"
            log.error("worker_refused", worker=w.state.worker_id, url=w.state.url, error=problem)
            raise WorkerRefused(w.state.last_error)
        w.model_info, w.server_info = info, server
        w.state.discovered = True
        w.state.tokenizer_sha256 = sha
        if self._model_info is None:
            self._model_info, self._server_info = info, server
            if sha is not None:
                self._tokenizer_sha256, self._tokenizer_bundle = sha, bundle
            page = _struct_number(server.server_args, "page_size")
            if page is not None and int(page) != router_block_size:
                log.warning(
                    "page_size_mismatch",
                    worker=w.state.worker_id,
                    page_size=int(page),
                    router_block_size=router_block_size,
                )
        elif sha is not None and self._tokenizer_sha256 is None:
            self._tokenizer_sha256, self._tokenizer_bundle = sha, bundle

    @property
    def name(self) -> str | None:
        """The model name the first accepted worker serves (None before any)."""
        return served_name(self._model_info) if self._model_info is not None else None

    @property
    def model_info(self) -> pb.GetModelInfoResponse:
        """GetModelInfo of the first accepted worker (kept after it leaves); RuntimeError
        before any discovery."""
        if self._model_info is None:
            raise RuntimeError("no worker has been discovered yet")
        return self._model_info

    @property
    def server_info(self) -> pb.GetServerInfoResponse:
        """GetServerInfo of the first accepted worker; RuntimeError before any discovery."""
        if self._server_info is None:
            raise RuntimeError("no worker has been discovered yet")
        return self._server_info

    @property
    def max_context_length(self) -> int:
        """Tokens one request may span, prompt + completion, without the engine trimming it.

        SGLang's servicer reports its KV pool size as `max_context_length`; its scheduler
        caps a request at max_req_len = `max_req_input_len` + 5 (sglang tp_worker.py) and
        silently trims `max_new_tokens` to max_req_len - prompt - 1. So the window is
        `max_req_input_len` + 4 where that is the smaller (0 means unreported).
        """
        info = self.model_info
        window = int(info.max_context_length)
        if info.max_req_input_len > 0:
            window = min(window, int(info.max_req_input_len) + SGLANG_WINDOW_OVER_INPUT)
        return window

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt the engine accepts: below `max_req_input_len` (SGLang refuses a
        prompt of that length or more), else one less than the window."""
        limit = int(self.model_info.max_req_input_len)
        return limit - 1 if limit > 0 else self.max_context_length - 1

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The model's end-of-sequence token ids."""
        return tuple(self.model_info.eos_token_ids)

    @property
    def page_size(self) -> int | None:
        """KV page size in tokens from server_args (None when not reported)."""
        value = _struct_number(self.server_info.server_args, "page_size")
        return int(value) if value is not None else None

    async def tokenizer_bundle(
        self, routable: list[WorkerState], client: Callable[[str], EngineApi]
    ) -> bytes:
        """The GetTokenizer zip of the pool's model: the one fetched when the first worker
        joined, else fetched from the first of the `routable` workers (their clients from
        `client(worker_id)`) that serves it.

        Raises EngineError from the last worker tried, or RuntimeError with none routable.
        """
        if self._tokenizer_bundle is not None:
            return self._tokenizer_bundle
        last: EngineError | None = None
        for state in routable:
            try:
                return await client(state.worker_id).tokenizer_bundle()
            except EngineError as err:
                last = err
                log.warning("tokenizer_bundle_failed", worker=state.worker_id, error=str(err))
        if last is not None:
            raise last
        raise RuntimeError("no healthy worker to fetch the tokenizer from")

"""Open-loop load generator: replays trace requests against a gateway over HTTP.

Rule of this file: the I/O shell of the benchmark. Request `i` is due at
`t0 + arrival_s / speed` whatever happened to earlier requests (open loop); at most
`concurrency` requests are in flight, the rest wait for a slot in arrival order, and that wait
is recorded as queueing delay, not TTFT (TTFT starts when the request is sent). Each request is
one `POST /v1/completions` with the prompt as token ids, `max_tokens` = the trace's output
length, `ignore_eos`, `temperature` 0, `stream` with `stream_options.include_usage`; the SSE
stream is read by the sans-I/O `homing.bench.sse`, stamped with this process's monotonic clock.
A non-200 status, a broken stream, an `error` event, a missing usage chunk or a missing
`data: [DONE]`, and a request exceeding `timeout_s` are errors, never successes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
from tqdm import tqdm

from homing.bench.records import RequestRecord
from homing.bench.sse import CompletionStream, SseDecoder, copy_stream_fields
from homing.bench.traces import PromptBuilder, TraceRequest

WORKER_HEADER = "x-homing-worker"
"""Response header naming the replica that served the request (gateway contract, issue 2)."""

REQUEST_ID_HEADER = "x-request-id"


class GatewayError(Exception):
    """The gateway could not be reached or answered something unusable (message says what)."""


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """How to replay: gateway `url` (e.g. http://127.0.0.1:8080), `model` id, time compression
    `speed` (> 0; `inf` sends everything at once), in-flight cap `concurrency` (>= 1),
    per-request `timeout_s` (send to end of stream), optional bearer `api_key`, and whether to
    draw a tqdm `progress` bar on stderr."""

    url: str
    model: str
    speed: float = 1.0
    concurrency: int = 256
    timeout_s: float = 600.0
    api_key: str | None = None
    progress: bool = True


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"accept": "text/event-stream, application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    return headers


def _error_message(body: str) -> str:
    """The OpenAI-shaped `error.message` of a body, else its first 300 characters."""
    try:
        doc = json.loads(body)
    except json.JSONDecodeError:
        return body[:300].strip() or "(empty body)"
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        err = doc["error"]
        code = f" [{err['code']}]" if err.get("code") else ""
        return f"{err.get('message', '')}{code}"
    return body[:300]


async def fetch_model_id(url: str, *, timeout_s: float = 10.0, api_key: str | None = None) -> str:
    """`data[0].id` of `GET {url}/v1/models`; raises GatewayError if unreachable or empty."""
    endpoint = url.rstrip("/") + "/v1/models"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(endpoint, headers=_headers(api_key)) as resp,
        ):
            body = await resp.text(errors="replace")
            if resp.status != 200:
                raise GatewayError(
                    f"GET {endpoint} returned HTTP {resp.status}: {_error_message(body)}"
                )
    except (aiohttp.ClientError, TimeoutError) as e:
        raise GatewayError(f"cannot reach {endpoint}: {type(e).__name__}: {e}") from e
    try:
        models = json.loads(body)["data"]
        return str(models[0]["id"])
    except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
        raise GatewayError(f"GET {endpoint} gave no model id: {body[:200]!r}") from e


def completion_body(model: str, prompt_ids: Sequence[int], max_tokens: int) -> bytes:
    """The JSON body of one benchmark request (gateway contract of issue 2)."""
    return json.dumps(
        {
            "model": model,
            "prompt": list(prompt_ids),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
        },
        separators=(",", ":"),
    ).encode()


class _Run:
    """State of one replay: session, slot semaphore, clock origin, progress bar."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        builder: PromptBuilder,
        config: LoadConfig,
        bar: tqdm,  # type: ignore[type-arg]
    ) -> None:
        self.session = session
        self.builder = builder
        self.config = config
        self.endpoint = config.url.rstrip("/") + "/v1/completions"
        self.headers = {**_headers(config.api_key), "content-type": "application/json"}
        self.slots = asyncio.Semaphore(config.concurrency)
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        self.bar = bar
        self.errors = 0

    def now(self) -> float:
        """Seconds since the run started (event loop's monotonic clock)."""
        return self.loop.time() - self.t0

    async def request(self, req: TraceRequest, rec: RequestRecord) -> None:
        """Wait for a slot, send, read the stream into `rec`; never raises except cancellation."""
        try:
            async with self.slots:
                body = completion_body(
                    self.config.model, self.builder.prompt_ids(req), req.output_tokens
                )
                rec.send_s = self.now()
                try:
                    await self._exchange(body, rec)
                finally:
                    rec.end_s = self.now()
        except asyncio.CancelledError:
            if rec.error is None and not rec.completed:
                _fail(rec, "cancelled", "cancelled before the stream ended")
            raise
        finally:
            if not rec.completed:
                self.errors += 1
            self.bar.update(1)
            self.bar.set_postfix(errors=self.errors, refresh=False)

    async def _exchange(self, body: bytes, rec: RequestRecord) -> None:
        stream = CompletionStream()
        decoder = SseDecoder()
        try:
            async with (
                asyncio.timeout(self.config.timeout_s),
                self.session.post(self.endpoint, data=body, headers=self.headers) as resp,
            ):
                rec.status = resp.status
                rec.worker = resp.headers.get(WORKER_HEADER)
                rec.request_id = resp.headers.get(REQUEST_ID_HEADER)
                if resp.status != 200:
                    text = await resp.text(errors="replace")
                    _fail(rec, f"http_{resp.status}", f"HTTP {resp.status}: {_error_message(text)}")
                    return
                async for chunk in resp.content.iter_any():
                    received = self.now()
                    for data in decoder.feed(chunk):
                        stream.on_event(data, received)
        except TimeoutError:
            _fail(rec, "timeout", f"no complete response within {self.config.timeout_s:g} s")
        except aiohttp.ClientError as e:
            _fail(rec, "transport", f"{type(e).__name__}: {e}")
        except (OSError, ValueError) as e:  # anything else the stack raises is still recorded
            _fail(rec, "client", f"{type(e).__name__}: {e}")
        finally:
            copy_stream_fields(rec, stream)
        if rec.error is None:
            problem = stream.verdict()
            if problem is not None:
                _fail(rec, problem.kind, problem.message)


def _fail(rec: RequestRecord, kind: str, message: str) -> None:
    rec.error_kind = kind
    rec.error = message


async def run_load(
    requests: Sequence[TraceRequest],
    builder: PromptBuilder,
    config: LoadConfig,
    *,
    stop: asyncio.Event | None = None,
) -> list[RequestRecord]:
    """Replay `requests` open-loop; return one record per request that became due.

    Requests are replayed in arrival order (ties keep file order). Setting `stop` stops
    scheduling, cancels in-flight requests (recorded as `cancelled` errors) and returns the
    records of the requests already due. Raises ValueError for a bad `config`.
    """
    if not config.speed > 0:
        raise ValueError(f"speed must be > 0, got {config.speed}")
    if config.concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {config.concurrency}")
    if not config.timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {config.timeout_s}")
    stop = stop if stop is not None else asyncio.Event()
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    records: list[RequestRecord] = []
    tasks: set[asyncio.Task[None]] = set()
    connector = aiohttp.TCPConnector(limit=config.concurrency)
    timeout = aiohttp.ClientTimeout(total=None)
    with tqdm(
        total=len(ordered),
        file=sys.stderr,
        unit="req",
        desc="homing bench",
        disable=not config.progress,
        dynamic_ncols=True,
        mininterval=0.5,
    ) as bar:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            run = _Run(session, builder, config, bar)
            try:
                for req in ordered:
                    due = req.arrival_s / config.speed
                    delay = due - run.now()
                    if delay > 0 and not stop.is_set():
                        try:
                            async with asyncio.timeout(delay):
                                await stop.wait()
                        except TimeoutError:
                            pass
                    if stop.is_set():
                        break
                    rec = RequestRecord(
                        index=req.index,
                        scheduled_s=due,
                        sent_prompt_tokens=req.prompt_tokens,
                        max_tokens=req.output_tokens,
                    )
                    records.append(rec)
                    task = asyncio.create_task(run.request(req, rec))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                await _drain(tasks, stop)
            finally:
                for task in tasks:
                    task.cancel()
                if tasks:
                    await asyncio.gather(*tasks, return_exceptions=True)
    return records


async def _drain(tasks: set[asyncio.Task[None]], stop: asyncio.Event) -> None:
    """Wait for every task, or until `stop` is set (the caller then cancels what is left)."""
    stopper = asyncio.create_task(stop.wait())
    try:
        while tasks and not stop.is_set():
            await asyncio.wait({*tasks, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()

"""What the load generator records per request: plain data, shared by `loadgen` and `report`.

Rule of this file: data only. Times are seconds on the load generator's monotonic clock,
measured from the start of the run (`t = 0` when the first request is due).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class RequestRecord:
    """One replayed request.

    - `scheduled_s`: when the trace says it arrives (`arrival_s / speed`).
    - `send_s`: when the HTTP request was sent, after waiting for a `--concurrency` slot and
      building the prompt; `send_s - scheduled_s` is the queueing delay.
    - `first_token_s` / `last_token_s`: receive times of the first and last chunk with text.
    - `end_s`: when the stream ended or failed.
    - `sent_prompt_tokens` / `max_tokens`: what was sent.
    - `status`: HTTP status (None without a response); `worker`: the `x-homing-worker` header;
      `request_id`: the `x-request-id` header.
    - `prompt_tokens`, `completion_tokens`, `cached_tokens`: the usage chunk's counts.
    - `error_kind` / `error`: None for a completed request, else a short kind (`http_<status>`,
      `timeout`, `transport`, `client`, `no_done`, `no_usage`, `bad_chunk`, `stream_error`,
      `cancelled`) and a message.
    """

    index: int
    scheduled_s: float
    sent_prompt_tokens: int
    max_tokens: int
    send_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    end_s: float | None = None
    status: int | None = None
    worker: str | None = None
    request_id: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    error_kind: str | None = None
    error: str | None = None

    @property
    def completed(self) -> bool:
        """True when the request finished with a complete stream (200, usage, `[DONE]`)."""
        return self.error is None and self.end_s is not None and self.completion_tokens is not None

    @property
    def ttft_s(self) -> float | None:
        """Time to first token (s) from the send, or None without a token."""
        if self.send_s is None or self.first_token_s is None:
            return None
        return self.first_token_s - self.send_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (s): (last - first) / (completion_tokens - 1).

        None unless completed with at least 2 tokens and token times known.
        """
        if (
            not self.completed
            or self.completion_tokens is None
            or self.completion_tokens < 2
            or self.first_token_s is None
            or self.last_token_s is None
        ):
            return None
        return (self.last_token_s - self.first_token_s) / (self.completion_tokens - 1)

    @property
    def queue_delay_s(self) -> float | None:
        """Seconds between the trace arrival and the send (waiting for a concurrency slot)."""
        if self.send_s is None:
            return None
        return max(0.0, self.send_s - self.scheduled_s)

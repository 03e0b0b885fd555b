"""The gateway (`[gateway]`): its HTTP and gRPC listeners and request limits, and the
per-model admission queue (`[admission]`)."""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from homing.config.base import Section

#: The most gateway processes one `homing serve` runs (a bound on what a config may ask).
MAX_PROCESSES = 256


def _processes(value: object) -> object:
    if value == "auto" or (type(value) is int and 1 <= value <= MAX_PROCESSES):
        return value
    raise ValueError(f'must be an integer from 1 to {MAX_PROCESSES} or "auto", got {value!r}')


Processes = Annotated[int | Literal["auto"], BeforeValidator(_processes)]


class GatewaySettings(Section):
    """HTTP and gRPC listeners and request limits."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    grpc_host: str = "127.0.0.1"
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    request_timeout_s: float = Field(default=600.0, gt=0)
    drain_timeout_s: float = Field(default=30.0, ge=0)
    # Input limits (see homing.gateway.http and http_server): all request header bytes
    # together (431 past it), header lines per request (431; default 100 as Envoy's
    # max_headers_count), chat messages per request (400), time to receive a request head
    # after connecting or after the previous response (the connection is closed), time to
    # receive the body once the head is in (408).
    max_header_bytes: int = Field(default=16 * 1024, ge=1024, le=1024 * 1024)
    max_header_count: int = Field(default=100, ge=8, le=10_000)
    max_messages: int = Field(default=2048, ge=1)
    header_timeout_s: float = Field(default=30.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)
    # TLS for both listeners: PEM certificate chain and private key (both or neither).
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # Gateway processes sharing the listeners (`process_count`); "auto": one per CPU this
    # process may use.
    processes: Processes = 1

    def process_count(self) -> int:
        """`processes` as a number: "auto" is the CPUs this process may run on
        (`os.sched_getaffinity`), at most `MAX_PROCESSES`."""
        if self.processes == "auto":
            return max(1, min(MAX_PROCESSES, len(os.sched_getaffinity(0))))
        return self.processes

    @model_validator(mode="after")
    def _tls_pair(self) -> GatewaySettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be set together")
        return self


class AdmissionSettings(Section):
    """The per-model admission queue used when every healthy replica is overloaded.

    A replica running nothing with none of our requests in flight is never overloaded.
    Otherwise it is overloaded at the router's `max_waiting` queue, at KV utilisation >= the
    router's `max_token_usage` while it queues or its admission window is full, when its
    load reaches the engine's `max_running_requests`, or (when set) when its load reaches
    `max_in_flight_per_replica`. `max_queued` waiting requests at most (0 = no queue: 503 at
    once); while other tenants also wait, one tenant may hold `max_queued_per_tenant` (None
    = a quarter, at least 1), but a tenant alone may use the whole queue. A full queue gives
    a higher-priority arrival the place of the newest lowest-priority waiter (which gets the
    503). A request waits at most `queue_timeout_s` seconds, and that wait counts against
    `gateway.request_timeout_s` (the engine gets what is left). Rejections are 503 with
    `Retry-After: retry_after_s` (seconds).
    """

    enabled: bool = True
    # Defaults keep an overloaded but otherwise healthy pool lossless: a request may wait as
    # long as its whole generation may run (`gateway.request_timeout_s`, 600 s).
    max_queued: int = Field(default=1024, ge=0)
    max_queued_per_tenant: int | None = Field(default=None, ge=1)
    queue_timeout_s: float = Field(default=600.0, gt=0)
    max_in_flight_per_replica: int | None = Field(default=None, ge=1)
    retry_after_s: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _per_tenant(self) -> AdmissionSettings:
        cap = self.max_queued_per_tenant
        if cap is not None and self.max_queued > 0 and cap > self.max_queued:
            raise ValueError("max_queued_per_tenant must not exceed max_queued")
        return self

    @property
    def tenant_cap(self) -> int:
        """Waiting requests one tenant may hold."""
        if self.max_queued_per_tenant is not None:
            return self.max_queued_per_tenant
        return max(1, self.max_queued // 4)

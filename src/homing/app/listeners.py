"""Listeners: the sockets one `homing serve` process answers on.

Rule of the file: sockets and servers only; what they serve is built in `assembly`. HTTP
(aiohttp behind `GatewayRunner`'s limits; on a listening socket handed over by systemd's
socket activation when `listen_sockets` has "http", else bound to `gateway.host:port`),
gRPC (`GrpcApi`, which binds its own port: grpcio cannot adopt a listening descriptor),
both with TLS when `gateway.tls_cert_file` is set, and the admin API on its Unix socket
(and TCP port when configured). `_check_addresses` fails fast, before any worker is
started, on an address that cannot be listened on or an admin socket another live gateway
holds. Closing them is the drain's (`shutdown`).
"""

from __future__ import annotations

import socket
from pathlib import Path

from aiohttp import web
from prometheus_client import generate_latest

from homing.admin.server import AdminServer, prepare_socket
from homing.app.parts import AppParts
from homing.fleet import Fleet
from homing.gateway.grpc_api import GrpcApi
from homing.gateway.http import HttpApi
from homing.gateway.http_server import GatewayRunner
from homing.gateway.tls import read_pem_pair, server_ssl_context
from homing.obs.process_metrics import ProcessMetrics


class Listeners(AppParts):
    """The listening steps of an `App`: check the addresses, then serve on them."""

    def _check_addresses(self) -> None:
        """Raise OSError naming an address that cannot be listened on (or the admin socket
        another live gateway serves on) before anything is started."""
        cfg = self.config
        gw = cfg.gateway
        # A follower's gRPC port is the leader's, held by it (SO_REUSEPORT).
        listeners = [] if self.follow is not None else [(gw.grpc_host, gw.grpc_port)]
        if "http" not in self.listen_sockets:
            listeners.insert(0, (gw.host, gw.port))
        for host, port in listeners:
            _ensure_bindable(host, port)  # fail fast, before any worker is started
        admin_socket = self._admin_settings().socket_path()
        if admin_socket is not None:
            prepare_socket(admin_socket)  # another live gateway on it: fail fast too
        if cfg.admin.enabled and cfg.admin.port is not None:
            _ensure_bindable(cfg.admin.host, cfg.admin.port)

    def _http_host(self) -> str:
        """The HTTP listener's host: the handed-over socket's, else the configured one."""
        inherited = self.listen_sockets.get("http")
        if inherited is not None and inherited.family in (socket.AF_INET, socket.AF_INET6):
            return str(inherited.getsockname()[0])
        return self.config.gateway.host

    async def _start_listeners(self) -> None:
        """HTTP and gRPC, serving the inference service (`Assembly._start_service`)."""
        assert self.service is not None and self.keyring is not None
        gw = self.config.gateway
        keyring = self.keyring
        self.http = HttpApi(
            self.service,
            max_body_bytes=gw.max_body_bytes,
            keyring=keyring,
            max_header_bytes=gw.max_header_bytes,
            max_header_count=gw.max_header_count,
            header_timeout_s=gw.header_timeout_s,
            body_timeout_s=gw.body_timeout_s,
        )
        self.http.metrics_registry = self.gateway_metrics.registry
        if self.shared_in_flight is not None:  # several processes: one /metrics for all
            board, index = self.shared_in_flight
            registry = self.gateway_metrics.registry
            self.process_metrics = ProcessMetrics(
                Path(board.path).parent, index, board.processes, lambda: generate_latest(registry)
            )
            await self.process_metrics.start()
            self.http.process_metrics = self.process_metrics
        ssl_context = None
        tls = None
        if gw.tls_cert_file is not None and gw.tls_key_file is not None:
            ssl_context = server_ssl_context(gw.tls_cert_file, gw.tls_key_file)
            tls = read_pem_pair(gw.tls_cert_file, gw.tls_key_file)
        # JSON errors and our limits on aiohttp's HTTP parser (homing.gateway.http_server).
        self._runner = GatewayRunner(
            self.http.app,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=1.0,
            **self.http.runner_kwargs(),
        )
        await self._runner.setup()
        inherited = self.listen_sockets.get("http")
        site: web.BaseSite
        if inherited is not None:
            site = web.SockSite(self._runner, inherited, ssl_context=ssl_context)
        else:
            site = web.TCPSite(self._runner, gw.host, gw.port, ssl_context=ssl_context)
        await site.start()
        self.http_port = _bound_port(self._runner)
        self.grpc = GrpcApi(
            self.service,
            host=gw.grpc_host,
            port=gw.grpc_port,
            max_message_bytes=gw.max_body_bytes,
            keyring=keyring,
            max_metadata_bytes=gw.max_header_bytes,
            idle_timeout_s=gw.header_timeout_s,
            tls=tls,
            reuse_port=self.shares_listeners,
        )
        self.grpc_port = self.grpc.port
        await self.grpc.start()

    async def _start_admin(self, fleet: Fleet) -> None:
        """The admin API on its socket (and TCP port when configured)."""
        service = self.service
        self.admin = AdminServer(
            fleet,
            self._admin_settings(),
            tenants=self.config.tenants,
            quotas=self.quotas,
            in_flight=lambda: service.in_flight_all if service is not None else 0,
            started_at=self._started_at,
            clock=self.clock,
            scaler=lambda: self.scaler,  # it starts after the admin API
            rollouts=self.rollouts,
            split_changes_refused=(
                "rollouts and version splits change one process's routing only: run them "
                "with gateway.processes = 1 (the other processes do not follow them yet)"
                if self.shares_listeners
                else None
            ),
        )
        await self.admin.start()


def _ensure_bindable(host: str, port: int) -> None:
    """Raise OSError naming the address when `host:port` cannot be listened on."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise OSError(err.errno, f"cannot listen on {host}:{port}: {err.strerror}") from None


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise RuntimeError("HTTP listener has no bound address")

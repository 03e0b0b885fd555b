"""The autoscaler's leader election on Kubernetes: `KubernetesElector`, a pool's lease as a
coordination.k8s.io/v1 Lease (the rules: `homing.scaler.leader`'s docstring). Its own module
so that kubernetes_asyncio, slow to import, loads only when a config asks for it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import re
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from homing.clock import Clock
from homing.scaler.kube_credentials import load_configuration
from homing.scaler.leader import MIN_WAIT_S, RAN_OUT, Observed, _Campaign, log


def _micro_time(moment: datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339 with exactly six fraction digits, UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _Conflict(Exception):
    """409: the Lease changed since it was read, or was created meanwhile."""


class KubernetesElector(_Campaign):
    """A pool's lease as the coordination.k8s.io/v1 Lease `name` in `namespace`
    (`homing.scaler.leader`'s docstring).

    Created if absent with holderIdentity = `identity`, leaseDurationSeconds =
    ceil(`lease_s`) (at least 1), acquireTime, renewTime and leaseTransitions = 1; taken
    over, when its holder is empty (released) or its lease ran out by this instance's
    clock, by a replace with the read resourceVersion and leaseTransitions + 1 (a 409 means
    another instance won); renewed by a replace with resourceVersion. The fencing token is
    leaseTransitions after our acquisition. `kubeconfig`: a kubeconfig file; None loads the
    in-cluster service account when KUBERNETES_SERVICE_HOST is set, else the default
    kubeconfig. `request_timeout_s` (real seconds) bounds each API call. RBAC: get, create
    and update on leases (coordination.k8s.io) in `namespace`. A deleted Lease starts its
    tokens at 1 again.
    """

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        identity: str,
        clock: Clock,
        lease_s: float = 15.0,
        renew_s: float | None = None,
        kubeconfig: str | None = None,
        request_timeout_s: float = 10.0,
    ) -> None:
        super().__init__(
            name=name, identity=identity, clock=clock, lease_s=lease_s, renew_s=renew_s
        )
        self.kind = "kubernetes"
        self.namespace = namespace
        self.duration_s = max(1, math.ceil(lease_s))
        self._kubeconfig = kubeconfig
        self._request_timeout_s = request_timeout_s
        self._api: k8s.ApiClient | None = None
        self._open_lock = asyncio.Lock()
        self._version: str | None = None  # resourceVersion of our last write (when leading)
        self._acquired: str | None = None  # acquireTime of our leadership
        self._observed: Observed | None = None

    def _describe(self, error: BaseException) -> str:
        """ "HTTP 409 Conflict" for an API error, else "Type: message"."""
        if isinstance(error, ApiException):
            return f"HTTP {error.status} {error.reason}"
        return super()._describe(error)

    # -- the API ---------------------------------------------------------------------------

    async def _coordination(self) -> k8s.CoordinationV1Api:
        async with self._open_lock:
            if self._api is None:
                configuration = await load_configuration(self._kubeconfig)
                self._api = k8s.ApiClient(configuration=configuration)
        return k8s.CoordinationV1Api(self._api)

    async def _read(self) -> Any | None:
        """The Lease (a `V1Lease`), or None when there is none."""
        api = await self._coordination()
        try:
            return await api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._request_timeout_s
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def _body(self, holder: str | None, transitions: int, version: str | None) -> dict[str, Any]:
        now = _micro_time(datetime.now(UTC))
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if version is not None:
            metadata["resourceVersion"] = version
        spec: dict[str, Any] = {
            "holderIdentity": holder,
            "leaseDurationSeconds": self.duration_s,
            "leaseTransitions": transitions,
            "renewTime": now,
            "acquireTime": self._acquired or now,
        }
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }

    async def _write(self, body: dict[str, Any], *, create: bool) -> str:
        """Create or replace the Lease; its new resourceVersion. _Conflict on 409."""
        api = await self._coordination()
        try:
            if create:
                lease = await api.create_namespaced_lease(
                    self.namespace, body, _request_timeout=self._request_timeout_s
                )
            else:
                lease = await api.replace_namespaced_lease(
                    self.name, self.namespace, body, _request_timeout=self._request_timeout_s
                )
        except ApiException as error:
            if error.status == 409:
                raise _Conflict() from error
            raise
        return str(lease.metadata.resource_version)

    # -- the rounds ------------------------------------------------------------------------

    async def _round(self) -> float:
        now = self._clock.now()
        token = self._tenure.token
        if token is not None:
            if not self._tenure.held(now):
                self._lose(RAN_OUT)
            elif self._version is not None:
                try:
                    async with self._clock.timeout(self._tenure.left_s(now)):
                        body = self._body(self.identity, token, self._version)
                        self._version = await self._write(body, create=False)
                except _Conflict:
                    self._version = None  # changed since our write: read it below
                else:
                    self._tenure.renewed(now)
                    return min(self.renew_s, self._tenure.left_s(self._clock.now()))
        sent = self._clock.now()
        lease = await self._read()
        if lease is None:
            self._lose("the Lease is gone")
            return await self._take(1, None, sent, create=True)
        spec = lease.spec
        version = str(lease.metadata.resource_version)
        holder = spec.holder_identity or None
        transitions = int(spec.lease_transitions or 0)
        self.holder = holder
        token = self._tenure.token
        if token is not None:
            if holder == self.identity and transitions == token:
                self._version = version  # still ours (someone else touched the object)
                return 0.0
            self._lose(f"the Lease is held by {holder!r} now (leaseTransitions {transitions})")
        duration = float(spec.lease_duration_seconds or self.duration_s)
        self._observed = Observed.update(self._observed, version, duration, sent)
        if holder is None or holder == self.identity or self._observed.expired(sent):
            return await self._take(transitions + 1, version, sent, create=False)
        return min(self.renew_s, max(MIN_WAIT_S, self._observed.left_s(self._clock.now())))

    async def _take(self, token: int, version: str | None, sent: float, *, create: bool) -> float:
        """Acquire with `token` by a create, or a replace from `version`; follower on 409."""
        self._acquired = _micro_time(datetime.now(UTC))
        try:
            self._version = await self._write(
                self._body(self.identity, token, version), create=create
            )
        except _Conflict:
            log.info("scaler_leader_conflict", **self._fields(token=token))
            self._acquired = None
            lease = await self._read()  # who won: follow it from now
            if lease is None:
                return MIN_WAIT_S
            now = self._clock.now()
            self.holder = lease.spec.holder_identity or None
            duration = float(lease.spec.lease_duration_seconds or self.duration_s)
            version = str(lease.metadata.resource_version)
            self._observed = Observed.update(self._observed, version, duration, now)
            return min(self.renew_s, max(MIN_WAIT_S, self._observed.left_s(now)))
        self._observed = None
        self._win(token, sent)
        return self.renew_s

    async def _release(self, token: int) -> None:
        """Clear holderIdentity (leaseTransitions kept) if the Lease is still ours."""
        lease = await self._read()
        if lease is None:
            return
        spec = lease.spec
        if spec.holder_identity != self.identity or int(spec.lease_transitions or 0) != token:
            return
        await self._write(
            self._body(None, token, str(lease.metadata.resource_version)), create=False
        )

    async def _close(self) -> None:
        api, self._api = self._api, None
        self._version = None
        self._observed = None
        if api is not None:
            with contextlib.suppress(Exception):
                await api.close()

    async def still_leader(self, token: int) -> bool:
        """Whether the Lease names this identity with leaseTransitions == `token` now
        (False when the API server cannot be asked)."""
        try:
            lease = await self._read()
        except Exception as error:  # the API server cannot be asked: not confirmed
            log.warning("scaler_leader_store_failed", **self._fields(error=error))
            return False
        finally:
            if not self._running:
                await self._close()
        if lease is None:
            return False
        spec = lease.spec
        return spec.holder_identity == self.identity and int(spec.lease_transitions or 0) == token


def lease_name(model: str) -> str:
    """The Kubernetes Lease name of `model`'s scaler: `homing-scaler-` and the model name in
    lowercase, each run of other characters than [a-z0-9] a `-` (a DNS-1123 subdomain), cut
    to 253 characters, with an 8-hex-digit digest of the name so two models never share one."""
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") or "model"
    digest = hashlib.sha256(model.encode()).hexdigest()[:8]
    return f"homing-scaler-{slug}"[: 253 - 9].rstrip("-") + f"-{digest}"

"""The `kubernetes` actuator: replicas are the Pods of a Deployment or StatefulSet.

Rule of this file: the only code that talks to a Kubernetes API server (`kubernetes_asyncio`).
Discovery is a list-then-watch of the Pods matching `selector` in `namespace`, resumed from
the last resourceVersion when a watch ends and re-listed at once on `410 Gone`, or after a
backoff (0.5 s doubling to 30 s, on the injected clock) on any other failure; a re-list
replaces what the watch had seen. A member per Pod: member_id = the Pod's name, url =
`grpc://{podIP}:{the container port named port_name}` (or the port number given), READY once
its Ready condition is True and it has a podIP and that port, STOPPING once it has a
deletionTimestamp or `stop` was asked for it, STARTING otherwise; a deleted Pod leaves, and a
Pod in phase Failed or Succeeded leaves as a failed start (`scaler_start_failed`) unless it
was ever Ready. asked_at is the clock time of the scale-up this actuator made when the Pod
was created after one (the oldest such ask still unmatched), else the Pod's
creationTimestamp on this clock; a cold start (asked_at -> the first time it is seen Ready)
is measured for Pods seen not Ready first or matched to an ask.

Every replica asked for is a member from the ask on: until a Pod is matched to it, an ask
is a STARTING placeholder (member_id `ask-<n>`, url None, asked_at the ask's time), which
the matched Pod replaces; so a scale-up a ResourceQuota or a slow controller holds back is
counted as asked for and not asked again. A placeholder still unmatched `startup_timeout_s`
after its ask is a failed start (`scaler_start_failed`, `failed_starts`) and replicas are
patched down by one for it; `stop("ask-<n>")` cancels the ask the same way (no Pod to wait
for). Startup timeouts of Pods are left to Kubernetes (startup/readiness probes): a Pod that
never gets Ready stays STARTING.

`start(count)` reads the scale subresource and patches `spec.replicas` to current + count
(with the read resourceVersion as a precondition; retried on 409 Conflict). `stop(pod)` of a
Deployment annotates the Pod `controller.kubernetes.io/pod-deletion-cost: "-2147483647"`,
patches replicas to current - 1, deletes the Pod itself (its own grace period; 404 counts as
done) and returns once the Pod is gone from the watch. The delete is what picks the victim:
the ReplicaSet controller ranks unscheduled < pending < not ready < ready before it reads
the deletion cost (Kubernetes 1.21+, beta from 1.22), so with any Pod starting it would
remove that one; it acts two hops after the scale (Deployment controller, then ReplicaSet),
by when the victim's delete has normally landed and nothing is left to choose, and the
annotation covers a controller that gets there first while all Pods are Ready. A
StatefulSet always removes its highest ordinal, so there only `{name}-{replicas-1}` can be
stopped (neither annotated nor deleted). Every API failure is an `ActuatorError` naming the
call, the HTTP status and the server's message (on 403, the RBAC permission it needs).

RBAC in `namespace`: get and patch `deployments/scale` (or `statefulsets/scale`); list and
watch `pods`; patch and delete `pods` (a Deployment's `stop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus
from typing import Any, Literal

import aiohttp
import structlog
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from homing.clock import Clock, TimerHandle
from homing.scaler.actuators.base import (
    ActuatorError,
    ColdStarts,
    Listeners,
    Member,
    MemberState,
)
from homing.scaler.kube_credentials import CredentialsError, load_configuration

log = structlog.get_logger("homing.scaler")

#: The annotation the ReplicaSet controller reads to pick which Pods to delete on a scale-down
#: (lowest first), and its lowest value (Kubernetes API, `controller.kubernetes.io`).
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
LOWEST_DELETION_COST = "-2147483647"
#: Watch backoff after a failure: first wait and cap, in clock seconds.
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
#: Conflicting writers of `spec.replicas` tolerated before `start`/`stop` give up.
CONFLICT_RETRIES = 5


class _Gone(Exception):
    """The watch's resourceVersion was compacted away (410): re-list."""


@dataclass
class _Pod:
    name: str
    url: str | None
    ready: bool
    deleting: bool
    asked_at: float
    measure: bool  # whether its first Ready is a cold start
    ready_at: float | None = None


@dataclass
class _Ask:
    """One replica asked for that no Pod has been matched to yet."""

    seq: int
    asked_at: float  # clock seconds
    wall: float  # time.time() of the ask, to compare with creationTimestamps
    timer: TimerHandle | None = None  # its startup timeout

    @property
    def member_id(self) -> str:
        return f"ask-{self.seq}"


def _parse_time(stamp: str | None) -> float | None:
    """Wall-clock seconds of an RFC 3339 timestamp ("2024-01-01T00:00:00Z"); None if absent."""
    if not stamp:
        return None
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class KubernetesActuator:
    """Replicas of one model as the Pods of `kind/name` in `namespace` (module docstring).

    `selector`: a label selector matching exactly that workload's Pods ("app=llama").
    `port_name`: the name of the container port the engine serves gRPC on, or its number.
    `kubeconfig`: a kubeconfig file; None loads the in-cluster service account when
    KUBERNETES_SERVICE_HOST is set, else the default kubeconfig (~/.kube/config, $KUBECONFIG).
    `stop_timeout_s` (clock seconds) bounds `stop`; `startup_timeout_s` (clock seconds) how
    long an ask may wait for its Pod; `request_timeout_s` (real seconds) each API call;
    `watch_timeout_s` is the server-side length of one watch before it is resumed. Call
    `open()` (or any of `start`/`stop`) inside the event loop before `members()` says
    anything; `close()` stops watching and forgets unmatched asks. Raises `ActuatorError` as
    the module docstring says.
    """

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        selector: str,
        clock: Clock,
        kind: Literal["Deployment", "StatefulSet"] = "Deployment",
        port_name: str | int = "grpc",
        kubeconfig: str | None = None,
        stop_timeout_s: float = 300.0,
        startup_timeout_s: float = 600.0,
        request_timeout_s: float = 30.0,
        watch_timeout_s: int = 240,
    ) -> None:
        if kind not in ("Deployment", "StatefulSet"):
            raise ValueError(f"kind must be Deployment or StatefulSet, not {kind!r}")
        self.kind = "kubernetes"
        self.workload = kind
        self.namespace = namespace
        self.name = name
        self.selector = selector
        self.port_name = port_name
        self.failed_starts = 0
        self.relists = 0  # lists made (the first one included)
        self._clock = clock
        self._kubeconfig = kubeconfig
        self._stop_timeout_s = stop_timeout_s
        self._startup_timeout_s = startup_timeout_s
        self._request_timeout_s = request_timeout_s
        self._watch_timeout_s = watch_timeout_s
        self._pods: dict[str, _Pod] = {}
        self._stopping: set[str] = set()
        self._failed: set[str] = set()  # Pods already counted as failed starts
        self._asks: dict[str, _Ask] = {}  # by member_id, oldest first
        self._ask_seq = itertools.count(1)
        self._background: set[asyncio.Task[None]] = set()  # replicas given back for asks
        self._gone: dict[str, asyncio.Event] = {}
        self._cold = ColdStarts()
        self._listeners = Listeners()
        self._scale_lock = asyncio.Lock()
        self._open_lock = asyncio.Lock()
        self._api: k8s.ApiClient | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._last: tuple[Member, ...] = ()

    # -- the Actuator protocol -------------------------------------------------------------

    def members(self) -> list[Member]:
        """One member per Pod seen now, by Pod name, then one per unmatched ask, oldest
        first."""
        return list(self._last)

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` whenever `members()` changes; returns the unsubscribe."""
        return self._listeners.subscribe(listener)

    def cold_start_s(self) -> float | None:
        """Median of the last (up to 8) cold starts in clock seconds; None before one."""
        return self._cold.median()

    async def start(self, count: int) -> None:
        """Patch `spec.replicas` to current + `count` (count >= 1); returns once patched."""
        if count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        await self.open()
        async with self._scale_lock:
            # Asked before the patch: the controller may create a Pod before the reply comes.
            now, wall = self._clock.now(), time.time()
            asks = [_Ask(next(self._ask_seq), now, wall) for _ in range(count)]
            for ask in asks:
                self._asks[ask.member_id] = ask
                self._arm(ask)
            try:
                await self._scale(count, lambda _: None)
            except BaseException:
                for ask in asks:
                    self._forget(ask)
                self._publish()
                raise
            self._publish()

    async def stop(self, member_id: str) -> None:
        """Make `member_id`'s Pod the one removed, scale down by one and wait (at most
        `stop_timeout_s`) until the Pod is gone; for an `ask-<n>` placeholder, cancel that ask
        (replicas - 1) and return once patched. ActuatorError when it is not a member, is not
        the StatefulSet's highest ordinal, or is still there at the timeout."""
        await self.open()
        ask = self._asks.get(member_id)
        if ask is not None:
            await self._cancel(ask)
            return
        if member_id not in self._pods:
            raise ActuatorError(
                f"{member_id} is not a Pod of {self.workload}/{self.name} in namespace "
                f"{self.namespace} (selector {self.selector!r})"
            )
        gone = self._gone.setdefault(member_id, asyncio.Event())
        async with self._scale_lock:
            if self.workload == "StatefulSet":
                await self._scale(-1, lambda replicas: self._check_ordinal(member_id, replicas))
            else:
                body = {"metadata": {"annotations": {DELETION_COST: LOWEST_DELETION_COST}}}
                await self._call(
                    f"annotate Pod {member_id}",
                    "patch pods",
                    self._core().patch_namespaced_pod(
                        member_id, self.namespace, body, _request_timeout=self._request_timeout_s
                    ),
                )
                await self._scale(-1, lambda _: None)
                await self._delete(member_id)
            self._stopping.add(member_id)
            self._publish()
        try:
            async with self._clock.timeout(self._stop_timeout_s):
                await gone.wait()
        except TimeoutError:
            raise ActuatorError(
                f"Pod {member_id} was still there {self._stop_timeout_s} s after {self.workload}"
                f"/{self.name} was scaled down for it (a controller that ignores "
                f"{DELETION_COST}, before Kubernetes 1.21, may have removed another Pod)"
            ) from None
        finally:
            self._stopping.discard(member_id)
            if self._gone.get(member_id) is gone:
                del self._gone[member_id]
            self._publish()

    async def close(self) -> None:
        """Stop watching, forget unmatched asks (replicas given back for expired ones are
        patched first) and close the API client (the Pods stay as they are)."""
        task, self._watch_task = self._watch_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for ask in list(self._asks.values()):
            self._forget(ask)
        await asyncio.gather(*self._background, return_exceptions=True)
        api, self._api = self._api, None
        if api is not None:
            await api.close()

    # -- connection and discovery ----------------------------------------------------------

    async def open(self) -> None:
        """Load the credentials, check the workload's scale subresource can be read, list the
        Pods and start watching them; idempotent. ActuatorError when any of it fails."""
        async with self._open_lock:
            if self._api is not None:
                return
            try:
                configuration = await load_configuration(self._kubeconfig)
            except CredentialsError as error:
                raise ActuatorError(str(error)) from error
            api = k8s.ApiClient(configuration=configuration)
            self._api = api
            try:
                await self._read_scale()
                rv = await self._relist()
            except BaseException:
                self._api = None
                await api.close()
                raise
            self._watch_task = asyncio.get_running_loop().create_task(self._discover(rv))

    async def _discover(self, first_rv: str) -> None:
        rv: str | None = first_rv
        backoff = BACKOFF_FIRST_S
        while True:
            try:
                if rv is None:
                    rv = await self._relist()
                rv = await self._watch(rv)
                backoff = BACKOFF_FIRST_S
            except _Gone:
                log.info("kubernetes_watch_gone", namespace=self.namespace, selector=self.selector)
                rv = None
            except asyncio.CancelledError:
                raise
            except Exception as error:  # any other failure: wait, then re-list
                log.warning(
                    "kubernetes_watch_failed",
                    namespace=self.namespace,
                    selector=self.selector,
                    error=str(error),
                    retry_in_s=backoff,
                )
                rv = None
                await self._clock.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _relist(self) -> str:
        """List the Pods, make them all that is known; returns the list's resourceVersion."""
        self.relists += 1
        what = f"list Pods ({self.selector})"
        response = await self._call(
            what,
            "list pods",
            self._core().list_namespaced_pod(
                self.namespace,
                label_selector=self.selector,
                _preload_content=False,
                _request_timeout=self._request_timeout_s,
            ),
        )
        try:
            body = await response.read()
        finally:
            response.release()
        if response.status != 200:
            raise self._error(what, "list pods", response.status, _message(body))
        listing = json.loads(body)
        items = listing.get("items") or []
        seen = {item["metadata"]["name"] for item in items}
        for name in list(self._pods):
            if name not in seen:
                self._remove(name)
        for item in items:
            self._observe(item)
        self._publish()
        return str(listing["metadata"]["resourceVersion"])

    async def _watch(self, rv: str) -> str:
        """One watch from `rv` until the server ends it; returns the last resourceVersion.
        Raises _Gone on 410, ActuatorError on another error status or event."""
        what = f"watch Pods ({self.selector})"
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._request_timeout_s, sock_read=self._watch_timeout_s + 30
        )
        response = await self._call(
            what,
            "watch pods",
            self._core().list_namespaced_pod(
                self.namespace,
                label_selector=self.selector,
                watch=True,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout_s,
                _preload_content=False,
                _request_timeout=timeout,
            ),
        )
        try:
            if response.status == 410:
                raise _Gone()
            if response.status != 200:
                raise self._error(
                    what, "watch pods", response.status, _message(await response.read())
                )
            while line := await response.content.readline():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise self._error(
                        what, "watch pods", int(obj.get("code") or 0), obj.get("message", "")
                    )
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if kind == "DELETED":
                    self._remove(obj["metadata"]["name"])
                elif kind in ("ADDED", "MODIFIED"):
                    self._observe(obj)
                self._publish()
            return rv
        finally:
            response.close()

    def _observe(self, raw: dict[str, Any]) -> None:
        meta = raw.get("metadata") or {}
        name = str(meta["name"])
        status = raw.get("status") or {}
        known = self._pods.get(name)
        if status.get("phase") in ("Failed", "Succeeded"):
            if known is not None:
                self._remove(name)
            if (known is None or known.ready_at is None) and name not in self._failed:
                self._failed.add(name)
                self.failed_starts += 1
                log.warning(
                    "scaler_start_failed",
                    actuator="kubernetes",
                    member=name,
                    reason=f"Pod phase {status.get('phase')}: "
                    f"{status.get('reason') or status.get('message') or 'no reason given'}",
                )
            return
        now = self._clock.now()
        if known is None:
            created = _parse_time(meta.get("creationTimestamp"))
            ask = next(iter(self._asks.values()), None)
            # creationTimestamp has whole seconds: a Pod created within the second of an ask
            # may belong to it.
            if ask is not None and created is not None and created < int(ask.wall):
                ask = None
            if ask is not None:
                self._forget(ask)
                asked_at = ask.asked_at
            elif created is not None:
                asked_at = now - max(0.0, time.time() - created)
            else:
                asked_at = now
            known = _Pod(name, None, False, False, asked_at, measure=ask is not None)
            self._pods[name] = known
            first = True
        else:
            first = False
        known.deleting = meta.get("deletionTimestamp") is not None
        ip = status.get("podIP")
        port = self._port(raw)
        known.url = f"grpc://{ip}:{port}" if ip and port else None
        conditions = status.get("conditions") or []
        known.ready = known.url is not None and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
        )
        if not known.ready:
            if first:
                known.measure = True
            return
        if known.ready_at is None:
            known.ready_at = now
            if known.measure:
                self._cold.add(now - known.asked_at)

    def _port(self, raw: dict[str, Any]) -> int | None:
        if isinstance(self.port_name, int):
            return self.port_name
        for container in (raw.get("spec") or {}).get("containers") or []:
            for port in container.get("ports") or []:
                if port.get("name") == self.port_name and port.get("containerPort"):
                    return int(port["containerPort"])
        return None

    def _remove(self, name: str) -> None:
        self._pods.pop(name, None)
        self._failed.discard(name)
        gone = self._gone.get(name)
        if gone is not None:
            gone.set()

    def _publish(self) -> None:
        """Recompute the members; notify the listeners when they changed."""
        pods = tuple(
            Member(
                member_id=pod.name,
                url=pod.url,
                state=(
                    MemberState.STOPPING
                    if pod.deleting or pod.name in self._stopping
                    else MemberState.READY
                    if pod.ready
                    else MemberState.STARTING
                ),
                asked_at=pod.asked_at,
                ready_at=pod.ready_at,
            )
            for pod in sorted(self._pods.values(), key=lambda p: p.name)
        )
        asks = tuple(
            Member(
                member_id=ask.member_id,
                url=None,
                state=MemberState.STARTING,
                asked_at=ask.asked_at,
                ready_at=None,
            )
            for ask in self._asks.values()
        )
        members = pods + asks
        if members != self._last:
            self._last = members
            self._listeners.notify()

    # -- asks ------------------------------------------------------------------------------

    def _arm(self, ask: _Ask) -> None:
        """(Re)start `ask`'s startup timeout, counted from its asked_at."""
        left = self._startup_timeout_s - (self._clock.now() - ask.asked_at)
        ask.timer = self._clock.call_later(max(0.0, left), lambda: self._expire(ask))

    def _forget(self, ask: _Ask) -> None:
        """Drop `ask` (matched, cancelled or expired) and its timer; idempotent."""
        self._asks.pop(ask.member_id, None)
        if ask.timer is not None:
            ask.timer.cancel()
            ask.timer = None

    def _expire(self, ask: _Ask) -> None:
        """No Pod came for `ask` in time: a failed start, and its replica is given back."""
        if self._asks.get(ask.member_id) is not ask:
            return
        self._forget(ask)
        self.failed_starts += 1
        log.warning(
            "scaler_start_failed",
            actuator="kubernetes",
            member=ask.member_id,
            reason=f"no Pod of {self.workload}/{self.name} came within "
            f"{self._startup_timeout_s:g} s of the scale-up (a ResourceQuota, an admission "
            f"webhook or a stalled controller?)",
        )
        self._publish()
        task = asyncio.get_running_loop().create_task(self._give_back(ask))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _give_back(self, ask: _Ask) -> None:
        """Patch replicas down by one for an expired `ask`; a failure is logged."""
        try:
            async with self._scale_lock:
                if self._api is not None:
                    await self._scale(-1, lambda _: None)
        except ActuatorError as error:
            log.warning(
                "scaler_kubernetes_give_back_failed",
                workload=f"{self.workload}/{self.name}",
                namespace=self.namespace,
                member=ask.member_id,
                error=str(error),
            )

    async def _cancel(self, ask: _Ask) -> None:
        """`stop` of a placeholder: drop the ask at once, patch replicas down by one; on
        failure the ask is back (its timeout still counted from asked_at) and it raises."""
        self._forget(ask)
        self._publish()
        try:
            async with self._scale_lock:
                await self._scale(-1, lambda _: None)
        except BaseException:
            self._asks[ask.member_id] = ask
            self._asks = dict(sorted(self._asks.items(), key=lambda item: item[1].seq))
            self._arm(ask)
            self._publish()
            raise

    # -- scale subresource -----------------------------------------------------------------

    def _check_ordinal(self, member_id: str, replicas: int) -> None:
        highest = f"{self.name}-{replicas - 1}"
        if member_id != highest:
            raise ActuatorError(
                f"StatefulSet {self.name} removes its highest ordinal first: only {highest} "
                f"can be stopped now, not {member_id}"
            )

    async def _read_scale(self) -> tuple[int, str]:
        """(spec.replicas, resourceVersion) of the workload's scale subresource."""
        apps = k8s.AppsV1Api(self._api)
        read = (
            apps.read_namespaced_deployment_scale
            if self.workload == "Deployment"
            else apps.read_namespaced_stateful_set_scale
        )
        scale = await self._call(
            f"read the scale of {self.workload}/{self.name}",
            f"get {self._resource()}/scale",
            read(self.name, self.namespace, _request_timeout=self._request_timeout_s),
        )
        return int(scale.spec.replicas or 0), str(scale.metadata.resource_version)

    async def _scale(self, delta: int, check: Callable[[int], None]) -> None:
        """Patch spec.replicas to current + `delta` (`check(current)` may refuse first),
        with the read resourceVersion as precondition; re-read on 409 Conflict."""
        apps = k8s.AppsV1Api(self._api)
        patch = (
            apps.patch_namespaced_deployment_scale
            if self.workload == "Deployment"
            else apps.patch_namespaced_stateful_set_scale
        )
        for attempt in range(CONFLICT_RETRIES):
            replicas, rv = await self._read_scale()
            check(replicas)
            target = max(0, replicas + delta)
            body = {"metadata": {"resourceVersion": rv}, "spec": {"replicas": target}}
            try:
                await self._call(
                    f"scale {self.workload}/{self.name} from {replicas} to {target}",
                    f"patch {self._resource()}/scale",
                    patch(
                        self.name, self.namespace, body, _request_timeout=self._request_timeout_s
                    ),
                    conflict=attempt < CONFLICT_RETRIES - 1,
                )
            except _Conflict:
                continue
            log.info(
                "scaler_kubernetes_scaled",
                workload=f"{self.workload}/{self.name}",
                namespace=self.namespace,
                replicas_from=replicas,
                replicas_to=target,
            )
            return

    async def _delete(self, pod: str) -> None:
        """Delete `pod` with its own grace period; already gone (404) counts as done."""
        try:
            await self._call(
                f"delete Pod {pod}",
                "delete pods",
                self._core().delete_namespaced_pod(
                    pod, self.namespace, _request_timeout=self._request_timeout_s
                ),
            )
        except ActuatorError as error:
            if not isinstance(error.__cause__, ApiException) or error.__cause__.status != 404:
                raise

    # -- API calls -------------------------------------------------------------------------

    def _core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self._api)

    def _resource(self) -> str:
        return "deployments" if self.workload == "Deployment" else "statefulsets"

    async def _call(
        self, what: str, permission: str, call: Awaitable[Any], *, conflict: bool = False
    ) -> Any:
        """Await `call`; API errors -> ActuatorError (or _Conflict on 409 when `conflict`)."""
        try:
            return await call
        except ApiException as error:
            if conflict and error.status == 409:
                raise _Conflict() from error
            raise self._error(
                what, permission, int(error.status or 0), _message(error.body)
            ) from error
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            raise ActuatorError(
                f"kubernetes: {what} in namespace {self.namespace} failed: "
                f"{type(error).__name__}: {error}"
            ) from error

    def _error(self, what: str, permission: str, status: int, message: str) -> ActuatorError:
        try:
            phrase = HTTPStatus(status).phrase.upper()
        except ValueError:
            phrase = "ERROR"
        text = f"kubernetes: {what} in namespace {self.namespace}: HTTP {status} {phrase}"
        if message:
            text += f": {message}"
        if status == 403:
            text += (
                f" (the RBAC role of this process's service account needs: {permission} "
                f"in namespace {self.namespace})"
            )
        return ActuatorError(text)


class _Conflict(Exception):
    """409 Conflict: someone else changed the scale since it was read."""


def _message(body: bytes | str | None) -> str:
    """The `message` of a Kubernetes Status body (the body itself when it is not one)."""
    if not body:
        return ""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    try:
        status = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    return str(status.get("message") or text)[:500] if isinstance(status, dict) else text[:500]

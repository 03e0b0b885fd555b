"""A real Kubernetes API server for the tests: etcd + kube-apiserver 1.20.2 on loopback.

`make k8s` builds both into `.cache/k8s/bin` (deploy/k8s-test/build.sh). `KubeApiServer`
makes a PKI in a temporary directory with openssl (a CA, a serving certificate for
127.0.0.1, a service-account key pair, a static admin token of `system:masters`), starts
etcd and kube-apiserver on free loopback ports, waits for `/readyz` and writes a kubeconfig.
Nothing runs Pods (no controller-manager, no kubelet): a test plays those parts itself.

The API server runs with `--watch-cache=false`, so watches are served by etcd itself and a
watch from a revision etcd has compacted gets `410 Gone` (`compact`), as a long-disconnected
watcher of a real cluster does. Without the binaries the tests skip with that reason,
unless HOMING_REQUIRE_K8S=1 (`make test` sets it after `make k8s`), which fails them.

Nothing runs Pods there, so `FakeCluster` plays the ReplicaSet controller and the kubelet of
one Deployment (`NAME`, Pods labelled `SELECTOR`): its controller watches `spec.replicas`
and, while `controller_gate` is open, brings the live Pods (those without a
deletionTimestamp) to it: it creates Pods (a simulated worker process each, `homing sim`
with `sim_args`, whose gRPC port the Pod's container port `grpc` names) or deletes the
surplus in the ReplicaSet controller's order (not Ready before Ready, then the lowest
`pod-deletion-cost`, then the newest); its kubelet marks a Pod Ready (podIP 127.0.0.1)
through `pods/status` once `ready_gate` is open. Pods without a nodeName go at once when
deleted. `api` is a fixture giving an admin API client and a namespace of the test's own.
Both fixtures are registered in tests/integration/conftest.py; a test module must not import
them itself (a module that does gets an API server of its own).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import pytest
import pytest_asyncio
from helpers import eventually, free_port
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio import watch as k8s_watch

from homing.scaler.actuators.kubernetes import DELETION_COST
from homing.sim.process import spawn_sim, terminate

ROOT = Path(__file__).resolve().parent.parent
K8S_BIN = ROOT / ".cache" / "k8s" / "bin"
TOKEN = "homing-test-admin-token"
NAME = "llama"  # the workload FakeCluster runs
SELECTOR = f"app={NAME}"


def k8s_missing() -> str | None:
    """Why the API server cannot run here, or None when it can."""
    for name in ("kube-apiserver", "etcd"):
        if not os.access(K8S_BIN / name, os.X_OK):
            return f"{K8S_BIN / name} is missing: run `make k8s` (deploy/k8s-test/build.sh)"
    if shutil.which("openssl") is None:
        return "openssl is missing (it makes the test PKI): apt-get install openssl"
    return None


def require_k8s() -> None:
    """Skip the calling test when the API server cannot run here (with the reason); fail
    instead when HOMING_REQUIRE_K8S=1."""
    reason = k8s_missing()
    if reason is None:
        return
    if os.environ.get("HOMING_REQUIRE_K8S") == "1":
        pytest.fail(f"HOMING_REQUIRE_K8S=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(directory: Path) -> None:
    """ca.{key,crt}, server.{key,crt} (IP 127.0.0.1, serverAuth), sa.{key,pub}, tokens.csv."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=homing-test-ca", "-keyout", "ca.key", "-out", "ca.crt",
             cwd=directory)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
             "-keyout", "server.key", "-out", "server.csr", cwd=directory)  # fmt: skip
    (directory / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    )
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.crt",
             cwd=directory)  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    (directory / "tokens.csv").write_text(f"{TOKEN},admin,admin-uid,system:masters\n")


class KubeApiServer:
    """etcd and kube-apiserver child processes, and the kubeconfig that reaches them."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="k8s-"))
        self.etcd_port = free_port()
        self.port = free_port()
        self.kubeconfig = str(self.dir / "kubeconfig")
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """`https://127.0.0.1:PORT`."""
        return f"https://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> None:
        """Start etcd, then kube-apiserver, and wait for `/readyz`; fails the test (with the
        tail of the server's log) when it is not ready within `timeout_s`."""
        make_pki(self.dir)
        etcd_log = (self.dir / "etcd.log").open("wb")
        self._procs.append(
            subprocess.Popen(
                [
                    str(K8S_BIN / "etcd"),
                    "--data-dir", str(self.dir / "etcd"),
                    "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                    "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                    "--listen-peer-urls", f"http://127.0.0.1:{free_port()}",
                    "--log-level", "warn",
                ],
                stdout=etcd_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        )  # fmt: skip
        d = self.dir
        api_log = (d / "apiserver.log").open("wb")
        self._procs.append(
            subprocess.Popen(
                [
                    str(K8S_BIN / "kube-apiserver"),
                    f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                    "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                    f"--secure-port={self.port}", "--insecure-port=0",
                    f"--cert-dir={d / 'certs'}",
                    f"--tls-cert-file={d / 'server.crt'}",
                    f"--tls-private-key-file={d / 'server.key'}",
                    f"--client-ca-file={d / 'ca.crt'}",
                    f"--token-auth-file={d / 'tokens.csv'}",
                    "--authorization-mode=RBAC",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    f"--service-account-key-file={d / 'sa.pub'}",
                    f"--service-account-signing-key-file={d / 'sa.key'}",
                    "--service-cluster-ip-range=10.96.0.0/24",
                    "--endpoint-reconciler-type=none",
                    "--disable-admission-plugins=ServiceAccount",
                    "--watch-cache=false",
                    "--v=0",
                ],
                stdout=api_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        )  # fmt: skip
        self._write_kubeconfig()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    self.stop()
                    pytest.fail(f"{proc.args[0]} exited ({proc.returncode}):\n{self.log_tail()}")
            if self._ready():
                return
            time.sleep(0.1)
        tail = self.log_tail()
        self.stop()
        pytest.fail(f"kube-apiserver was not ready within {timeout_s} s:\n{tail}")

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority": str(self.dir / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": "admin", "user": {"token": TOKEN}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
            "current-context": "test",
        }
        Path(self.kubeconfig).write_text(json.dumps(config))

    def _ready(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
        request = urllib.request.Request(
            f"{self.url}/readyz", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=1.0, context=context) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def log_tail(self, lines: int = 30) -> str:
        """The last `lines` lines of the API server's log."""
        path = self.dir / "apiserver.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def _etcd(self, path: str, body: dict[str, object]) -> dict[str, object]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.etcd_port}{path}", data=json.dumps(body).encode()
        )
        with urllib.request.urlopen(request, timeout=5.0) as response:
            return dict(json.load(response))

    def compact(self) -> int:
        """Compact etcd up to its current revision; returns it. A watch from resourceVersion
        R starts at R + 1, so it is then `410 Gone` when two writes came after R."""
        key = base64.b64encode(b"/registry/").decode()
        header = self._etcd("/v3/kv/range", {"key": key, "limit": 1})["header"]
        revision = int(header["revision"])  # type: ignore[index]
        self._etcd("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    def stop(self) -> None:
        """Terminate the API server, then etcd (SIGKILL after 5 s each); remove the PKI."""
        for proc in reversed(self._procs):
            proc.terminate()
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def kube_api() -> Iterator[KubeApiServer]:
    """One API server for the session (registered in tests/integration/conftest.py)."""
    require_k8s()
    server = KubeApiServer()
    server.start()
    yield server
    server.stop()


def pod_body(name: str, labels: dict[str, str], port: int) -> dict[str, object]:
    """A Pod whose one container names `port` as `grpc`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "image": "homing-sim",
                    "ports": [{"name": "grpc", "containerPort": port}],
                }
            ]
        },
    }


def workload_body(kind: str, replicas: int) -> dict[str, object]:
    """A Deployment or StatefulSet `NAME` of `replicas` Pods labelled `SELECTOR`."""
    spec: dict[str, object] = {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": NAME}},
        "template": {
            "metadata": {"labels": {"app": NAME}},
            "spec": {
                "containers": [
                    {
                        "name": "engine",
                        "image": "homing-sim",
                        "ports": [{"name": "grpc", "containerPort": 50051}],
                    }
                ]
            },
        },
    }
    if kind == "StatefulSet":
        spec["serviceName"] = NAME
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": NAME}, "spec": spec}


def pod_ready(pod: k8s.V1Pod) -> bool:
    """Whether `pod`'s Ready condition is True."""
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


class FakeCluster:
    """The ReplicaSet controller and kubelet of the Deployment `NAME` (module docstring).

    `sim_args`: extra `homing sim` options of each Pod's worker. `scales`: each distinct
    spec.replicas the Deployment watch saw, in order, with the Deployment's resourceVersion
    then; `deleted`: (pod, its deletion cost) per Pod deleted, whoever deleted it, and
    `deleted_versions` the resourceVersion of each deletion (etcd revisions, so both kinds
    order against each other). `on_scale` callbacks get each new spec.replicas as the watch
    delivers it. `sims` and `urls`: each live Pod's worker process and gRPC URL."""

    def __init__(self, api: k8s.ApiClient, namespace: str, sim_args: Sequence[str] = ()) -> None:
        self.core = k8s.CoreV1Api(api)
        self.apps = k8s.AppsV1Api(api)
        self.namespace = namespace
        self.sim_args = list(sim_args)
        self.ready_gate = asyncio.Event()
        self.ready_gate.set()
        self.controller_gate = asyncio.Event()
        self.controller_gate.set()
        self.sims: dict[str, asyncio.subprocess.Process] = {}
        self.urls: dict[str, str] = {}
        self.ready: set[str] = set()
        self.desired: int | None = None  # the Deployment's spec.replicas as last watched
        self.scales: list[tuple[int, str]] = []
        self.on_scale: list[Callable[[int], None]] = []
        self.reconciles = 0  # reconciliations finished
        self.deleted: list[tuple[str, str]] = []
        self.deleted_versions: dict[str, str] = {}
        self.controller_deleted: list[str] = []  # the pods this controller deleted
        self._changed = asyncio.Event()
        self._order: list[str] = []  # live pods it created, oldest first
        self._count = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._runs: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._runs = [
            loop.create_task(self._watch_deployment()),
            loop.create_task(self._watch_pods()),
            loop.create_task(self._controller()),
        ]

    async def _watch_deployment(self) -> None:
        watcher = k8s_watch.Watch()
        async with watcher:
            async for event in watcher.stream(
                self.apps.list_namespaced_deployment,
                self.namespace,
                field_selector=f"metadata.name={NAME}",
            ):
                if event["type"] in ("ADDED", "MODIFIED"):
                    desired = int(event["object"].spec.replicas or 0)
                    if desired != self.desired:
                        self.scales.append((desired, event["object"].metadata.resource_version))
                        for callback in self.on_scale:
                            callback(desired)
                    self.desired = desired
                    self._changed.set()

    async def _watch_pods(self) -> None:
        watcher = k8s_watch.Watch()
        async with watcher:
            async for event in watcher.stream(
                self.core.list_namespaced_pod, self.namespace, label_selector=SELECTOR
            ):
                if event["type"] == "DELETED":
                    meta = event["object"].metadata
                    cost = (meta.annotations or {}).get(DELETION_COST, "0")
                    self.deleted.append((meta.name, cost))
                    self.deleted_versions[meta.name] = meta.resource_version

    async def _controller(self) -> None:
        while True:
            await self._changed.wait()
            await self.controller_gate.wait()
            self._changed.clear()
            assert self.desired is not None
            await self._reconcile(self.desired)
            self.reconciles += 1

    async def _reconcile(self, desired: int) -> None:
        pods = (await self.core.list_namespaced_pod(self.namespace, label_selector=SELECTOR)).items
        live = {p.metadata.name: p for p in pods if p.metadata.deletion_timestamp is None}
        for name in [n for n in self._order if n not in live]:  # deleted by someone else
            self._order.remove(name)
            await self._stop_sim(name)
        while len(self._order) < desired:
            await self._create()
        if len(self._order) > desired:

            def rank(name: str) -> tuple[bool, int, int]:
                pod = live[name]
                cost = int((pod.metadata.annotations or {}).get(DELETION_COST, "0"))
                return pod_ready(pod), cost, -self._order.index(name)

            for name in sorted(self._order, key=rank)[: len(self._order) - desired]:
                self._order.remove(name)
                self.controller_deleted.append(name)
                await self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
                await self._stop_sim(name)

    async def _stop_sim(self, name: str) -> None:
        self.urls.pop(name, None)
        await terminate([self.sims.pop(name)], 2.0)

    async def _create(self) -> None:
        self._count += 1
        name = f"{NAME}-{self._count}"
        process, ready = await spawn_sim(
            ["--workers", "1", "--port", "0", "--parent-pid", str(os.getpid()), *self.sim_args]
        )
        self.sims[name] = process
        url = ready["workers"][0]["url"]
        self.urls[name] = url
        port = int(url.rsplit(":", 1)[1])
        await self.core.create_namespaced_pod(self.namespace, pod_body(name, {"app": NAME}, port))
        self._order.append(name)
        task = asyncio.get_running_loop().create_task(self._kubelet(name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _kubelet(self, name: str) -> None:
        await self.ready_gate.wait()
        if name not in self._order:
            return
        status = {
            "status": {
                "phase": "Running",
                "podIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        }
        await self.core.patch_namespaced_pod_status(name, self.namespace, status)
        self.ready.add(name)

    async def pods(self) -> dict[str, k8s.V1Pod]:
        """The Pods there now without a deletionTimestamp, by name."""
        pods = (await self.core.list_namespaced_pod(self.namespace, label_selector=SELECTOR)).items
        return {p.metadata.name: p for p in pods if p.metadata.deletion_timestamp is None}

    async def live(self) -> set[str]:
        """The names of the Pods there now without a deletionTimestamp."""
        return set(await self.pods())

    async def close(self) -> None:
        """Stop watching and reconciling; terminate every worker process it started."""
        for task in [*self._tasks, *self._runs]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await terminate(self.sims.values(), 2.0)
        self.sims.clear()
        self.urls.clear()


@pytest_asyncio.fixture
async def api(kube_api: KubeApiServer) -> AsyncIterator[tuple[k8s.ApiClient, str]]:
    """An API client (admin) and a fresh namespace of this test's own."""
    configuration = k8s.Configuration()
    await k8s_config.load_kube_config(
        config_file=kube_api.kubeconfig, client_configuration=configuration
    )
    async with k8s.ApiClient(configuration=configuration) as client:
        namespace = f"t-{uuid.uuid4().hex[:10]}"
        await k8s.CoreV1Api(client).create_namespace({"metadata": {"name": namespace}})
        yield client, namespace
        await k8s.CoreV1Api(client).delete_namespace(namespace)


async def deployment(
    api: tuple[k8s.ApiClient, str], replicas: int, sim_args: Sequence[str] = ()
) -> FakeCluster:
    """Create the Deployment `NAME` and start its fake controller and kubelet; returns once
    its `replicas` Pods are Ready (60 s, else the test fails)."""
    client, namespace = api
    await k8s.AppsV1Api(client).create_namespaced_deployment(
        namespace, workload_body("Deployment", replicas)
    )
    cluster = FakeCluster(client, namespace, sim_args)
    cluster.start()
    if not await eventually(lambda: len(cluster.ready) == replicas, 60):
        await cluster.close()
        pytest.fail(f"{replicas} Pods were not Ready within 60 s: {sorted(cluster.ready)}")
    return cluster


async def replicas(api: tuple[k8s.ApiClient, str]) -> int:
    """The Deployment `NAME`'s spec.replicas, read from its scale subresource now."""
    client, namespace = api
    scale = await k8s.AppsV1Api(client).read_namespaced_deployment_scale(NAME, namespace)
    return int(scale.spec.replicas or 0)

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
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import free_port

ROOT = Path(__file__).resolve().parent.parent
K8S_BIN = ROOT / ".cache" / "k8s" / "bin"
TOKEN = "homing-test-admin-token"


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
    """One API server for the session (import this fixture into a test module)."""
    require_k8s()
    server = KubeApiServer()
    server.start()
    yield server
    server.stop()

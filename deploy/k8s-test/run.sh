#!/usr/bin/env bash
# Run the test API server by hand: etcd + kube-apiserver 1.20.2 on free loopback ports, with a
# throwaway PKI (tests/k8s_api.py, as the tests start it), until Ctrl-C. Build it first with
# `make k8s`. Prints the kubeconfig to use: KUBECONFIG=... kubectl get pods
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
exec .venv/bin/python - <<'PY'
import signal, sys, threading
sys.path.insert(0, "tests")
from k8s_api import KubeApiServer, k8s_missing

reason = k8s_missing()
if reason:
    sys.exit(reason)
server = KubeApiServer()
server.start()
print(f"kube-apiserver {server.url} (etcd 127.0.0.1:{server.etcd_port})")
print(f"export KUBECONFIG={server.kubeconfig}", flush=True)
done = threading.Event()
for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: done.set())
done.wait()
server.stop()
PY

#!/usr/bin/env bash
# Build a real kube-apiserver (Kubernetes 1.20.2, from Debian bookworm's `kubernetes` source
# package, offline with Debian's Go) and provide etcd (Debian's etcd-server 3.4) for the tests:
#   ./build.sh OUT        (make k8s: OUT = .cache/k8s)
# Leaves OUT/bin/kube-apiserver and OUT/bin/etcd; does nothing when both are there. About 5
# minutes and 1.8 GB of disk the first time (the source tree is removed afterwards).
# The recipe: /work/shared/k8s/RECIPE.md (a plain `go build` fails with "updates to go.mod
# needed"; Kubernetes' own `make WHAT=cmd/kube-apiserver` in GOPATH mode, as Debian's rules do).
set -euo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd)
mkdir -p "$out/bin"
if [ -x "$out/bin/kube-apiserver" ] && [ -x "$out/bin/etcd" ]; then
  exit 0
fi

SUDO=$( [ "$(id -u)" = 0 ] || echo sudo )
export DEBIAN_FRONTEND=noninteractive
quiet() {  # run "$@", showing its output only when it fails
  local log; log=$(mktemp)
  if "$@" >"$log" 2>&1; then rm -f "$log"; else cat "$log"; rm -f "$log"; return 1; fi
}
apt_quiet() {  # one apt-get at a time beside make's own (the Makefile's APT_LOCK)
  quiet flock "${APT_LOCK:-/tmp/homing-apt.lock}" "$@"
}

need=()
for pair in go:golang-go etcd:etcd-server dpkg-source:dpkg-dev rsync:rsync openssl:openssl \
    curl:curl make:make; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "k8s-test: installing ${need[*]} (Debian packages)"
  apt_quiet $SUDO apt-get update -qq
  apt_quiet $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
ln -sf "$(command -v etcd)" "$out/bin/etcd"

if [ ! -x "$out/bin/kube-apiserver" ]; then
  srcs=/etc/apt/sources.list.d/homing-k8s-test-src.sources
  if [ ! -f "$srcs" ]; then
    printf '%s\n' 'Types: deb-src' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm' \
      'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' |
      $SUDO tee "$srcs" >/dev/null
    apt_quiet $SUDO apt-get update -qq
  fi
  work="$out/src"
  rm -rf "$work"; mkdir -p "$work"
  echo "k8s-test: fetching the kubernetes source package (bookworm, ~33 MB)"
  (cd "$work" && apt_quiet apt-get source -qq kubernetes/bookworm)
  tree=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)
  [ -n "$tree" ] || { echo "k8s-test: no kubernetes-* source tree in $work" >&2; exit 1; }
  mkdir -p "$tree/.go/src/k8s.io"
  ln -sfn "$tree" "$tree/.go/src/k8s.io/kubernetes"
  echo "k8s-test: building kube-apiserver 1.20.2 (~4 minutes)"
  (
    cd "$tree/.go/src/k8s.io/kubernetes"
    export GOPATH="$tree/.go" GO111MODULE=off CGO_ENABLED=0 GOPROXY=off GOFLAGS= \
      GOCACHE="$out/go-cache"
    quiet env -u MAKEFLAGS -u MAKELEVEL make WHAT=cmd/kube-apiserver
  )
  install -m 0755 "$tree/_output/bin/kube-apiserver" "$out/bin/kube-apiserver.tmp"
  mv "$out/bin/kube-apiserver.tmp" "$out/bin/kube-apiserver"
  rm -rf "$work" "$out/go-cache"
fi
"$out/bin/kube-apiserver" --version

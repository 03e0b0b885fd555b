# homing: every target creates what it needs (virtual env, generated stubs).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PROTOS := $(wildcard proto/homing/v1/*.proto)

.PHONY: run test sglang-cpu proto bench bench-sim bench-gateway bench-stops bench-router bench-routers bench-routers-chat bench-overhead bench-autoscale chaos lint format clean redis-server prometheus tmux systemd wrk native-deps apt-libxxhash

NATIVE := setup.py $(wildcard src/homing/router/_native/*.c)

$(VENV)/.installed: pyproject.toml $(NATIVE)
	@$(MAKE) --no-print-directory native-deps
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	rm -f src/homing/router/*.so
	$(PY) -m pip install --quiet -e '.[test]'
	@for m in _walk _kvwire _cost; do $(PY) -c "import homing.router.$$m" 2>/dev/null || \
	  echo "make: warning: homing.router.$$m was not built (it needs a C compiler, and" \
	       "_walk also xxhash.h >= 0.8 from libxxhash-dev); the router runs it in pure" \
	       "Python. Fix that, then: make clean && make"; done
	touch $@

# Stubs for our own API, generated into src/homing/v1 (not committed).
src/homing/v1/.generated: $(VENV)/.installed $(PROTOS)
	mkdir -p src/homing/v1
	$(PY) -m grpc_tools.protoc -Iproto --python_out=src --pyi_out=src --grpc_python_out=src $(PROTOS)
	touch $@

proto: src/homing/v1/.generated

## make run: gateway on 127.0.0.1:8080 (HTTP) and :50051 (gRPC) over two simulated workers
run: proto
	$(VENV)/bin/homing serve

# $(call apt-install,TEST,PACKAGE): install Debian's PACKAGE when the shell test TEST fails
# (CI runs as root on a fresh Debian machine; elsewhere sudo is used).
# One apt-get at a time across parallel make jobs and deploy/k8s-test/build.sh (flock(1)).
export APT_LOCK := $(or $(TMPDIR),/tmp)/homing-apt.lock

define apt-install
@$(1) || { \
  echo "make: installing $(2) (Debian package)"; \
  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
  export DEBIAN_FRONTEND=noninteractive; log=$$(mktemp); \
  if flock $(APT_LOCK) $$SUDO apt-get update -qq >$$log 2>&1 && \
     flock $(APT_LOCK) $$SUDO apt-get install -y -qq --no-install-recommends $(2) >>$$log 2>&1; \
  then rm -f $$log; else cat $$log; rm -f $$log; exit 1; fi; \
}
endef

# The router's C extensions (setup.py) hash with xxHash's own library. At each install
# (.venv/.installed), when the compiler cannot find xxhash.h, Debian's libxxhash-dev is
# installed if apt-get exists; if that is not possible the install goes on without the
# extension (pure Python: same results, slower), says so, and the test that checks it is
# built fails naming what it needs.
XXHASH_FOUND := echo '\#include <xxhash.h>' | $${CC:-cc} -E -x c - >/dev/null 2>&1

native-deps:
	@$(XXHASH_FOUND) || ! command -v apt-get >/dev/null 2>&1 || \
	  $(MAKE) --no-print-directory apt-libxxhash 2>/dev/null || \
	  echo "make: warning: could not install libxxhash-dev; the router runs in pure Python"

apt-libxxhash:
	$(call apt-install,$(XXHASH_FOUND),libxxhash-dev)

# The quota tests start their own redis-server on a free loopback port.
redis-server:
	$(call apt-install,command -v redis-server >/dev/null 2>&1,redis-server)

# The rule tests run promtool, and the dashboard test a real Prometheus server (Debian's
# prometheus package; the tests start their own server on a free loopback port).
prometheus:
	$(call apt-install,command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1,prometheus)

# The unit files are checked with systemd-analyze verify, and socket activation runs under
# systemd-socket-activate (Debian's systemd package; no running systemd is needed).
systemd:
	$(call apt-install,command -v systemd-analyze >/dev/null 2>&1 && command -v systemd-socket-activate >/dev/null 2>&1,systemd)

# `homing top` is tested as a person sees it, in a tmux pane.
tmux:
	$(call apt-install,command -v tmux >/dev/null 2>&1,tmux)

# bench-overhead's load generator (HTTP, one thread, a Lua script per request).
wrk:
	$(call apt-install,command -v wrk >/dev/null 2>&1,wrk)

# A real SGLang 0.5.23 worker on the CPU (deploy/sglang-cpu/README.md): its own virtual env,
# pinned, with our `sgl_kernel` shim and the torchvision fix, and a tiny random-weight Llama
# serving the simulator's tokenizer. Cached: rebuilt only when its inputs change.
SGLANG_VENV := .venv-sglang
SGLANG_PY   := $(SGLANG_VENV)/bin/python
SGLANG_DIR  := deploy/sglang-cpu
SGLANG_DATA := .cache/sglang-cpu
TINY_MODEL  := $(SGLANG_DATA)/tiny-llama

$(SGLANG_VENV)/.installed: $(addprefix $(SGLANG_DIR)/,install.sh requirements.txt constraints.txt \
    fix_torchvision.py sgl_kernel/pyproject.toml sgl_kernel/sgl_kernel/__init__.py)
	PYTHON=$(PYTHON) $(SGLANG_DIR)/install.sh $(SGLANG_VENV)
	touch $@

$(TINY_MODEL)/.built: $(SGLANG_VENV)/.installed $(VENV)/.installed $(SGLANG_DIR)/build_tiny_model.py \
    src/homing/text/served.py src/homing/text/templates/chat_template.jinja
	$(PY) -m homing.text.served $(SGLANG_DATA)/tokenizer
	$(SGLANG_PY) $(SGLANG_DIR)/build_tiny_model.py --tokenizer-dir $(SGLANG_DATA)/tokenizer \
	    --out $(TINY_MODEL)
	touch $@

## make sglang-cpu: the SGLang CPU env (.venv-sglang) and the tiny model (~80 s the first time)
sglang-cpu: $(TINY_MODEL)/.built

# The kubernetes actuator's tests run a real kube-apiserver 1.20.2 + etcd on loopback, built
# from Debian bookworm's kubernetes source package with Debian's Go into .cache/k8s/bin
# (deploy/k8s-test/build.sh: ~5 minutes and 1.8 GB of disk the first time; nothing once built).
.PHONY: k8s
K8S_DIR := .cache/k8s
k8s:
	deploy/k8s-test/build.sh $(K8S_DIR)

# What `make test` needs: the Debian packages first, then the kube-apiserver build (CPU-bound
# Go) side by side with the virtual envs and the tiny model (mostly unpacking wheels). Every
# apt-get here and in deploy/k8s-test/build.sh takes $(APT_LOCK) first, so none runs beside
# another whatever -j says.
.PHONY: test-deps
test-deps:
	@$(MAKE) --no-print-directory -j1 redis-server prometheus tmux systemd
	@$(MAKE) --no-print-directory -j2 --output-sync=target k8s proto sglang-cpu

## make test: the whole suite (unit + integration over loopback, against simulated and real
## SGLang workers and a real Kubernetes API server; builds the SGLang CPU env and the API
## server, and installs redis-server if missing). Two phases: the suite on TEST_WORKERS
## pytest-xdist workers, then the tests marked `serial` alone (tests/conftest.py says which
## and why). PYTEST_ARGS go to both; a phase that selects nothing is not a failure, both
## selecting nothing is (pytest's exit 5).
TEST_WORKERS ?= 2
TEST_ENV := HOMING_REQUIRE_SGLANG=1 HOMING_REQUIRE_PROMETHEUS=1 HOMING_REQUIRE_TMUX=1 \
    HOMING_REQUIRE_SYSTEMD=1 HOMING_REQUIRE_K8S=1
test: test-deps
	$(SGLANG_PY) -m pytest -q -p no:cacheprovider $(SGLANG_DIR)/sgl_kernel/tests
	$(TEST_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope -m 'not serial' \
	    $(PYTEST_ARGS); parallel=$$?; \
	echo "make test: the serial tests, alone"; \
	$(TEST_ENV) $(PY) -m pytest -q -m serial $(PYTEST_ARGS); serial=$$?; \
	if [ $$parallel -eq 5 ] && [ $$serial -eq 5 ]; then exit 5; fi; \
	for rc in $$parallel $$serial; do [ $$rc -eq 0 ] || [ $$rc -eq 5 ] || exit $$rc; done

## make bench: replay 300 Mooncake requests against a running gateway (start `make run` first);
## the summary in bench-out/bench.json, its plots in bench-out/plots/
bench: proto
	$(VENV)/bin/homing bench --trace ../shared/traces/mooncake/conversation_trace.jsonl \
	    --limit 300 --speed 20 --json bench-out/bench.json --plot bench-out/plots

## make bench-sim: largest --speedup at which one process of 8 simulated 70B TP8 workers keeps
## up with the Mooncake trace (from 8x, x1.25 per trial until one falls behind; ~70 s a trial)
bench-sim: proto
	mkdir -p bench-out
	$(PY) -m homing.bench.sim_throughput --trace ../shared/traces/mooncake/conversation_trace.jsonl \
	    --workers 8 --model llama-3.1-70b --speedup 8 --search \
	    --duration-s 60 --warmup-s 10 --json bench-out/bench-sim.json

## make bench-gateway: latency auth + Redis quotas add per request (p50/p99 and the ratio to
## the same requests without tenants), and the CPU and latency the request metrics add (ratio
## to `[obs] request_metrics = false`), 2000 requests each; starts its own worker and redis-server
bench-gateway: proto redis-server
	mkdir -p bench-out
	$(PY) -m homing.bench.gateway_overhead --requests 2000 --json bench-out/bench-gateway.json

## make bench-stops: /health latency and gateway RSS while 8 requests of n=16 at the stop caps
## (4 x 1,024 characters) run, against the same load without stops; starts its own gateway
bench-stops: proto
	mkdir -p bench-out
	$(PY) -m homing.bench.stop_caps --requests 8 --rounds 3 --json bench-out/stop-caps.json

## make bench-router: router microbenchmarks (decision latency at 2k/16k tokens x 8/64/256
## workers and at fleet scale, 500/2,000/4,000 workers, with 1M blocks indexed, event
## ingestion, bytes per block, 1M-prompt churn)
bench-router: proto
	mkdir -p bench-out
	$(PY) -m homing.bench.router_micro --blocks 1000000 --churn 1000000 \
	    --workers 8 64 256 500 2000 4000 --json bench-out/router-micro.json

## make bench-routers: homing's four policies and smg cache_aware on the first 2,000 Mooncake
## requests, 8 simulated 70B TP8 workers at 3x speed, ~70% load under round robin (~20 min)
bench-routers: proto
	mkdir -p bench-out
	$(PY) -m homing.bench.routers --trace ../shared/traces/mooncake/conversation_trace.jsonl \
	    --limit 2000 --workers 8 --model llama-3.1-70b --gpu H100 --tp 8 --speedup 3 \
	    --target-load 0.70 --json bench-out/routers.json --plot bench-out/routers-plots

## make bench-routers-chat: the same five runs on the synthetic multi-tenant chat trace
## (homing.bench.chat_trace: 32 tenants' shared system prompts, growing conversations;
## 1,973 requests over 125 s of trace), same fleet and load, at 1x: ~16 requests/s,
## ~48 at 3x, left a 2-core machine's sims behind (~13 min)
bench-routers-chat: proto
	mkdir -p bench-out
	$(PY) -m homing.bench.routers --trace chat --limit 2000 --workers 8 --model llama-3.1-70b \
	    --gpu H100 --tp 8 --speedup 1 --target-load 0.70 --json bench-out/routers-chat.json \
	    --plot bench-out/routers-chat-plots

## make bench-overhead: homing's and smg's CPU per request and per streamed token, requests/s,
## added first-byte latency and peak RSS, side by side over 2 instant simulated workers, and
## homing's gRPC API and homing without request metrics (3 interleaved rounds, ~5 min;
## bench-out/overhead.json)
bench-overhead: proto wrk
	mkdir -p bench-out
	$(PY) -m homing.bench.overhead --rounds 3 --json bench-out/overhead.json

## make bench-autoscale: traffic doubles in five minutes (10 -> 20 streams) against the autoscaler
## over simulated 70B TP8 workers with a one-minute cold start, all at 5x (~125 s); GPU-seconds
## against an oracle's and p95 TTFT recovery (bench-out/autoscale.json, bench-out/autoscale.png)
bench-autoscale: proto
	mkdir -p bench-out
	$(PY) -m homing.bench.autoscale --speedup 5 --concurrency 10 \
	    --json bench-out/autoscale.json --plot bench-out/autoscale.png

## make chaos: kill -9, stall, 10x slowdown, restart, health flapping, UNAVAILABLE and all at
## once on 3 simulated workers behind a real `homing serve`, under 8 streaming clients, 60 s a
## scenario (~9 min); fails on a hung request or a broken check (bench-out/chaos.json)
chaos: proto
	mkdir -p bench-out
	$(PY) -m homing.bench.chaos --duration-s 60 --json bench-out/chaos.json --log-dir bench-out/chaos-logs

lint: proto
	$(VENV)/bin/ruff check src tests deploy
	$(VENV)/bin/ruff format --check src tests deploy

format: proto
	$(VENV)/bin/ruff check --fix src tests deploy
	$(VENV)/bin/ruff format src tests deploy

clean:
	rm -rf $(VENV) $(SGLANG_VENV) $(SGLANG_DATA) src/homing/v1 bench-out build src/homing/router/*.so

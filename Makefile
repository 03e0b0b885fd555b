# homing: every target creates what it needs (virtual env, generated stubs).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PROTOS := $(wildcard proto/homing/v1/*.proto)

.PHONY: run test proto bench lint format clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
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

## make test: the whole suite (unit + integration over loopback)
test: proto
	$(PY) -m pytest -q $(PYTEST_ARGS)

## make bench: replay 300 Mooncake requests against a running gateway (start `make run` first)
bench: proto
	$(VENV)/bin/homing bench --trace ../shared/traces/mooncake/conversation_trace.jsonl \
	    --limit 300 --speed 20 --json bench-out/bench.json

lint: proto
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests

format: proto
	$(VENV)/bin/ruff check --fix src tests
	$(VENV)/bin/ruff format src tests

clean:
	rm -rf $(VENV) src/homing/v1 bench-out

# OrbitMQ developer commands. `make help` lists them.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: help up test lint fmt test-crash test-chaos bench proto clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || { echo "could not create $(VENV): on Debian, apt-get install python3-venv" >&2; exit 1; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark]'
	touch $(STAMP)

up: $(STAMP) ## start OrbitMQ: NameServer + Broker + gRPC proxy (8081) in one process, data in ./orbitmq-data
	$(VENV)/bin/orbitmq up

lint: $(STAMP) ## ruff (lint + format check), mypy, import contracts
	$(VENV)/bin/ruff check src tests examples
	$(VENV)/bin/ruff format --check src tests examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

fmt: $(STAMP) ## format the code
	$(VENV)/bin/ruff format src tests examples
	$(VENV)/bin/ruff check --fix src tests examples

test: lint ## lint, then the whole test suite
	$(PY) -m pytest

test-crash: $(STAMP) ## only the crash tests (ORBITMQ_CRASH_ITERATIONS=N for longer runs)
	$(PY) -m pytest -m crash

test-chaos: $(STAMP) ## long fault runs: store I/O faults x300, HA faults (master kills...) x100 (ORBITMQ_CHAOS_ITERATIONS=N for both)
	ORBITMQ_CHAOS_ITERATIONS=$${ORBITMQ_CHAOS_ITERATIONS:-300} $(PY) -m pytest -m chaos tests/chaos/test_eio_chaos.py
	ORBITMQ_CHAOS_ITERATIONS=$${ORBITMQ_CHAOS_ITERATIONS:-100} $(PY) -m pytest -m chaos -s tests/chaos --ignore=tests/chaos/test_eio_chaos.py

bench: $(STAMP) ## storage benchmark
	$(PY) -m orbitmq.bench store

proto: $(STAMP) ## regenerate the gRPC proxy's protobuf modules (orbitmq/proxy/grpc_v2)
	$(PY) -m orbitmq.proxy.grpc_v2.generate

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

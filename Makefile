# OrbitMQ developer commands. `make help` lists them.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: help up test lint fmt test-crash test-chaos test-mqtt-interop bench proto clean

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

test-chaos: $(STAMP) ## I/O faults at random store sites, 300 iterations (ORBITMQ_CHAOS_ITERATIONS=N)
	ORBITMQ_CHAOS_ITERATIONS=$${ORBITMQ_CHAOS_ITERATIONS:-300} $(PY) -m pytest -m chaos tests/chaos

PAHO_TESTING ?= .cache/paho.mqtt.testing
PAHO_TESTING_COMMIT := 9d7bb80bb8b9d9cfc0b52f8cb4c1916401281103

test-mqtt-interop: $(STAMP) ## Eclipse Paho MQTT 3.1.1 + 5.0 interoperability suites (needs port 1883 free; PAHO_TESTING=checkout)
	test -d $(PAHO_TESTING) || { git clone -q https://github.com/eclipse/paho.mqtt.testing $(PAHO_TESTING) && git -C $(PAHO_TESTING) checkout -q $(PAHO_TESTING_COMMIT); }
	$(PY) tests/compat/mqtt/paho_interop.py $(PAHO_TESTING)

bench: $(STAMP) ## storage benchmark
	$(PY) -m orbitmq.bench store

proto: $(STAMP) ## regenerate the gRPC proxy's protobuf modules (orbitmq/proxy/grpc_v2)
	$(PY) -m orbitmq.proxy.grpc_v2.generate

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

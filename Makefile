# OrbitMQ developer commands. `make help` lists them.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: help up test lint fmt test-crash test-chaos test-mqtt-interop test-kafka-suite fuzz bench bench-store proto clean browser promtool test-s3 vendor native

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || { echo "could not create $(VENV): on Debian, apt-get install python3-venv" >&2; exit 1; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark,console]'
	touch $(STAMP)

up: $(STAMP) ## start OrbitMQ in one process: NameServer, Broker, gRPC proxy (8081), Kafka (9092), MQTT (1883), console (8088); data in ./orbitmq-data
	$(VENV)/bin/orbitmq up

lint: $(STAMP) ## ruff (lint + format check), mypy, import contracts
	$(VENV)/bin/ruff check src tests examples
	$(VENV)/bin/ruff format --check src tests examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

fmt: $(STAMP) ## format the code
	$(VENV)/bin/ruff format src tests examples
	$(VENV)/bin/ruff check --fix src tests examples

test: lint browser promtool ## lint, then the whole test suite
	$(PY) -m pytest

browser: ## Debian's chromium for the console's browser tests (skipped without it)
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
		  { apt-get update -q >/dev/null 2>&1 && \
		    apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; }; } || \
		echo "chromium not installed: the console's browser tests will be skipped"; }

promtool: ## Debian's prometheus package for promtool (tests/deploy checks the alert rules with it; skipped without it)
	@command -v promtool >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || \
		  { apt-get update -q >/dev/null 2>&1 && \
		    apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1; }; } || \
		echo "promtool not installed: the deploy test's promtool check will be skipped"; }

test-s3: ## install Debian's Swift (s3api) and run the tier's S3 tests against it (root for the install)
	@command -v swift-proxy-server >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y -q --no-install-recommends swift-proxy swift-account swift-container swift-object memcached >/dev/null 2>&1 || \
		  { apt-get update -q >/dev/null 2>&1 && \
		    apt-get install -y -q --no-install-recommends swift-proxy swift-account swift-container swift-object memcached >/dev/null; }; }; }
	ORBITMQ_TEST_SWIFT=1 $(PY) -m pytest -p no:cacheprovider -q -rs tests/store/tier/test_s3_backend.py tests/store/tier/test_s3_tls.py \
		tests/integration/test_tier_acceptance.py tests/compat/test_tier_cold.py tests/spark/test_tier_cold.py -k 's3 or real_s3'

vendor: ## refresh the console's vendored htmx and uPlot (npm pack; see its static/VENDOR.md)
	cd $$(mktemp -d) && npm pack -q htmx.org@2.0.8 htmx-ext-sse@2.2.4 uplot@1.6.32 && \
		for f in *.tgz; do tar xzf $$f; cp package/dist/htmx.min.js package/dist/sse.min.js package/dist/uPlot.iife.min.js package/dist/uPlot.min.css $(CURDIR)/src/orbitmq/console/static/ 2>/dev/null; rm -rf package; done
native: $(STAMP) ## rebuild the optional C extensions orbitmq._native and orbitmq._kafka_native in place (after editing a .c)
	$(PY) setup.py -q build_ext --inplace

test-crash: $(STAMP) ## only the crash tests (ORBITMQ_CRASH_ITERATIONS=N for longer runs)
	$(PY) -m pytest -m crash

test-chaos: $(STAMP) ## long fault runs: store I/O faults x300, HA faults (master kills...) x100 (ORBITMQ_CHAOS_ITERATIONS=N for both)
	ORBITMQ_CHAOS_ITERATIONS=$${ORBITMQ_CHAOS_ITERATIONS:-300} $(PY) -m pytest -m chaos tests/chaos/test_eio_chaos.py
	ORBITMQ_CHAOS_ITERATIONS=$${ORBITMQ_CHAOS_ITERATIONS:-100} $(PY) -m pytest -m chaos -s tests/chaos tests/spark/test_ha_sink_failover.py --ignore=tests/chaos/test_eio_chaos.py

PAHO_TESTING ?= .cache/paho.mqtt.testing
PAHO_TESTING_COMMIT := 9d7bb80bb8b9d9cfc0b52f8cb4c1916401281103

test-mqtt-interop: $(STAMP) ## Eclipse Paho MQTT 3.1.1 + 5.0 interoperability suites (needs port 1883 free; PAHO_TESTING=checkout)
	test -d $(PAHO_TESTING) || { git clone -q https://github.com/eclipse/paho.mqtt.testing $(PAHO_TESTING) && git -C $(PAHO_TESTING) checkout -q $(PAHO_TESTING_COMMIT); }
	$(PY) tests/compat/mqtt/paho_interop.py $(PAHO_TESTING)

LIBRDKAFKA ?= .cache/librdkafka
LIBRDKAFKA_REF ?= v2.16.0

test-kafka-suite: $(STAMP) ## librdkafka's own tests (brief K10 list) against an `orbitmq up` Kafka listener (LIBRDKAFKA=checkout; builds it: C toolchain, zlib; RDK_TESTS="0001 0002" for some)
	test -d $(LIBRDKAFKA) || git clone -q --depth 1 --branch $(LIBRDKAFKA_REF) https://github.com/confluentinc/librdkafka $(LIBRDKAFKA)
	$(PY) tests/compat/kafka/librdkafka_suite.py $(LIBRDKAFKA) $(RDK_TESTS)

# The side-by-side harness (NATS, RabbitMQ, Redis, Mosquitto and OrbitMQ in one run) lives beside
# the checkout and is read-only for the project; PEERS=path/to/peers points elsewhere.
PEERS ?= ../shared/bench/peers

bench: $(STAMP) ## peer comparison: installs the peer brokers (Debian packages) and runs every figure of RESULTS.md (not part of make test)
	test -f $(PEERS)/run_all.sh || { echo "no peer harness at $(PEERS); set PEERS=" >&2; exit 2; }
	bash $(PEERS)/setup.sh
	bash $(PEERS)/run_all.sh

bench-store: $(STAMP) ## storage benchmark
	$(PY) -m orbitmq.bench store

FUZZ_TARGETS := frame header record send_body sql92 grpc_message toml_config mqtt ha kafka
FUZZ_TIMEOUT ?= 5
FUZZ_RSS_MB ?= 2048
FUZZ_NICE ?=
fuzz: $(STAMP) ## atheris on every decoder, ORBITMQ_FUZZ_RUNS inputs each (default 1,000,000), timed table
	$(FUZZ_NICE) $(PY) -m tests.fuzz.campaign --runs $${ORBITMQ_FUZZ_RUNS:-1000000} \
		--timeout $(FUZZ_TIMEOUT) --rss-mb $(FUZZ_RSS_MB) --logs fuzz-logs \
		--report fuzz-logs/summary.md $(FUZZ_TARGETS)

proto: $(STAMP) ## regenerate the gRPC proxy's protobuf modules (orbitmq/proxy/grpc_v2)
	$(PY) -m orbitmq.proxy.grpc_v2.generate

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

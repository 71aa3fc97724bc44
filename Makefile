# Muster: `make run` to start it, `make test` to test it. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-containers test-dstack test-serving demo lint bench bench-peer chaos fuzz clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# the address `make run` serves on: `make run BIND=0.0.0.0:8000` serves other machines too
BIND ?= 127.0.0.1:8000

run: $(STAMP)
	$(BIN)/muster serve --bind $(BIND)

# The suite runs in TEST_WORKERS processes (pytest-xdist). Most of a test's time is spent waiting
# on real processes (workers, sshd hosts, runners), so 3 on 2 CPUs is faster than 2 (5.4 against
# 6.9 minutes; 4 gains nothing more). Each process has its own test database (pytest-django adds
# the worker's name), Celery queue and namespaces (both named after its pid).
# The container tests (marker `docker`: a dockerd per test host, a local registry, images built
# by the tests) share one set of Docker hosts, so they run in one process and have their own target.
# .ci/run runs both.
TEST_WORKERS ?= 3

test: $(STAMP)
	$(BIN)/pytest -q -m "not docker and not dstack_cli and not smg" -n $(TEST_WORKERS) --durations=10

test-containers: $(STAMP)
	$(BIN)/pytest -q -m docker --durations=5

# The stock dstack CLI (0.22.5 from PyPI) against Muster's /dstack API (docs/dstack-cli.md). dstack is
# not a Muster dependency: it gets a venv of its own, made once.
DSTACK_VENV := .venv-dstack

$(DSTACK_VENV)/.installed:
	$(PYTHON) -m venv $(DSTACK_VENV)
	$(DSTACK_VENV)/bin/pip install -q dstack==0.22.5
	touch $@

test-dstack: $(STAMP) $(DSTACK_VENV)/.installed
	$(BIN)/pytest -q -m dstack_cli -n 2 --durations=5 tests/dstack_cli

# PD services with the real smg router (tests/serving_pd, marker smg): apart from `make test` so that
# one stays within its time; each test runs a router, workers and a Muster worker of its own
test-serving: $(STAMP)
	$(BIN)/pytest -q -m smg -n 2 --durations=5 tests/serving_pd

demo: $(STAMP)
	$(BIN)/python -m muster.demo

lint: $(STAMP)
	$(BIN)/ruff check .

# the bench extra (locust, the submit scenario's load generator) is installed here only: `make test`
# does not need it
bench: $(STAMP)
	test -x $(BIN)/locust || $(BIN)/pip install -q -e '.[dev,bench]'
	$(BIN)/python -m bench.run

# Muster and dstack side by side (bench/peer/README.md): dstack's server (with its server extra, which
# test-dstack's client-only venv lacks) in a venv of its own, made once; not a Muster dependency
PEER_VENV := .venv-peer
# sentry-sdk < 3: dstack 0.22.5's server opens a sentry_sdk.start_transaction around every pipeline
# fetch, which sentry-sdk 3 removed; with 3.x every fetch fails and no dstack run ever moves. A
# .venv-peer made before this pin: rm -rf .venv-peer

$(PEER_VENV)/.installed:
	$(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install -q "dstack[server]==0.22.5" "sentry-sdk<3"
	touch $@

bench-peer: $(STAMP) $(PEER_VENV)/.installed
	$(BIN)/python -m bench.peer.run

chaos: $(STAMP)
	$(BIN)/python -m bench.chaos

clean:
	rm -rf $(VENV) $(DSTACK_VENV) $(PEER_VENV) .muster-data

fuzz: $(STAMP)
	$(BIN)/python scripts/fuzz.py

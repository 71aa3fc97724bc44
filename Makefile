# Muster: `make run` to start it, `make test` to test it. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-containers demo lint bench chaos fuzz clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/muster serve

# The container tests (marker `docker`: a dockerd per test host, a local registry, images built
# by the tests) take a few minutes of their own; they have their own target so that `make test`
# stays near 10 minutes on 2 CPUs. .ci/run runs both.
test: $(STAMP)
	$(BIN)/pytest -q -m "not docker" --durations=10

test-containers: $(STAMP)
	$(BIN)/pytest -q -m docker --durations=5

demo: $(STAMP)
	$(BIN)/python -m muster.demo

lint: $(STAMP)
	$(BIN)/ruff check .

# the bench extra (locust, the submit scenario's load generator) is installed here only: `make test`
# does not need it
bench: $(STAMP)
	test -x $(BIN)/locust || $(BIN)/pip install -q -e '.[dev,bench]'
	$(BIN)/python -m bench.run

chaos: $(STAMP)
	$(BIN)/python -m bench.chaos

clean:
	rm -rf $(VENV) .muster-data

fuzz: $(STAMP)
	$(BIN)/python scripts/fuzz.py

# Muster: `make run` to start it, `make test` to test it. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test demo lint bench chaos fuzz clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/muster serve

test: $(STAMP)
	$(BIN)/pytest -q

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

# Two commands on a fresh machine:  `make conformance` (the main job)  and  `make test` (the test suite).
# Both build .venv on first use: torch pinned to the CPU build (constraints/test.txt), then this project.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.installed
REPORTS ?= reports

.PHONY: venv conformance demo test lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints/test.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints/test.txt torch
	$(PIP) install -q -c constraints/test.txt -e '.[dev]'
	touch $(STAMP)

## The main job: the conformance suite on every reference cooker and TaskEncoder (nox -s conformance),
## on data it generates; report in reports/conformance/. ARGS are passed on: make conformance ARGS="--cooker m:f"
conformance: $(STAMP)
	$(BIN)/nox -s conformance -- $(ARGS)

## End-to-end demo of the reference data path on generated data.
demo: $(STAMP)
	$(BIN)/python examples/demo.py $(ARGS)

## The test suite, in parallel, with a junit report in $(REPORTS)/.
## pytest exits 5 when it collects no tests; that is not a failure of the code under test.
## The tests start a few hundred Python processes (pytest runs, workers, ranks). Where the environment sets
## PYTHONDONTWRITEBYTECODE, each of them would compile this project and assertion-rewrite hypothesis afresh
## (about 2 s a pytest process); their bytecode goes to $(PYCACHE) instead, never into the source tree.
PYCACHE := $(abspath $(VENV))/pycache
test: $(STAMP)
	@mkdir -p $(REPORTS)
	@PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(PYCACHE) \
	  $(BIN)/python -m pytest -n auto --junitxml=$(REPORTS)/junit.xml; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests (exit 5)"; exit 0; fi; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .nox $(REPORTS) .pytest_cache .hypothesis

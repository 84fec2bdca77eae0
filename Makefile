# Two commands on a fresh machine:  `make demo` (the main job)  and  `make test` (the test suite).
# Both build .venv on first use: torch pinned to the CPU build (constraints/test.txt), then this project.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.installed
REPORTS ?= reports

.PHONY: venv demo test lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints/test.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints/test.txt torch
	$(PIP) install -q -c constraints/test.txt -e '.[dev]'
	touch $(STAMP)

## The main job: an end-to-end run on an embedded default dataset.
demo: $(STAMP)
	$(BIN)/primus-energon demo

## The test suite, in parallel, with a junit report in $(REPORTS)/.
## pytest exits 5 when it collects no tests; that is not a failure of the code under test.
test: $(STAMP)
	@mkdir -p $(REPORTS)
	@$(BIN)/python -m pytest -n auto --junitxml=$(REPORTS)/junit.xml; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests (exit 5)"; exit 0; fi; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .nox $(REPORTS) .pytest_cache .hypothesis

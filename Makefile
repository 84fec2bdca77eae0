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
## It runs in .venv itself (nox --no-venv --no-install): torch is installed once, not again under .nox/.
conformance: $(STAMP)
	$(BIN)/nox --no-venv --no-install -s conformance -- $(ARGS)

## End-to-end demo of the reference data path on generated data.
demo: $(STAMP)
	$(BIN)/python examples/demo.py $(ARGS)

## The test suite, in parallel, with a junit report in $(REPORTS)/, in two tiers (the `slow` marker):
##   make test             the fast tier: every test not marked slow (a few minutes on 2 cores)
##   make test TIER=full   both tiers: what CI runs (.ci/run)
##   make test TIER=slow   the slow tier alone: whole conformance runs in fresh processes, torchrun ranks,
##                         the wheel build, and the checks that wait out a hang or a spin limit
## pytest exits 5 when it collects no tests; that is not a failure of the code under test.
## The tests start a few hundred Python processes (pytest runs, workers, ranks). Where the environment sets
## PYTHONDONTWRITEBYTECODE, each of them would compile this project and assertion-rewrite hypothesis afresh
## (about 2 s a pytest process); their bytecode goes to $(PYCACHE) instead, never into the source tree.
TIER ?= fast
ifeq ($(TIER),fast)
TIER_MARKS := -m "not slow"
else ifeq ($(TIER),slow)
TIER_MARKS := -m slow
else ifeq ($(TIER),full)
TIER_MARKS :=
else
$(error TIER=$(TIER): use fast (the default), slow or full)
endif
PYCACHE := $(abspath $(VENV))/pycache
test: $(STAMP)
	@mkdir -p $(REPORTS)
	@echo "make test: the $(TIER) tier"
	@PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(PYCACHE) \
	  $(BIN)/python -m pytest -n auto $(TIER_MARKS) --junitxml=$(REPORTS)/junit.xml; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests (exit 5)"; exit 0; fi; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .nox $(REPORTS) .pytest_cache .hypothesis

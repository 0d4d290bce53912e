# fedgp: `make demo` and `make test` set up their own environment (.venv, CPU torch pinned by
# constraints.txt) and need nothing installed but Python 3.11.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Real data sit beside the checkout on CI and dev machines; the package never hard-codes it.
SHARED_DATA := $(abspath ../shared/datasets)
ifneq ($(wildcard $(SHARED_DATA)),)
export FEDGP_DATA ?= $(SHARED_DATA)
endif

export MPLBACKEND ?= Agg

.PHONY: demo test test-random lint docs install clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fedgp demo --out results/demo

# Test files run on TEST_WORKERS processes (pytest-xdist), a file's tests in one process (its
# fixtures, its Ray or Flower processes); on 2 cores the suite takes about half the time of one.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The documentation site into site/ (MkDocs; warnings are errors; tests/test_docs.py builds it too).
# The property-based tests alone, randomised, 1,000 examples each unless a test sets its own count:
# run it once per change (make test repeats the same derandomised examples).
test-random: $(STAMP)
	FEDGP_HYPOTHESIS=random $(BIN)/python -m pytest -q $$(grep -rl "from hypothesis" tests)

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check fedgp tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site .cache

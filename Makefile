# Everything runs from a virtual environment in .venv that `make install` creates (idempotent: it
# reinstalls only when pyproject.toml changes). Set PYTHON to choose the interpreter (3.11+).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CONFIG ?=
PYTEST_ARGS ?=
# Test worker processes (pytest-xdist) for `make test`, `make test-slow` and `make chaos`; 0: all in this process.
TEST_WORKERS ?= 2

.PHONY: install run test test-slow proto bench lint chaos clean

install: $(STAMP)

# A $(VENV) of another interpreter than 3.11+ (one `python3 -m venv` made on an older system) is made again:
# reused, pip fetched torch's multi-GB CUDA wheel for it, then refused the package, and PYTHON= could not help.
$(STAMP): pyproject.toml
	@if ! $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then \
	  $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { \
	    echo "make: PYTHON=$(PYTHON) is not a Python 3.11+ interpreter, which this project needs: give PYTHON=python3.11" >&2; exit 1; }; \
	  if [ -e '$(VENV)' ]; then \
	    [ -f '$(VENV)/pyvenv.cfg' ] || { echo "make: $(VENV) exists and is no virtual environment: give another VENV=, or remove it" >&2; exit 1; }; \
	    echo "make: $(VENV) is not a Python 3.11+ environment; making it again with $(PYTHON)"; rm -rf '$(VENV)'; fi; \
	  $(PYTHON) -m venv $(VENV); \
	fi
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

run: install
	$(VENV)/bin/league run $(CONFIG)

test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

test-slow: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m slow $(PYTEST_ARGS)

proto: install
	$(PY) tools/gen_proto.py

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) bench/run_all.py

# The chaos suite: every scenario in tests/chaos, the long (slow) versions included. `make test` runs the
# short versions.
chaos: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m '' tests/chaos $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

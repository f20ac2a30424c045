# Two commands do all the set-up on a fresh Debian/Ubuntu machine: `make up` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test up lint typecheck pytest system-deps clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "firsthop needs Python >= 3.11 (found %s)" % sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

# Tools the tests run for real: redis-server (and, once the e2e tests land, chromium).
system-deps:
	@./scripts/ensure-system-deps

lint: $(STAMP)
	$(BIN)/ruff check shared services tests
	$(BIN)/ruff format --check shared services tests

typecheck: $(STAMP)
	$(BIN)/mypy shared services

pytest: $(STAMP) system-deps
	$(BIN)/pytest

test: lint typecheck pytest

# Runs the local stack. The services land one issue at a time; this runs what exists.
up: $(STAMP) system-deps
	@if $(BIN)/firsthop --help | grep -q '^    up '; then exec $(BIN)/firsthop up; \
	else echo "firsthop has no runnable service yet (see 'firsthop --help'): nothing to run"; exit 1; fi

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

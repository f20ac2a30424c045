# Two commands do all the set-up on a fresh Debian/Ubuntu machine: `make up` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test up lint typecheck pytest system-deps clean lock

$(STAMP): pyproject.toml constraints.txt setup.py services/relay/_fastpath.c shared/_speedups.c $(wildcard services/transceiver/media/rnnoise/*.c services/transceiver/media/rnnoise/src/*.[ch] services/transceiver/media/rnnoise/src/x86/*.[ch])
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "firsthop needs Python >= 3.11 (found %s)" % sys.version.split()[0])'
	@PYTHON=$(PYTHON) ./scripts/ensure-system-deps gcc python-headers  # the C parts (setup.py)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,assistant,noise]'
	@touch $(STAMP)

# Tools the tests run for real: redis-server, gcc, chromium, espeak-ng (the assistant's voice
# fallback and the tests' speaker), GStreamer's webrtcbin (interop), nftables, iproute2 and
# conntrack (network-namespace tests).
system-deps:
	@./scripts/ensure-system-deps

# constraints.txt again from the venv (after a dependency in pyproject.toml changed): every
# package the image installs, at the version the tests ran (scripts/lock_dependencies.py).
lock: $(STAMP)
	$(BIN)/python scripts/lock_dependencies.py

lint: $(STAMP)
	$(BIN)/ruff check shared services tests examples scripts
	$(BIN)/ruff format --check shared services tests examples scripts

typecheck: $(STAMP)
	$(BIN)/mypy -p firsthop
	$(BIN)/mypy tests examples

# Most tests wait on real time (audio, timers, other processes), so two run at once, a test
# file per process (its module fixtures start once); those marked `serial` measure CPU or
# timing side by side and run alone after them. Both parts run; either failing fails.
# `.venv/bin/pytest` alone still runs everything, one test at a time.
PYTEST_WORKERS ?= 2
pytest: $(STAMP) system-deps
	status=0; \
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not serial" || status=$$?; \
	$(BIN)/pytest -p no:xdist -m serial || status=$$?; \
	exit $$status

test: lint typecheck pytest

# Runs the local stack on loopback (what exists so far; see `firsthop up --help`).
up: $(STAMP)
	@./scripts/ensure-system-deps redis-server || echo "(no redis-server: firsthop up runs in memory)"
	@./scripts/ensure-system-deps espeak-ng || echo "(no espeak-ng: the assistant needs piper)"
	$(BIN)/firsthop up

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

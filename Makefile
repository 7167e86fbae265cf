# Two commands for a new user (see README.md):
#   make demo   start the whole product on embedded defaults (no root, no services)
#   make test   install what the tests need, then import-linter, pytest over tests/ on the
#               simulated cluster, and the real control-plane tier (tests/realcluster)
# `make test-real` runs the real tier alone: build (cached) the upstream control plane, then
# tests/realcluster on it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-real install system-deps lint screenshots bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/python scripts/start_demo.py

# docs/screenshots/: the panel's five pages at 1366x768, from a throwaway cluster, Prometheus
# and database that the browser test starts (needs Chromium and Prometheus: `make system-deps`).
screenshots: install
	$(BIN)/python scripts/screenshots.py

system-deps:
	@sh scripts/install_system_deps.sh

lint: install
	$(BIN)/lint-imports

test: install system-deps lint
	$(BIN)/python -m pytest tests
	$(MAKE) --no-print-directory test-real

# Needs Go, the Go module proxy and root (a private network namespace); the first build
# takes minutes, later ones seconds (see README, "Real control plane").
test-real: install
	$(BIN)/python -m realcluster build --with knative --with kserve
	$(BIN)/python -m pytest tests/realcluster

# Every benchmark, one after the other (see README, "Tests and benchmarks"; simcluster_list
# and binpack_plan run at 1x and 5x their size, 5 runs each). Not tests: they print
# figures. system-deps brings kubectl, PostgreSQL (orgs_sweep starts a private server
# when none answers) and Prometheus/promtool (the prune bench).
BENCHES = simcluster_list orgs_activity orgs_sweep defrag_calls prune_pass binpack_plan dashboard_render
bench: install system-deps
	@set -e; for b in $(BENCHES); do echo "== bench/$$b.py"; $(BIN)/python bench/$$b.py; done

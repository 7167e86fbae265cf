# Two commands for a new user (see README.md):
#   make demo   start the whole product on embedded defaults (no root, no services)
#   make test   install what the tests need, then import-linter and pytest over tests/
# and, not yet part of `make test`:
#   make test-real  build (cached) the upstream control plane, run tests/realcluster on it
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-real install system-deps lint

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/python scripts/start_demo.py

system-deps:
	@sh scripts/install_system_deps.sh

lint: install
	$(BIN)/lint-imports

test: install system-deps lint
	$(BIN)/python -m pytest tests

# Needs Go, the Go module proxy and root (a private network namespace); the first build
# takes minutes, later ones seconds (see README, "Real control plane").
test-real: install
	$(BIN)/python -m realcluster build --with knative
	$(BIN)/python -m pytest tests/realcluster

# Two commands for a new user (see README.md):
#   make demo   start the whole product on embedded defaults (no root, no services)
#   make test   install what the tests need, then import-linter and pytest over tests/
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test install system-deps lint

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

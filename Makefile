# Two commands for a new user (see README.md):
#   make demo   start the whole product on embedded defaults (no root, no services)
#   make test   install what the tests need, then import-linter, pytest over tests/ on the
#               simulated cluster (in PYTEST_WORKERS parallel processes, the 25 slowest tests
#               printed), and the real control-plane tier (tests/realcluster); each phase timed
# `make test-real` runs the real tier alone: build (cached) the upstream control plane, then
# tests/realcluster on it.
# `make image` builds the product's image with podman (skipped when its build context is
# unchanged); `make test-image` builds it, then runs tests/image on it. `make lock` renews
# the locked dependencies (uv.lock and its hashed exports in requirements/).
PYTHON ?= python3
# pytest-xdist processes. The suite mostly waits (on servers, subprocesses, the simulated
# clock's controllers), so more processes than the 2 cores pay off; each process has its
# own test database and Redis database. `make test PYTEST_WORKERS=0` runs in one process.
PYTEST_WORKERS ?= 4
# loadgroup: a module whose tests share one costly module fixture (the demo) stays on one
# process (xdist_group marks); every other test goes to whichever process is free.
PYTEST_PARALLEL = -n $(PYTEST_WORKERS) --dist loadgroup --durations=25
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-real install system-deps lint screenshots bench coverage image test-image lock

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Exactly the locked files (every one checked against its hash), then the project itself.
$(STAMP): pyproject.toml requirements/test.txt | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --require-hashes -r requirements/test.txt
	$(BIN)/pip install --quiet --no-deps -e .
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

# The real tier and the image are built first (cached: seconds when nothing they are made
# from changed), then one parallel run takes every test, theirs included (--all-tiers).
test:
	@sh scripts/timed.sh install $(MAKE) --no-print-directory install system-deps
	@sh scripts/timed.sh lint $(MAKE) --no-print-directory lint
	@sh scripts/timed.sh build-real-tier $(BIN)/python -m realcluster build --with knative --with kserve
	@sh scripts/timed.sh build-image $(MAKE) --no-print-directory image
	@sh scripts/timed.sh pytest $(BIN)/python -m pytest tests --all-tiers $(PYTEST_PARALLEL)

# Needs Go, the Go module proxy and root (a private network namespace); the first build
# takes minutes, later ones seconds (see README, "Real control plane").
test-real: install
	$(BIN)/python -m realcluster build --with knative --with kserve
	$(BIN)/python -m pytest tests/realcluster --durations=10

# Line and branch coverage of the product over the same suite (subprocesses included:
# workers, CLIs); the report's TOTAL line is the figure to compare before and after a change.
coverage: install system-deps
	rm -f .coverage .coverage.*
	$(BIN)/coverage run -m pytest tests $(PYTEST_PARALLEL)
	$(BIN)/coverage combine -q
	$(BIN)/coverage report --skip-covered --sort=cover | tail -n 40

# Renews the lock: the newest versions pyproject.toml allows (`make lock LOCK_ARGS=` keeps
# the current pins and only adds or drops what pyproject.toml changed), then the hashed
# requirements files that pip reads: runtime.txt for the image, test.txt for `make install`.
LOCK_ARGS ?= --upgrade
lock: install
	$(BIN)/uv lock $(LOCK_ARGS)
	$(BIN)/uv export --quiet --frozen --no-emit-project --no-dev --format requirements-txt -o requirements/runtime.txt
	$(BIN)/uv export --quiet --frozen --no-emit-project --no-dev --extra test --format requirements-txt -o requirements/test.txt

# Needs root and podman (system-deps); see deploy/README.md, "The image".
image: system-deps
	$(PYTHON) scripts/image.py build

test-image: install image
	$(BIN)/python -m pytest tests/image --durations=10

# Every benchmark, one after the other (see README, "Tests and benchmarks"; simcluster_list
# and binpack_plan run at 1x and 5x their size, 5 runs each). Not tests: they print
# figures. system-deps brings kubectl, PostgreSQL (orgs_sweep starts a private server
# when none answers) and Prometheus/promtool (the prune bench).
BENCHES = simcluster_list orgs_activity orgs_sweep defrag_calls prune_pass binpack_plan dashboard_render campaign
bench: install system-deps
	@set -e; for b in $(BENCHES); do echo "== bench/$$b.py"; $(BIN)/python bench/$$b.py; done

# One command per job (see README). Every target that needs the project installs it first.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: bootstrap bootstrap-test setup stack stack-down test lint check demo bench compare model

# System packages (deploy/bootstrap.sh holds the one list); silent when nothing is missing.
bootstrap:
	deploy/bootstrap.sh

bootstrap-test:
	deploy/bootstrap.sh --test

setup: bootstrap $(VENV)/.installed

# Re-install only when the dependency list changed (the install is editable).
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[dev]"
	touch $@

stack: setup
	$(BIN)/metasrv stack up

stack-down: setup
	$(BIN)/metasrv stack down

test: bootstrap-test setup stack
	$(BIN)/pytest $(PYTEST_ARGS)

# Both linters run even when the first fails, so one run shows every problem.
lint: setup
	rc=0; $(BIN)/ruff check . || rc=1; $(BIN)/mypy || rc=1; exit $$rc

# The inner loop: lint, and every test that needs no service (tests/conftest.py marks the
# others `services`), with no stack started. Lint runs beside the tests; its output follows.
# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set: compiling every module and
# rewriting every test's asserts again would double the run.
check: setup
	@log=$$(mktemp); \
	{ rc=0; $(BIN)/ruff check . || rc=1; $(BIN)/mypy || rc=1; exit $$rc; } >$$log 2>&1 & lint=$$!; \
	rc=0; env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -q -m "not services" $(PYTEST_ARGS) || rc=1; \
	wait $$lint || rc=1; cat $$log; rm -f $$log; exit $$rc

# The protocol model at its larger bounds (minutes; `make test` runs the small ones).
model: setup
	$(BIN)/pytest --run-slow -m slow -p no:cacheprovider tests/procedures/wal_purge/test_protocol_model.py

demo: setup stack
	$(BIN)/metasrv demo

bench: setup stack
	@found=0; for script in benchmarks/*.py; do \
		[ -f "$$script" ] || continue; \
		case "$$(basename "$$script")" in _*|compare.py) continue;; esac; \
		found=1; echo "== $$script"; $(BIN)/python "$$script" || exit $$?; \
	done; [ $$found = 1 ] || echo "no benchmarks/*.py yet"

# One figure at an older commit and at the working tree, side by side (benchmarks/compare.py):
#   make compare FIGURE="benchmarks/purge_cycle.py --topics 1024 --runs 3" [BASE=8cab7e3] [RUNS=1]
BASE ?= 8cab7e3
RUNS ?= 1
compare: setup stack
	@test -n "$(FIGURE)" || { echo 'FIGURE="benchmarks/<script>.py ARGS" or FIGURE="pytest tests/faults"'; exit 2; }
	$(BIN)/python benchmarks/compare.py --base $(BASE) --runs $(RUNS) -- $(FIGURE)

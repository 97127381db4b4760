# One command per job (see README). Every target that needs the project installs it first.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: bootstrap bootstrap-test setup stack stack-down test lint demo bench

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

demo: setup stack
	$(BIN)/metasrv demo

bench: setup stack
	@found=0; for script in benchmarks/*.py; do \
		[ -f "$$script" ] || continue; \
		case "$$(basename "$$script")" in _*) continue;; esac; \
		found=1; echo "== $$script"; $(BIN)/python "$$script" || exit $$?; \
	done; [ $$found = 1 ] || echo "no benchmarks/*.py yet"

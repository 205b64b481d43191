# Two entry points (see README): `make run` and `make test`.
# Each creates .venv and installs what it needs; re-running is cheap (idempotent).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# pytest-xdist workers for `make test`: most tests wait on real I/O (daemons, brokers,
# subprocesses), so workers overlap those waits; on 2 cores three do it better than two
# (docs/performance.md, "The test suite"). Tests sharing a module/session fixture or the
# Spark session stay on one worker (tests/conftest.py). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 3
# The protocol core (and the simulator's per-datagram modules) compiled with mypyc into
# build/native/ (dodwan/native: used only while it matches the sources; DODWAN_NATIVE=0 runs
# pure Python). NATIVE=0 skips building it.
NATIVE ?= 1
NATIVE_STAMP := build/native/manifest.json
SIM_COMPILED := sim/medium.py sim/host.py sim/logs.py
ifeq ($(NATIVE),1)
CORE_BUILD := $(NATIVE_STAMP)
endif

.PHONY: setup run demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

$(NATIVE_STAMP): $(STAMP) $(wildcard dodwan/core/*.py) $(wildcard dodwan/native/*.py) $(SIM_COMPILED)
	$(BIN)/python -m dodwan.native build

setup: $(STAMP) $(CORE_BUILD)

# The main job: simulate the islands scenario with the real protocol on every host, then
# analyse its logs with Spark (local mode); prints the summary table and the report's path.
run: $(STAMP) $(CORE_BUILD)
	$(BIN)/dodwan-sim run scenarios/islands.toml --out out/islands
	$(BIN)/dodwan-sim analyze out/islands --out out/report

demo: $(STAMP)
	$(BIN)/python -m dodwan.demo

# The suite runs on the compiled core (when built), then the core's own tests again on the
# pure Python core.
test: $(STAMP) $(CORE_BUILD)
	$(BIN)/ruff check .
	$(BIN)/mypy dodwan/core $(SIM_COMPILED)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup
	DODWAN_NATIVE=0 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) -p no:cacheprovider tests/test_core_*.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy dodwan/core $(SIM_COMPILED)

clean:
	rm -rf $(VENV) build/native

# Two commands do everything on a fresh machine (Debian, Python 3.11):
#   make run    install if needed, then start one broker on 127.0.0.1:9092 (data in ./data)
#   make test   install everything the tests need (python3-venv if missing, Python deps with
#               PySpark, Debian's kcat, a Java runtime and ZooKeeper), run the suite

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test test-fast install install-test peers bench check clean

$(BIN)/python:
	@PYTHON=$(PYTHON) scripts/install-peers.sh venv
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# On every editable install of a mapped layout (setup.py) setuptools notes that a folder
# named like the package may shadow it: `tierbroker/` is the package's own, and imports
# from the checkout reach the layers through setuptools' hook, so the note is muted.
PIP_INSTALL := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet

$(VENV)/.installed: pyproject.toml setup.py | $(BIN)/python
	$(PIP_INSTALL) -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml setup.py | $(BIN)/python
	$(PIP_INSTALL) -e '.[test]'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test peers

peers:
	@scripts/install-peers.sh

run: install
	$(BIN)/tierbroker serve --config config/server.properties

# Three workers on two cores: most of a test's time is spent waiting on brokers, clients
# and JVMs. A module stays on one worker (loadfile), so its fixtures are made once. The
# plugin's acceptance suite (tests/plugin) runs in the same session, beside the others.
test: install-test
	$(BIN)/pytest -n 4 --dist loadfile -m "not alone" --durations=25 tests tests/plugin
	$(BIN)/pytest -m alone

# The inner loop: everything but the tests marked slow (Spark, packaging, leaders killed
# mid-copy, 10,000 partitions, ...) and those run alone. CI runs `make test`.
test-fast: install-test
	$(BIN)/pytest -n 3 --dist loadfile -m "not slow and not alone"

# mypy and import-linter check the package as installed (see scripts/installed-layout.sh).
check: install-test
	$(BIN)/ruff check protocol storage rlm broker pipeline testing tests benchmarks setup.py
	scripts/installed-layout.sh build/installed
	cd build/installed && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml --cache-dir $(CURDIR)/.mypy_cache
	cd build/installed && $(CURDIR)/$(BIN)/lint-imports --config $(CURDIR)/pyproject.toml

bench: install-test
	$(BIN)/python -m benchmarks.throughput
	$(BIN)/python -m benchmarks.versus_kafka
	$(BIN)/python -m benchmarks.groups
	$(BIN)/python -m benchmarks.tiering --mib 512
	$(BIN)/python -m benchmarks.tiering_vs_kafka
	$(BIN)/python -m benchmarks.s3_copy
	$(BIN)/python -m benchmarks.remote_log_size
	$(BIN)/python -m benchmarks.record_validation
	$(BIN)/python -m benchmarks.metadata_snapshot
	$(BIN)/python -m benchmarks.partitions
	$(BIN)/python -m benchmarks.pipeline
	$(BIN)/python -m benchmarks.startup
	$(BIN)/python -m benchmarks.replication
	$(BIN)/python -m benchmarks.failover
	$(BIN)/python -m benchmarks.follower_fetching
	$(BIN)/python -m benchmarks.log_cleaner
	$(BIN)/python -m benchmarks.fixtures
	$(BIN)/python -m benchmarks.sasl_connections

clean:
	rm -rf $(VENV) data

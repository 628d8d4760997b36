# Two entry points for a fresh machine: `make example` and `make test`.
# Both create .venv from this project's own pyproject.toml on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
EXAMPLE := example

.PHONY: example test test-fast test-spark-versions wheel clean

$(BIN)/keyfill: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

example: $(BIN)/keyfill
	$(BIN)/keyfill generate --out $(EXAMPLE)/source --partitions 4 --keys 2000 --records 200000 \
		--chunk-records 20000 --skew 1.1 --null-keys 0.01 --headers --seed 7 --overwrite \
		--logins $(EXAMPLE)/logins-source --logins-after 1m
	$(BIN)/keyfill inspect $(EXAMPLE)/source --top 5 --no-progress
	$(BIN)/keyfill plan $(EXAMPLE)/source $(EXAMPLE)/compacted --groups 16 --slice-duration 30s --overwrite
	$(BIN)/keyfill compact $(EXAMPLE)/source $(EXAMPLE)/compacted --groups 16 --slice-duration 30s --overwrite
	$(BIN)/keyfill verify $(EXAMPLE)/source $(EXAMPLE)/compacted --no-progress
	$(BIN)/keyfill replay $(EXAMPLE)/compacted --threads 4 --no-progress
	$(BIN)/keyfill report $(EXAMPLE)/compacted --out $(EXAMPLE)/report.html --replay-seconds 10
	$(BIN)/keyfill handoff $(EXAMPLE)/compacted --format csv
	SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON=$(abspath $(BIN))/python $(BIN)/spark-submit --master 'local[*]' \
		--conf spark.log.level=WARN --conf spark.sql.shuffle.partitions=4 \
		jobs/fraud_backfill.py $(EXAMPLE)/compacted --out $(EXAMPLE)/fraud --overwrite
	$(BIN)/keyfill compact $(EXAMPLE)/logins-source $(EXAMPLE)/logins-compacted --groups 4 --slice-duration 10s --overwrite
	SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON=$(abspath $(BIN))/python $(BIN)/spark-submit --master 'local[*]' \
		--conf spark.log.level=WARN --conf spark.sql.shuffle.partitions=4 \
		jobs/fraud_join.py $(EXAMPLE)/compacted $(EXAMPLE)/logins-compacted --out $(EXAMPLE)/fraud-join \
		--stride "1 minute" --within "30 seconds" --overwrite

# Azurite, Microsoft's Azure Storage emulator, for the tests over az:// (package-lock.json pins it).
node_modules/.bin/azurite-blob: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

test: $(BIN)/keyfill node_modules/.bin/azurite-blob
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -n 2 --dist loadgroup

# The fast loop while working (CONTRIBUTING.md): every test that needs no JVM and no server
# (markers: pyproject.toml), about 2 minutes on two cores. A test it runs that starts a server
# fails naming the mark it lacks; JAVA_HOME points nowhere, so one that starts Spark fails too.
test-fast: $(BIN)/keyfill
	$(BIN)/ruff check .
	KEYFILL_TESTS_FAST=1 JAVA_HOME=/nonexistent $(BIN)/python -m pytest -n 2 -q \
		-m "not (spark or connect or stores or kafka or slow)" --durations=10

# The Spark version matrix: an environment per supported PySpark minor version (3.5 to 4.3) in
# .venv-spark/, keyfill's wheel installed there without extras, each running tests/spark_versions
# (the compaction, verify, the source in batch and streaming, the fraud job, Spark Connect), then
# every version's archive compared; KEYFILL_SPARK_VERSIONS="4.0 4.1" runs some only.
test-spark-versions:
	PYTHON=$(PYTHON) tests/spark_versions/run

# A wheel that ships its numba kernels compiled (keygroups/_numba_seed.py): a fresh executor
# loads them instead of compiling for 7-17 s. Build it with the Python and numba of the cluster.
wheel: $(BIN)/keyfill
	rm -rf keygroups/_numba_cache build dist
	$(BIN)/python -m keyfill.numba_warm seed
	$(BIN)/pip wheel --quiet --no-deps --wheel-dir dist .
	rm -rf keygroups/_numba_cache
	@ls dist/*.whl

clean:
	rm -rf $(VENV) .venv-spark $(EXAMPLE) keygroups/_numba_cache build dist node_modules

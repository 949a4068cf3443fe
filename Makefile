# Everything runs from a local virtualenv that these targets create and keep up to date.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.otel-llm-installed

.PHONY: demo demo-sim test check typecheck bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml testing/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,gateway]' -e testing
	$(PY) -m otel_llm_testing prepare
	touch $(STAMP)

demo: venv
	$(PY) examples/demo.py

demo-sim: venv
	$(PY) examples/demo_sim.py

test: venv
	$(PY) -m pytest -q -p no:cacheprovider

# the fast part, before every commit: the strict type check and every test that needs no real
# runtime or backend and takes no more than a few seconds (under 3 minutes on 2 cores)
check: typecheck
	$(PY) -m pytest -q -p no:cacheprovider -m "not runtime and not backend and not slow"

typecheck: venv
	$(PY) -m mypy

bench: venv
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) otel-llm-traces.jsonl .pytest_cache

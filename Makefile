# Everything runs from a local virtualenv that these targets create and keep up to date.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.otel-llm-installed

.PHONY: demo demo-sim test check typecheck lint docs docs-serve docs-screenshots bench gpu-deps venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml testing/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,gateway,docs]' -e testing
	$(PY) -m otel_llm_testing prepare
	touch $(STAMP)

demo: venv
	$(PY) examples/demo.py

demo-sim: venv
	$(PY) examples/demo_sim.py

test: venv
	$(PY) -m pytest -q -p no:cacheprovider

# the fast part, before every commit: the strict type check, the linter and every test that needs
# no real runtime or backend and takes no more than a few seconds (under 3 minutes on 2 cores)
check: typecheck lint
	$(PY) -m pytest -q -p no:cacheprovider -m "not runtime and not backend and not slow"

typecheck: venv
	$(PY) -m mypy

# ruff over the whole repository ([tool.ruff] in pyproject.toml)
lint: venv
	$(PY) -m ruff check --no-cache .

# the documentation site (mkdocs.yml, docs/): strict, so a broken link, a missing page or a
# reference that disagrees with otel_llm/semconv.py fails the build
SITE_DIR ?= site
DOCS_ADDR ?= 127.0.0.1:8000
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs

docs: venv
	$(MKDOCS) build --strict --site-dir $(SITE_DIR)

docs-serve: venv
	$(MKDOCS) serve --dev-addr $(DOCS_ADDR)

# the built site's home and reference pages as headless Chromium draws them: $(SITE_DIR)/*.png
CHROMIUM ?= chromium
SHOT := $(CHROMIUM) --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1000

docs-screenshots: docs
	$(SHOT) --screenshot=$(SITE_DIR)/home.png file://$(abspath $(SITE_DIR))/index.html 2>/dev/null
	$(SHOT) --screenshot=$(SITE_DIR)/reference.png file://$(abspath $(SITE_DIR))/reference/index.html 2>/dev/null

bench: venv
	$(PY) benchmarks/overhead.py

# What benchmarks/gpu_check.py needs on a GPU machine beyond that machine's own Python (PyTorch's
# image: torch, transformers, nvidia-ml-py, psutil, httpx, aiohttp, wrapt, prometheus-client and
# typing-extensions are there): the OpenTelemetry API and SDK, pure-Python wheels for Python 3.12,
# into .gpu-deps (about 4 MiB), which the script puts first on its path.
GPU_DEPS := opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2

GPU_DEPS_DIR ?= .gpu-deps

gpu-deps:
	rm -rf $(GPU_DEPS_DIR)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --target $(GPU_DEPS_DIR) --python-version 3.12 \
		--only-binary=:all: --no-deps $(GPU_DEPS)
	du -sh $(GPU_DEPS_DIR)

clean:
	rm -rf $(VENV) otel-llm-traces.jsonl .pytest_cache site .gpu-deps

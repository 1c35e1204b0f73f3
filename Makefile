# `make demo` and `make test` each do all set-up on a fresh machine, then run.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The tested set, pinned. torch==2.13.0 is the CPU wheel: never leave torch unpinned.
PKGS := -c constraints.txt torch==2.13.0 jax==0.10.2 jaxlib==0.10.2 tokamax==0.0.12 \
        transformers==5.25.0 huggingface_hub==2.4.0 kernels==0.19.1 diffusers==0.42.1 accelerate==1.15.0 starlette \
        uvicorn dulwich pydantic pytest pytest-xdist hypothesis ruff mypy rich matplotlib fastapi openai

# Local wheels of what kernel-hub[demo] needs (its dependencies, jax, torch, transformers; pinned by
# constraints.txt): tests/package/test_wheel.py installs the built kernel-hub wheel from here into a fresh venv, offline.
WHEELHOUSE := .wheelhouse
WHEELS := $(WHEELHOUSE)/.complete

# The TPU environment: libtpu (the real TPU compiler, ahead of time on any machine) and TorchTPU, apart from
# .venv because a process with libtpu prints TPU-init errors even for CPU work. jax without its [tpu] extra
# (that pins libtpu 0.0.42.*); torch-tpu 0.2.0 brings libtpu 0.0.52. Everything pinned in constraints-tpu.txt.
# tpu-inference (vLLM's TPU kernels, the cost model's peers) goes in with --no-deps: it pins jax 0.11.2 and vllm;
# its kernels are imported through tpu_cost_model.tpu_inference_peers (a vllm.logger stand-in on that path only).
TPU_VENV := .venv-tpu
TPU_STAMP := $(TPU_VENV)/.installed
TPU_DEPS := $(TPU_VENV)/.deps
TPU_PKGS := -c constraints-tpu.txt torch==2.13.0 jax==0.10.2 jaxlib==0.10.2 torch-tpu==0.2.0 libtpu==0.0.52 \
        tokamax==0.0.12 transformers==5.25.0 huggingface_hub==2.4.0 kernels==0.19.1 starlette uvicorn \
        pyyaml packaging numpy pydantic pytest

.PHONY: setup setup-tpu demo test lint bench bench-tpu report chromium clean

# Set-up steps that do not depend on each other run at once (downloads and unpacking overlap).
MAKEFLAGS += -j3

setup: $(STAMP) $(WHEELS)

setup-tpu: $(TPU_STAMP)

# The two environments and the browser install side by side (MAKEFLAGS above); the two editable installs of this
# checkout build in the same folder, so the TPU one waits for the main one.
$(TPU_DEPS): constraints-tpu.txt Makefile
	test -x $(TPU_VENV)/bin/python || $(PY) -m venv $(TPU_VENV)
	$(TPU_VENV)/bin/pip install -q --disable-pip-version-check $(TPU_PKGS)
	$(TPU_VENV)/bin/pip install -q --disable-pip-version-check --no-deps -c constraints-tpu.txt tpu-inference==0.32.0
	touch $(TPU_DEPS)

$(TPU_STAMP): $(TPU_DEPS) $(STAMP) pyproject.toml
	$(TPU_VENV)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(TPU_STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check $(PKGS)
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

# pip download skips wheels already in the folder, so a re-run after a change fetches only what is new.
$(WHEELS): $(STAMP)
	$(BIN)/pip download -q --disable-pip-version-check --no-build-isolation -d $(WHEELHOUSE) -c constraints.txt ".[demo]"
	touch $(WHEELS)

demo: $(STAMP)
	$(BIN)/kernel-hub demo

# The suite runs on TEST_WORKERS processes (pytest-xdist), one test module per worker at a time (--dist loadscope,
# so a module's shared fixtures, e.g. the wheel's venv or a compiled mesh, are built once), the heaviest modules first
# (--no-loadscope-reorder keeps the order tests/schedule.py gives). 2 = this machine's cores; TEST_WORKERS=0 runs in
# one process.
TEST_WORKERS ?= 2

test: setup $(TPU_STAMP) chromium
	$(BIN)/ruff check src kernels bench tests conftest.py setup.py
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations=25

# Headless Chromium for the report's browser test (tests/report/test_report.py), from Debian's `chromium` package:
# ~45 s on a fresh machine (apt-get update ~3 s, install ~42 s). Without root the test skips, saying why;
# in CI ($CI set) a failed install fails the run, so the browser test never skips there.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  echo "installing chromium (Debian package) for the report's browser test"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    chromium >/dev/null; } || { echo "could not install chromium: the browser test will skip"; test -z "$$CI"; }; }

# The validation dashboard: report/report.json and report/index.html (open it in a browser), with the TPU
# compile matrix from the TPU environment. `make report ARGS=--quick` for a short one.
report: $(STAMP) $(TPU_STAMP)
	$(BIN)/kernel-hub report --out report $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src kernels bench tests conftest.py setup.py

bench: $(STAMP)
	$(BIN)/python bench/ragged_dot.py

bench-tpu: $(STAMP) $(TPU_STAMP)
	$(BIN)/python bench/tpu_model.py

clean:
	rm -rf $(VENV) $(TPU_VENV) $(WHEELHOUSE) .pytest_cache .ruff_cache src/*.egg-info

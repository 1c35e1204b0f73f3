# `make demo` and `make test` each do all set-up on a fresh machine, then run.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The tested set, pinned. torch==2.13.0 is the CPU wheel: never leave torch unpinned.
PKGS := -c constraints.txt torch==2.13.0 jax==0.10.2 jaxlib==0.10.2 tokamax==0.0.12 \
        transformers==5.24.0 huggingface_hub==2.4.0 kernels==0.17.2 pydantic==2.14.4 starlette uvicorn pytest ruff

.PHONY: setup demo test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check $(PKGS)
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/kernel-hub demo

test: $(STAMP)
	$(BIN)/ruff check src kernels bench tests conftest.py
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src kernels bench tests conftest.py

bench: $(STAMP)
	$(BIN)/python bench/ragged_dot.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache src/*.egg-info

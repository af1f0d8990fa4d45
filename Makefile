# hetero — developer entry points. `make demo` and `make test` each set up .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.hetero-installed
PY     ?= 3.12
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help venv demo test test-fast lint typecheck check proto wheelhouse clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 14

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "hetero needs Python 3.11 or newer (PYTHON=$(PYTHON))")'
	@test -x $(BIN)/python || { echo ">> creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo ">> installing hetero and its dependencies into $(VENV) (first time: a few minutes, torch is large)"
	@$(BIN)/python -m pip install --quiet --upgrade pip
	@$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)  ## create .venv and install hetero in editable mode

demo: $(STAMP)  ## run the heterogeneous demo job on this machine (CPU, emulated slowdown)
	@$(BIN)/python -m hetero.trainer.demo

test: $(STAMP)  ## run the whole test suite
	@$(BIN)/python -m pytest -q

test-fast: $(STAMP)  ## run the tests not marked slow
	@$(BIN)/python -m pytest -q -m 'not slow'

lint: $(STAMP)  ## ruff
	@$(BIN)/ruff check .
	@$(BIN)/ruff format --check .

typecheck: $(STAMP)  ## mypy --strict on the packages
	@$(BIN)/mypy hetero coordinator trainer bench

check: lint typecheck test  ## everything CI should care about

wheelhouse: $(STAMP)  ## offline wheels for an air-gapped cluster: make wheelhouse PY=3.12
	@mkdir -p wheelhouse/py$(PY)
	$(BIN)/python -m pip wheel --no-deps -w wheelhouse/py$(PY) .
	$(BIN)/python -m pip download -d wheelhouse/py$(PY) --only-binary=:all: --python-version $(PY) \
	    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
	    --platform manylinux_2_28_x86_64 --platform any \
	    $$($(BIN)/python -c 'import tomllib;d=tomllib.load(open("pyproject.toml","rb"));print(" ".join(x for x in d["project"]["dependencies"] if not x.startswith(("torch","torchvision"))))')
	@echo ">> wheels in wheelhouse/py$(PY) (torch not included: install the CUDA build your cluster uses)"

clean:  ## remove build outputs (keeps .venv)
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache wheelhouse

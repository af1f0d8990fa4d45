# hetero — developer entry points. `make demo` and `make test` each set up .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.hetero-installed
PY     ?= 3.12
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help venv demo demo-embedded test test-fast test-postgres test-slurm test-kubernetes test-ecosystem test-link test-browser test-gpu test-container image chaos load lint typecheck check proto docs-tables wheelhouse pyroot clean

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

demo: $(STAMP)  ## coordinator + 3 agents on this machine run equal vs dynamic (CPU, emulated slowdown)
	@$(BIN)/python -m hetero.bench.demo

demo-embedded: $(STAMP)  ## the same comparison with hetero-train alone (no control plane)
	@$(BIN)/python -m hetero.trainer.demo

# TEST_WORKERS=N runs the suite on N pytest-xdist processes, each test file whole on one
# of them (a file's module fixtures, e.g. one launch of ranks shared by its tests, run
# once). Much of the suite waits on rank processes and daemons rather than computing,
# so 2 (the default) beat one process on a 2-core box: 13.4 against 18.2 minutes of
# tests from a fresh clone, both beside other work (12.5 on a quieter box). 0: one
# process, one test at a time.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
# Tests marked ``alone`` measure the ranks' speeds against each other: they run after the
# others, one at a time, so that no other test file's ranks share the cores with them.
TIERS := not chaos and not postgres and not container and not slurm and not link and not ecosystem
test: $(STAMP)  ## run the whole test suite (chaos tests excepted: make chaos; PostgreSQL: make test-postgres; Slurm: make test-slurm; the image: make test-container; W&B, MLflow, datasets, WebDataset: make test-ecosystem)
	@rc=0; \
	$(BIN)/python -m pytest -q $(XDIST) --durations=25 -m '$(TIERS) and not alone' || rc=$$?; \
	$(BIN)/python -m pytest -q -m '$(TIERS) and alone' || rc=$$?; \
	exit $$rc

# As root on Debian it installs the postgresql package when no server is there; the
# server itself is a throwaway cluster under /tmp (tests/integration/pgserver.py).
test-postgres: $(STAMP)  ## the store, write lock, report worker, retention, recovery and load tests on a throwaway PostgreSQL server
	@HETERO_PG_INSTALL=1 $(BIN)/python -m pytest -q -m postgres tests/integration

# As root on Debian it installs slurm-wlm and munge when they are missing; the cluster is
# one node (this host), its daemons started by hand under /tmp and stopped after the tests
# (tests/integration/slurmcluster.py).
test-slurm: $(STAMP)  ## srun -n 3 of the custom loop and of hetero-train on a throwaway one-host Slurm cluster, against torchrun
	@HETERO_SLURM_INSTALL=1 $(BIN)/python -m pytest -q -rs -m slurm tests/integration/test_slurm.py

# make test checks deploy/kubernetes with kubectl (client dry-run) and, where the validator
# is installed, against the API's schemas; this target installs it (kubernetes-validate,
# from PyPI, which carries the schemas of Kubernetes 1.25 to 1.37) into its own venv.
K8S_VENV := .venv-k8s
$(K8S_VENV)/bin/kubernetes-validate:
	@test -x $(K8S_VENV)/bin/python || $(PYTHON) -m venv $(K8S_VENV)
	@$(K8S_VENV)/bin/python -m pip install --quiet 'kubernetes-validate>=1.37'

test-kubernetes: $(STAMP) $(K8S_VENV)/bin/kubernetes-validate  ## deploy/kubernetes: kubectl apply --dry-run=client and the API's schemas (1.29, 1.37)
	@HETERO_K8S_VALIDATE=1 $(BIN)/python -m pytest -q -rs tests/integration/test_kubernetes_manifests.py

# The loggers and streams docs/trainer.md shows (pyproject's `ecosystem` extra: wandb,
# mlflow-skinny, datasets, webdataset, from PyPI) go into .venv itself: they run beside
# torch and hetero. The constraints hold .venv's torch, numpy, protobuf and grpcio where
# they are: a release that wants other versions of them fails to install (CI then skips
# the tier in one line) rather than replacing them. Local files only: W&B offline,
# MLflow on SQLite, the Hugging Face Hub switched off.
ECO_STAMP := $(VENV)/.hetero-ecosystem
$(ECO_STAMP): $(STAMP)
	@$(BIN)/python -m pip freeze | grep -iE '^(torch|torchvision|numpy|protobuf|grpcio[a-z-]*)==' \
	    > $(VENV)/ecosystem-constraints.txt
	@$(BIN)/python -m pip install --quiet -c $(VENV)/ecosystem-constraints.txt -e '.[ecosystem]'
	@touch $@

test-ecosystem: $(ECO_STAMP)  ## W&B offline, MLflow on SQLite, a Hugging Face datasets stream and WebDataset shards through ctx.on_interval and ctx.loader (installs them into .venv)
	@$(BIN)/python -m pytest -q -rs -m ecosystem tests/integration/test_ecosystem_*.py

# As root on Debian it installs the chromium and chromium-driver packages when they are
# missing (tests/integration/browser.py); nothing is downloaded from elsewhere. make test
# runs the same test when chromium is there, and skips it in one line when not.
test-browser: $(STAMP)  ## hetero-top --web in a real headless Chromium against a real coordinator
	@HETERO_BROWSER_INSTALL=1 $(BIN)/python -m pytest -q -rs -m browser tests/integration/test_tui_web.py

test-fast: $(STAMP)  ## run the tests not marked slow
	@$(BIN)/python -m pytest -q $(XDIST) -m 'not slow and not postgres and not browser and not container and not slurm and not link and not ecosystem'

# The GPU tier runs where hetero may not be installed (a GPU host with Python, torch,
# grpcio, protobuf, nvidia-ml-py and pyyaml): hetero comes from this checkout, the
# rest (pytest, SQLAlchemy, psutil, rich, ...) from `make wheelhouse PY=3.12` carried
# there and installed with pip --no-index. NVLink multicast stays off (NCCL_NVLS_ENABLE=0):
# some virtualised hosts cannot map it.
GPU_PYTHON  ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
GPU_SUMMARY ?= docs/gpu-tier.md
GPU_DEPS    := pytest sqlalchemy psutil rich grpcio-health-checking grpcio-reflection
test-gpu:  ## the GPU tier (tests/gpu: 2+ CUDA devices, else skipped); its summary goes to docs/gpu-tier.md
	@$(GPU_PYTHON) -c 'import pytest, sqlalchemy, psutil, rich, grpc_health, grpc_reflection' 2>/dev/null \
	    || { echo "test-gpu: $(GPU_PYTHON) lacks pytest or a dependency of hetero; carry wheelhouse/py3.12 (make wheelhouse PY=3.12) and run: $(GPU_PYTHON) -m pip install --no-index --find-links wheelhouse/py3.12 $(GPU_DEPS)"; exit 2; }
	@$(GPU_PYTHON) -c 'import torch; n = torch.cuda.device_count() if torch.cuda.is_available() else 0; raise SystemExit(0 if n >= 2 else 3)' \
	    || { echo "test-gpu: skipped: needs 2 or more CUDA devices"; exit 0; }; \
	NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
	    HETERO_GPU_SUMMARY=$(CURDIR)/$(GPU_SUMMARY) PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} \
	    $(GPU_PYTHON) -m pytest -q -rs -p no:cacheprovider -m gpu tests/gpu

# The container image, built with podman: no daemon to run, as root or rootless, where no
# Docker engine is installed. Offline: the base is Debian bookworm from debootstrap, imported
# into podman (docker/debian-base.sh, as root), and pip installs only from the wheelhouse of
# the base's Python, 3.11, with a CPU build of torch (a CUDA build adds about 3 GB); pip
# finds IMAGE_TORCH through its configured indexes, e.g.
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu, or --find-links in pip.conf.
# python:3.12-slim stays the Dockerfile's default base for builds with a registry.
PODMAN      ?= podman
IMAGE       ?= localhost/hetero:latest
IMAGE_BASE  ?= localhost/hetero-base:bookworm
IMAGE_PY    := 3.11
IMAGE_TORCH ?= torch==2.13.0+cpu torchvision==0.28.0
image: $(STAMP)  ## build the container image offline with podman (Debian base, wheelhouse, CPU torch); IMAGE=name
	@docker/debian-base.sh $(IMAGE_BASE)
	@rm -f wheelhouse/py$(IMAGE_PY)/hetero-*.whl
	@# Timestamps of the last commit to the packaged files: unchanged sources make the same
	@# wheel, so podman's layer cache holds and the image is not rebuilt.
	@SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct -- pyproject.toml README.md hetero core coordinator client security \
	    agent trainer tui bench proto 2>/dev/null || echo 315532800) \
	    $(MAKE) -s wheelhouse PY=$(IMAGE_PY) >/dev/null
	@$(BIN)/python -m pip download -q -d wheelhouse/py$(IMAGE_PY) --only-binary=:all: --python-version $(IMAGE_PY) \
	    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
	    --platform manylinux_2_28_x86_64 --platform any $(IMAGE_TORCH) 2>&1 | grep -v '^WARNING: Location' || true
	$(PODMAN) build -q --format docker -t $(IMAGE) --build-arg PYTHON_IMAGE=$(IMAGE_BASE) \
	    --build-arg PIP_ARGS="--no-index --find-links /src/wheelhouse/py$(IMAGE_PY)" --build-arg HETERO_SPEC='hetero[train]' .
	@echo ">> $(IMAGE): $$($(PODMAN) image inspect --format '{{.Size}}' $(IMAGE)) bytes"

test-container: $(STAMP)  ## build the image (make image) and run compose.yaml's coordinator and two agents through the demo job
	@command -v $(PODMAN) >/dev/null 2>&1 || { echo "test-container: skipped: podman not found (Debian: apt-get install podman runc)"; exit 0; }
	@HETERO_IMAGE=$(IMAGE) $(BIN)/python -m pytest -q -s -p no:cacheprovider -m container tests/container
	@cat build/container/figures.json

# Root: two network namespaces joined by one veth pair, shaped with tc (netem where the
# kernel has it, else tbf), the coordinator and an agent in one, an agent in the other.
test-link: $(STAMP)  ## one job across two namespaces over a 1 Gbit/s link: it completes, and the planner's predicted step counts the link
	@$(BIN)/python -m pytest -q -s -rs -m link tests/integration/test_shaped_link.py

CHAOS_REPORT := build/chaos
chaos: $(STAMP)  ## kill -9 agents, ranks and the coordinator of a local cluster, cut a node's network (root); figures in build/chaos
	@rm -rf $(CHAOS_REPORT)
	@HETERO_CHAOS_REPORT=$(CHAOS_REPORT) $(BIN)/python -m pytest -q -s -m 'chaos or not chaos' tests/integration/test_chaos.py tests/integration/test_network_partition.py
	@$(BIN)/python -c 'import json,pathlib; [print(p.stem, json.dumps(json.loads(p.read_text()), indent=1)) for p in sorted(pathlib.Path("$(CHAOS_REPORT)").glob("*.json"))]'

load: $(STAMP)  ## control-plane scale test: 1,000 agents, 256 ranks, 120 s (hetero-bench load)
	@$(BIN)/hetero-bench load --agents 1000 --ranks 256 --duration 120

lint: $(STAMP)  ## ruff, and the import contracts of pyproject.toml (import-linter)
	@$(BIN)/ruff check .
	@$(BIN)/ruff format --check .
	@$(BIN)/lint-imports --no-cache --no-logo

typecheck: $(STAMP)  ## mypy --strict on the packages, under their installed names
	@$(BIN)/mypy -p hetero

# A machine with torch but no network (a GPU host without internet access) cannot
# pip-install hetero's dependencies; hetero-bench run and hetero-train need none beyond
# torch, torchvision, pyyaml and (optionally) nvidia-ml-py, so the checkout itself on
# PYTHONPATH is enough: hetero/ links every package folder. The target stays for
# scripts written against its tree (build/pyroot/hetero, one link to hetero/).
PYROOT := build/pyroot
pyroot:  ## hetero importable without installing: export PYTHONPATH=$PWD (or $PWD/build/pyroot)
	@rm -rf $(PYROOT) && mkdir -p $(PYROOT) && ln -s ../../hetero $(PYROOT)/hetero
	@echo "export PYTHONPATH=$(CURDIR)"

check: lint typecheck test  ## everything CI should care about

wheelhouse: $(STAMP)  ## offline wheels for an air-gapped cluster: make wheelhouse PY=3.12
	@mkdir -p wheelhouse/py$(PY)
	$(BIN)/python -m pip wheel --no-deps -w wheelhouse/py$(PY) .
	$(BIN)/python -m pip download -d wheelhouse/py$(PY) --only-binary=:all: --python-version $(PY) \
	    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
	    --platform manylinux_2_28_x86_64 --platform any \
	    $$($(BIN)/python -c 'import tomllib;print(" ".join(tomllib.load(open("pyproject.toml","rb"))["project"]["dependencies"]))') \
	    'pytest>=8'
	@echo ">> wheels in wheelhouse/py$(PY) (torch, the train extra, not included: add the CUDA build your cluster uses; pytest is, for make test-gpu)"

# The generator is pinned OLD on purpose: stubs from a newer grpcio-tools refuse to import
# under an older grpcio, and GPU machines may run any grpcio >= 1.66. grpcio-tools 1.66.0
# bundles protoc 27.2, whose output needs protobuf >= 5.27.2 at run time.
PROTO_TOOLS_VERSION := 1.66.0
PROTO_VENV := .venv-proto
PROTO_STAMP := $(PROTO_VENV)/.grpcio-tools-$(PROTO_TOOLS_VERSION)

$(PROTO_STAMP):
	@test -x $(PROTO_VENV)/bin/python || $(PYTHON) -m venv $(PROTO_VENV)
	@$(PROTO_VENV)/bin/python -m pip install --quiet 'grpcio-tools==$(PROTO_TOOLS_VERSION)'
	@touch $@

proto: $(PROTO_STAMP)  ## regenerate proto/hetero/v1/*_pb2*.py and SOURCES.sha256 (pinned generator)
	rm -f proto/hetero/v1/*_pb2.py proto/hetero/v1/*_pb2.pyi proto/hetero/v1/*_pb2_grpc.py
	$(PROTO_VENV)/bin/python -m grpc_tools.protoc -I proto --python_out=proto --pyi_out=proto --grpc_python_out=proto \
	    proto/hetero/v1/*.proto
	cd proto && { echo "# generator grpcio-tools==$(PROTO_TOOLS_VERSION)"; sha256sum hetero/v1/*.proto; } \
	    > hetero/v1/SOURCES.sha256

docs-tables: $(STAMP)  ## rewrite the docs' tables of models, datasets, policies and options from the catalogue
	@$(BIN)/python -m hetero.core.catalogue.reference --write

clean:  ## remove build outputs (keeps .venv)
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache wheelhouse

# cronwell — kubebuilder-style Makefile. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Where `make envtest` caches etcd, kube-apiserver, kubectl and helm (outside the repo).
ENVTEST_CACHE ?= $(HOME)/.cache/cronwell/envtest
PYTEST_ARGS ?=

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
	  /^[a-zA-Z_-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

.PHONY: install
install: $(STAMP) ## Create the virtualenv and install cronwell (editable) with dev tools.

.PHONY: run
run: $(STAMP) ## Run the scheduler + workers on examples/ with an embedded PostgreSQL (no cluster).
	$(BIN)/cronwell dev --jobs examples/jobs --duration 90

.PHONY: lint
lint: $(STAMP) ## ruff, mypy and the import-layering contracts.
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

.PHONY: fmt
fmt: $(STAMP) ## Format the code and apply safe ruff fixes.
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

.PHONY: manifests
manifests: $(STAMP) ## Regenerate crds/ from the pydantic models.
	$(BIN)/python -m cronwell.crdgen crds

##@ Test

.PHONY: test
test: $(STAMP) envtest lint ## Lint, then every test: unit, integration (real PostgreSQL), e2e (real API server).
	KUBEBUILDER_ASSETS="$$(bash hack/envtest.sh --print-path)" \
	  $(BIN)/pytest $(PYTEST_ARGS)

.PHONY: test-fast
test-fast: $(STAMP) ## Unit and integration tests only (no API server).
	$(BIN)/pytest -m 'not e2e' $(PYTEST_ARGS)

.PHONY: envtest
envtest: ## Provide etcd, kube-apiserver, kubectl and helm (built from Go modules if absent); prints the path.
	@bash hack/envtest.sh

.PHONY: dev-cluster
dev-cluster: $(STAMP) envtest ## Local API server + embedded PostgreSQL + operator, scheduler, worker; prints KUBECONFIG.
	KUBEBUILDER_ASSETS="$$(bash hack/envtest.sh --print-path)" $(BIN)/python hack/dev_cluster.py

.PHONY: kind-up
kind-up: ## Create a kind cluster named cronwell (needs a Docker engine; not on this machine).
	@bash hack/kind-up.sh

##@ Benchmarks

.PHONY: bench
bench: $(STAMP) ## Run the benchmarks and print comparable figures.
	$(BIN)/python hack/bench.py

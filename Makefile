# cronwell — kubebuilder-style Makefile. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
# Where `make envtest` caches etcd, kube-apiserver, kubectl and helm (outside the repo).
ENVTEST_CACHE ?= $(HOME)/.cache/cronwell/envtest
PYTEST_ARGS ?=
IMG_REPO ?= cronwell
IMG_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMG ?= $(IMG_REPO):$(IMG_TAG)
CONTAINER_TOOL ?= docker
KUBECTL ?= kubectl
HELM ?= helm
NAMESPACE ?= cronwell
RELEASE ?= cronwell
DB_SECRET ?= cronwell-database
HELM_ARGS ?=
# checkov (the chart's policy scanner) lives in its own venv: its pins clash with ours.
CHECKOV_VENV ?= $(HOME)/.cache/cronwell/checkov
CHECKOV_VERSION ?= 3.3.30

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
	  /^[a-zA-Z0-9_-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

# Quiet: one line, then only errors. setuptools reports every editable install as a
# warning ("Editable installation.", its InformationOnly category, not a problem), which pip
# passes on even with -q; that message alone is filtered, in the build backend's process.
$(STAMP): pyproject.toml
	@echo "installing cronwell and its dev tools into $(VENV) (first run only)"
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install -q --upgrade pip
	@PYTHONWARNINGS='ignore:Editable installation' $(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

.PHONY: venv
venv: $(STAMP) ## Create the virtualenv and install cronwell (editable) with dev tools.

.PHONY: run
run: $(STAMP) ## Run the scheduler + workers on examples/ with an embedded PostgreSQL and the dashboard (no cluster).
	@$(BIN)/cronwell dev --jobs examples/jobs --duration 90

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
manifests: $(STAMP) ## Regenerate crds/ from the pydantic models, and the chart's copy.
	$(BIN)/python -m cronwell.crdgen crds
	rm -f charts/cronwell/crds-src/*.yaml
	cp crds/*.yaml charts/cronwell/crds-src/

.PHONY: manifests-check
manifests-check: $(STAMP) ## Fail if crds/ differs from the pydantic models.
	$(BIN)/python -m cronwell.crdgen crds --check

.PHONY: run-operator
run-operator: $(STAMP) ## Run the operator against $$KUBECONFIG (CRDs installed first: make install).
	$(BIN)/cronwell operator

##@ Test

.PHONY: test
test: $(STAMP) sysdeps envtest envtest-node cnpg checkov lint ## Lint, then every test: unit, integration (real PostgreSQL), e2e (real API server), node (real kubelet).
	@# A private base directory: pytest keeps only the newest three of its shared numbered
	@# ones, so another run on the machine could delete this run's PostgreSQL under it.
	bt="$$(mktemp -d "$${TMPDIR:-/tmp}/cronwell-tests.XXXXXX")" && \
	KUBEBUILDER_ASSETS="$$(bash hack/envtest.sh --print-path)" \
	  $(BIN)/pytest --basetemp="$$bt" $(PYTEST_ARGS) && rm -rf "$$bt"

.PHONY: test-fast
test-fast: $(STAMP) ## Unit and integration tests only (no API server, no node, no image build).
	$(BIN)/pytest -m 'not e2e and not node and not image' $(PYTEST_ARGS)

.PHONY: sysdeps
sysdeps: ## Debian packages the tests use (idempotent): faketime, openssl, runc, and the node's runtime.
	@bash hack/sysdeps.sh

.PHONY: e2e
e2e: $(STAMP) envtest ## Only the e2e tests (real kube-apiserver + etcd; Helm chart install).
	KUBEBUILDER_ASSETS="$$(bash hack/envtest.sh --print-path)" \
	  $(BIN)/pytest -m e2e $(PYTEST_ARGS)

.PHONY: e2e-node
e2e-node: $(STAMP) sysdeps envtest-node cnpg ## Only the node tests: a real one-node cluster (kubelet + containerd, no Docker; root).
	KUBEBUILDER_ASSETS="$$(bash hack/envtest.sh --print-path)" \
	  $(BIN)/pytest -m node $(PYTEST_ARGS)

.PHONY: node-up
node-up: $(STAMP) sysdeps envtest-node ## Start a one-node cluster until Ctrl-C (IMAGES="a.tar b.tar" are imported); prints KUBECONFIG.
	KUBEBUILDER_ASSETS="$$(bash hack/envtest.sh --print-path)" \
	  $(BIN)/python -m cronwell.testing.node up $(foreach i,$(IMAGES),--image $(i))

.PHONY: node-down
node-down: $(STAMP) ## Clean up what a crashed node run left (processes, netns, cgroups, sysctls).
	$(BIN)/python -m cronwell.testing.node down

.PHONY: checkov
checkov: $(CHECKOV_VENV)/bin/checkov ## Install checkov (policy scanner for the chart and Dockerfile).

$(CHECKOV_VENV)/bin/checkov:
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q checkov==$(CHECKOV_VERSION)

.PHONY: envtest
envtest: ## Provide etcd, kube-apiserver, kubectl and helm (built from Go modules if absent); prints the path.
	@bash hack/envtest.sh

.PHONY: envtest-node
envtest-node: ## Also kubelet, kube-controller-manager, kube-scheduler, kube-proxy and the pause image (make e2e-node).
	@bash hack/envtest.sh --node

.PHONY: cnpg
cnpg: ## CloudNativePG for its node test: the manager (Go module), operator and operand images.
	@bash hack/cnpg.sh >/dev/null

.PHONY: dev-cluster
dev-cluster: $(STAMP) envtest ## Local API server + embedded PostgreSQL + operator, scheduler, worker; prints KUBECONFIG.
	KUBEBUILDER_ASSETS="$$(bash hack/envtest.sh --print-path)" $(BIN)/python hack/dev_cluster.py

.PHONY: kind-up
kind-up: ## Create a kind cluster named cronwell (needs a Docker engine; not on this machine).
	@bash hack/kind-up.sh

.PHONY: failover
failover: $(STAMP) ## Failover suite: a primary and a streaming standby fail over under real schedulers and workers.
	$(BIN)/pytest -m failover -s $(PYTEST_ARGS)

.PHONY: chaos
chaos: $(STAMP) ## Chaos run: faults against real processes; checks exactly-once effect (SEED, JOBS, DURATION).
	$(BIN)/python -m tests.chaos.runner --seed $(or $(SEED),1) --jobs $(or $(JOBS),2000) --duration $(or $(DURATION),180)

##@ Deployment

.PHONY: install
install: ## Install the CRDs into the cluster of the current kubeconfig context.
	$(KUBECTL) apply --server-side -f crds/

.PHONY: uninstall
uninstall: ## Delete the CRDs from the cluster (this deletes every ScheduledJob!).
	$(KUBECTL) delete --ignore-not-found -f crds/

.PHONY: deploy
deploy: ## Install/upgrade the chart: IMG_REPO, IMG_TAG, NAMESPACE, RELEASE, DB_SECRET, HELM_ARGS.
	$(KUBECTL) create namespace $(NAMESPACE) --dry-run=client -o yaml | $(KUBECTL) apply -f -
	$(KUBECTL) label --overwrite namespace $(NAMESPACE) pod-security.kubernetes.io/enforce=restricted
	$(HELM) upgrade --install $(RELEASE) charts/cronwell --namespace $(NAMESPACE) \
	  --set image.repository=$(IMG_REPO) --set image.tag=$(IMG_TAG) \
	  --set database.existingSecret=$(DB_SECRET) $(HELM_ARGS)

.PHONY: undeploy
undeploy: ## Uninstall the chart (the CRDs and ScheduledJobs are kept; see `make uninstall`).
	$(HELM) uninstall $(RELEASE) --namespace $(NAMESPACE)

.PHONY: docker-build
docker-build: ## Build the image IMG (default cronwell:<version>).
	$(CONTAINER_TOOL) build -t $(IMG) .

.PHONY: image
image: ## Build IMG_TAG's image without Docker (debootstrap + buildah); prints the archive for ctr/docker load.
	@bash hack/build-image.sh --repo $(IMG_REPO) --tag $(IMG_TAG)

.PHONY: docker-push
docker-push: ## Push the image IMG.
	$(CONTAINER_TOOL) push $(IMG)

##@ Benchmarks

# The peers (Procrastinate, pgqueuer), the CDF plot and the profiler: without them the
# peer sections would print "skipped" and `profile` would stop.
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[dev,bench]'
	touch $(BENCH_STAMP)

.PHONY: bench
bench: $(BENCH_STAMP) ## Run the benchmarks and print comparable figures (ARGS="--only schedule").
	$(BIN)/python -m bench $(ARGS)

.PHONY: soak
soak: $(BENCH_STAMP) ## The hour-long soak: the seed's day at 10x compressed 24x, watched for leaks and drift (ARGS="--soak-scale 0.25").
	$(BIN)/python -m bench --only soak $(ARGS)

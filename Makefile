# pd-operator developer commands. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml requirements/constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "pd-operator needs Python >= 3.11; set PYTHON=python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c requirements/constraints.txt -e '.[dev]'
	@touch $@

.PHONY: install
install: $(STAMP) ## Create .venv and install the package with pinned dependencies

.PHONY: lock
lock: ## Re-resolve dependencies and rewrite requirements/constraints.txt
	rm -rf $(VENV)-lock && $(PYTHON) -m venv $(VENV)-lock
	$(VENV)-lock/bin/pip install --quiet --upgrade pip && $(VENV)-lock/bin/pip install --quiet '.[dev]'
	$(VENV)-lock/bin/pip freeze --exclude pd-operator > requirements/constraints.txt
	rm -rf $(VENV)-lock

.PHONY: testenv
testenv: ## Build or fetch etcd, kube-apiserver, kube-controller-manager, kubectl, helm; install Prometheus
	bash hack/testenv.sh

.PHONY: lint
lint: install ## ruff check, ruff format --check, mypy --strict, import-linter layer contracts
	$(BIN)/ruff check operator tests
	$(BIN)/ruff format --check operator tests
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

.PHONY: format
format: install ## Apply ruff's fixes and formatting
	$(BIN)/ruff check --fix operator tests
	$(BIN)/ruff format operator tests

.PHONY: test-unit
test-unit: install ## Unit tests only (no control plane)
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

.PHONY: test-integration
test-integration: install ## Integration tests against the local control plane and Prometheus
	PD_TESTBIN="$$(bash hack/testenv.sh | tail -n 1)" $(BIN)/pytest -m integration tests $(PYTEST_ARGS)

.PHONY: test
test: install ## Everything: installs dependencies and the test environment, then unit + integration tests
	PD_TESTBIN="$$(bash hack/testenv.sh | tail -n 1)" $(BIN)/pytest tests $(PYTEST_ARGS)

.PHONY: manifests
manifests: install ## Regenerate the CRD in crds/ (and the chart's copy) and docs/api.md from the pydantic models
	$(BIN)/python -m pd_operator.api.crd crds
	cp crds/*.yaml charts/pd-operator/files/crds/
	$(BIN)/python -m pd_operator.api.reference docs/api.md

.PHONY: verify
verify: install lint ## Fail if generated files are stale, then lint
	$(BIN)/python -m pd_operator.api.crd --check crds
	$(BIN)/python -m pd_operator.api.reference --check docs/api.md

.PHONY: clean
clean: ## Remove the virtual environment and caches (not the test binaries cache)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

.PHONY: chart-lint
chart-lint: ## helm lint --strict the chart, render it, check its CRD and rules copies
	bash hack/chart-lint.sh

.PHONY: kindenv
kindenv: ## Docker engine, kind and a kind node image (built locally without a registry); cached
	bash hack/kindenv.sh build

.PHONY: kind-up
kind-up: kindenv ## kind cluster shaped like config/clusters/articles.yaml (runs kindenv first)
	MAKE="$(MAKE)" bash hack/kind.sh up

.PHONY: kind-down
kind-down: ## Delete the kind cluster; stop dockerd by its PID if kindenv started it
	bash hack/kindenv.sh down

.PHONY: kind-images
kind-images: kindenv ## Operator, engine-simulator and router images (no registry needed); kind load them
	bash hack/kind-images.sh build

.PHONY: kind-e2e
kind-e2e: kindenv ## kind cluster, images, Prometheus, helm install; a TTFT breach scales prefill (tests/kind)
	MAKE="$(MAKE)" bash hack/kind.sh e2e

.PHONY: demo
demo: install ## The closed loop on one machine, live table, plot + summary (DEMO_ARGS="--duration 60")
	PD_TESTBIN=$$(bash hack/testenv.sh | tail -n 1) $(BIN)/python -m pd_tools.cli.main demo $(DEMO_ARGS)

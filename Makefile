# trainop — one entry point for every routine task. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PYTEST_ARGS ?=
# make test: 2 runs the unit and chart tiers beside the others (tests/lanes.py), 1 runs one plain pytest
TEST_LANES ?= 2
KUBECONFIG ?=
E2E_REAL_CLUSTER ?=

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

.PHONY: venv
venv: $(STAMP) ## create .venv with trainop and every dev dependency (torch, ray, kopf, ...)

.PHONY: demo
demo: $(STAMP) ## run the CPU TrainingJob locally on Ray, with one injected worker failure + recovery
	$(VENV)/bin/trainop run examples/cpu-mlp.yaml --fresh --inject-failure-at-step 220

.PHONY: crds
crds: $(STAMP) ## regenerate crds/ (and the chart's copy), docs/api.md and the chart's RBAC from the models
	$(VENV)/bin/trainop crds --out crds --docs docs/api.md --chart-rbac charts/trainop/templates/_rbac.tpl
	bash charts/sync.sh

.PHONY: lint
lint: $(STAMP) ## ruff (lint + format check) and mypy --strict on the API and operator packages
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --strict operator/trainop
	$(VENV)/bin/mypy --strict tests/controlplane tests/tiers.py tests/tier_gate.py tests/lanes.py tests/property_seed.py
	$(VENV)/bin/mypy --strict tests/nodeagent tests/clusterbed tests/objectstore

.PHONY: preflight
preflight: ## check the tools `make test` needs (Go, util-linux); names the command that installs a missing one
	@bash tests/preflight.sh

.PHONY: controlplane
controlplane: preflight ## build (once, cached under ~/.cache/trainop) the control plane, scheduler, kube-proxy, KubeRay, CoreDNS, helm, promtool, versitygw (S3)
	bash tests/controlplane/build.sh

.PHONY: dev-cluster
dev-cluster: $(STAMP) controlplane ## a whole cluster here (KubeRay, scheduler, DNS, pods on the node agent, trainop installed)
	$(PY) -m tests.clusterbed

.PHONY: test-unit
test-unit: $(STAMP) ## fast tier: no control plane, no Ray
	$(PY) -m pytest -m "not controlplane and not ray and not e2e" $(PYTEST_ARGS)

.PHONY: test
test: $(STAMP) controlplane ## every test: unit, real control plane, real Ray, e2e, chart, monitoring, in two lanes at once (tests/lanes.py; TEST_LANES=1: one pytest); per-tier counts at the end
	TRAINOP_TEST_LANES=$(TEST_LANES) $(PY) -m tests.lanes $(PYTEST_ARGS)

.PHONY: e2e
e2e: $(STAMP) controlplane ## the end-to-end scenarios (KUBECONFIG=... E2E_REAL_CLUSTER=1 for a real cluster)
	KUBECONFIG=$(KUBECONFIG) E2E_REAL_CLUSTER=$(E2E_REAL_CLUSTER) $(PY) -m pytest e2e $(PYTEST_ARGS)

.PHONY: clean
clean: ## remove local state (.trainop/) and caches; keeps .venv and ~/.cache/trainop
	rm -rf .trainop .pytest_cache .mypy_cache .ruff_cache build dist

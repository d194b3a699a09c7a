#!/usr/bin/env bash
# A lent GPU's whole job in one device call (a session has 15 minutes of device time, start-up included). Run
# from the repository root on the device machine. Its python3 (Python 3.12, JAX 0.11.x with the CUDA 13 plugin,
# PyTorch, PyG, pytest, hypothesis) lacks jraph, and ../shared/data does not travel, so carry both:
#
#   here, once:  echo /.whl/ >> .git/info/exclude; echo /.gpu_data/ >> .git/info/exclude
#                python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl jraph==0.0.6.dev0
#                cp -r ../shared/data .gpu_data
#   the call:    bash benchmarks/gpu_session.sh   (carry .whl and .gpu_data; timeout_s 600)
#
# Steps, most important first, each capped and all sharing $GPU_SESSION_BUDGET seconds (default 540), so the call
# returns inside the tool's 10-minute limit with what it finished:
#   1. pytest -m gpu: every kernel, non-interpreted, on a power-law graph with a ~23k in-degree hub;
#   2. every "pallas_interpret" test of the suite on the real kernels (JGNN_TEST_INTERPRET_ON_GPU=1);
#   3. the benchmark suites hector, graphiler, micro, ugcg and seastar against jgnn's XLA backend, the reference,
#      jraph and PyG, on the data sets that fit the budget (each suite's JSON is rewritten after every case; the
#      micro suite measures the copy bandwidth its byte floor uses, and `python -m benchmarks.gpu.bandwidth`
#      probes gather and segment_sum, measured on 2026-11-26 and 2026-11-27);
#   4. fuzz batches with the "pallas_interpret" backend on the real kernels (reproducers of each signature kept).
# The tool brings back at most 8 files from $OUT: gpu-session.tar.gz (every log, JSON, table, chart and reproducer)
# and status.txt (one line per step: exit code and seconds; also printed last). Commit the results under
# benchmarks/results/ with the device, versions and date that each JSON's meta records.
set -uo pipefail
out=${OUT:-out}
budget=${GPU_SESSION_BUDGET:-550}
work=$(mktemp -d)
status="$work/status.txt"
mkdir -p "$out" "$work/data"

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
[ -d .gpu_data ] && export JGNN_DATA_DIR=$PWD/.gpu_data
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false

# step NAME CAP COMMAND...: run for at most CAP seconds and the budget left, log to NAME.log, record rc and seconds.
step() {
  local name=$1 cap=$2 left=$(( budget - SECONDS )) t0=$SECONDS rc
  shift 2
  (( cap < left )) && left=$cap
  if (( left < 20 )); then
    echo "$name: skipped, budget spent" | tee -a "$status"
    return
  fi
  timeout --kill-after=10 "$left" "$@" >"$work/$name.log" 2>&1
  rc=$?
  echo "$name: rc=$rc $(( SECONDS - t0 ))s" | tee -a "$status"
}

bench() {  # bench CAP SUITE DATASET...: one suite on the GPU, one process, graphs cached for the other suites
  local cap=$1 suite=$2
  shift 2
  step "bench-$suite" "$cap" python3 -m benchmarks.run --suite "$suite" --device gpu --no-isolate --repeats 10 \
    --data-cache "$work/data" "${@/#/--dataset=}" --out "$work/$suite-gpu.json"
}

step device 30 sh -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  python3 -c "import jax, jaxlib, triton, torch, torch_geometric as g, sys;
print(sys.version); print(\"jax\", jax.__version__, \"jaxlib\", jaxlib.__version__, \"triton\", triton.__version__,
\"torch\", torch.__version__, \"pyg\", g.__version__, jax.devices())"'
step pytest-gpu 80 python3 -m pytest -q -p no:cacheprovider -n 4 -m gpu tests
step pytest-real-kernels 135 env JGNN_TEST_INTERPRET_ON_GPU=1 python3 -m pytest -q -p no:cacheprovider -n 8 \
  -m "not gpu" -k pallas_interpret --timeout 140 tests
# hector first: its rows decide between the kernels and XLA on small typed graphs (2026-11-27: XLA won on AIFB)
bench 85 hector aifb mutag bgs am
bench 55 graphiler pubmed ppi ogbn-arxiv
bench 50 micro ogbn-arxiv
bench 40 ugcg cora pubmed
bench 30 seastar aifb mutag bgs
step fuzz-real-kernels 75 env JGNN_TEST_INTERPRET_ON_GPU=1 JGNN_FUZZ_KEEP_GOING=1 JGNN_FUZZ_BATCHES=10 \
  JGNN_FUZZ_MIN_CASES=0 JGNN_FUZZ_DUMP="$work/fuzz" python3 -m pytest -q -p no:cacheprovider -s -n 0 \
  tests/fuzz/test_fuzz.py
rm -rf "$work/data"
tar czf "$out/gpu-session.tar.gz" -C "$work" .
cp "$status" "$out/status.txt"
echo "== done in ${SECONDS}s; $out: gpu-session.tar.gz, status.txt"
cat "$status"

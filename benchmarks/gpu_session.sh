#!/usr/bin/env bash
# The whole GPU job of a session that is lent a GPU, in 3 device calls of under 10 minutes each. Run from the
# repository root on the device machine. Its python3 (Python 3.12, JAX 0.11.x with the CUDA 13 plugin, PyTorch,
# PyG, pytest) lacks jraph, so carry jraph's wheel:
#
#   here, once:  echo /.whl/ >> .git/info/exclude
#                python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl jraph==0.0.6.dev0
#   call 1:      bash benchmarks/gpu_session.sh 1   (carry .whl)  GPU tests, CUDA lowering tests, bandwidth probe,
#                                                                 compile reports (gpu_check, full tier)
#   call 2:      bash benchmarks/gpu_session.sh 2   (carry .whl)  suites graphiler, ugcg, micro (vs reference, jraph, PyG)
#   call 3:      bash benchmarks/gpu_session.sh 3   (carry .whl)  suites hector, seastar; training memory
#
# Each call's steps share a budget of $GPU_SESSION_BUDGET seconds (default 540): a step gets what is left and is cut
# (exit 124) when it runs out, so the call returns inside the tool's 10-minute limit with what it finished. The
# tool brings back at most 8 files from $OUT, so each call leaves exactly two: gpu-session-N.tar.gz (every log,
# JSON, table and chart) and status-N.txt (one line per step: exit code and seconds; also printed last).
# Commit the results under benchmarks/results/ with the device, JAX version and date that each JSON's meta records.
set -uo pipefail
call=${1:?usage: bash benchmarks/gpu_session.sh 1|2|3}
out=${OUT:-out}
budget=${GPU_SESSION_BUDGET:-540}
work=$(mktemp -d)
status="$work/status-$call.txt"
mkdir -p "$out" "$work/data"

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false

# step NAME COMMAND...: run with the budget that is left, log to NAME.log, record the exit code and seconds.
step() {
  local name=$1 left=$(( budget - SECONDS )) t0=$SECONDS rc
  shift
  if (( left < 30 )); then
    echo "$name: skipped, budget spent" | tee -a "$status"
    return
  fi
  timeout --kill-after=10 "$left" "$@" >"$work/$name.log" 2>&1
  rc=$?
  echo "$name: rc=$rc $(( SECONDS - t0 ))s" | tee -a "$status"
}

suite() {  # suite NAME: one benchmark suite on the GPU, graphs cached for the call's other suites
  step "suite-$1" python3 -m benchmarks.run --suite "$1" --device gpu --row-timeout 240 \
    --data-cache "$work/data" --out "$work/$1-gpu.json"
}

step device sh -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  python3 -c "import jax; print(\"jax\", jax.__version__, jax.devices())"'
case "$call" in
  1)
    step pytest-gpu python3 -m pytest -q -m gpu --continue-on-collection-errors tests
    step pytest-cuda-lowering python3 -m pytest -q tests/test_kernels_lowering.py tests/test_fused_layers.py \
      -k "lowers or cuda"
    step bandwidth python3 -m benchmarks.gpu.bandwidth --out "$work/bandwidth-gpu.json"
    step gpu-check python3 -m benchmarks.gpu_check --full --jobs 12 --out "$work/gpu-check-full" ;;
  2)
    suite graphiler
    suite ugcg
    suite micro ;;
  3)
    suite hector
    suite seastar
    step memory python3 -m benchmarks.training_memory --repeats 20 --out "$work/training-memory-gpu.json" ;;
  *)
    echo "usage: bash benchmarks/gpu_session.sh 1|2|3" >&2
    exit 2 ;;
esac
rm -rf "$work/data"
tar czf "$out/gpu-session-$call.tar.gz" -C "$work" .
cp "$status" "$out/status-$call.txt"
echo "== call $call done in ${SECONDS}s; $out: gpu-session-$call.tar.gz, status-$call.txt"
cat "$status"

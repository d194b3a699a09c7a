#!/usr/bin/env bash
# One GPU session's work, in as few device calls as the 10-minute limit allows. Run from the repo root on the
# GPU machine, after carrying the jraph wheel (the device image has JAX 0.11.x and torch-geometric, not jraph):
#
#   here, once:  echo /.whl/ >> .git/info/exclude
#                python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl jraph==0.0.6.dev0
#   device call: bash benchmarks/gpu_session.sh tests      (carry: .whl)   ~5 min: pytest -m gpu + CUDA lowering
#   device call: bash benchmarks/gpu_session.sh micro      (carry: .whl)   kernels against byte floors
#   device call: bash benchmarks/gpu_session.sh graphiler  (carry: .whl)   GCN/GAT vs reference, jraph and PyG
#   device call: bash benchmarks/gpu_session.sh hector     (carry: .whl)   RGCN/RGAT/HGT
#   device call: bash benchmarks/gpu_session.sh memory     (carry: .whl)   training memory (Pubmed size)
#
# Everything lands in $OUT (the device tool brings it back); commit it under benchmarks/results/ with the
# device, the JAX version and the date that each JSON's "meta" records.
set -uo pipefail
what=${1:?usage: gpu_session.sh tests|micro|graphiler|hector|ugcg|seastar|memory}
out=${OUT:-out}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee "$out/device.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$out/device.txt"
case "$what" in
  tests)
    python3 -m pytest -q -m gpu tests 2>&1 | tee "$out/pytest-gpu.log"
    python3 -m pytest -q tests/test_kernels_lowering.py tests/test_fused_layers.py 2>&1 | tee "$out/pytest-kernels.log" ;;
  memory)
    python3 -m benchmarks.training_memory --repeats 20 --out "$out/training-memory-gpu.json" 2>&1 | tee "$out/memory.log" ;;
  *)
    python3 -m benchmarks.run --suite "$what" --device gpu --out "$out/$what-gpu.json" 2>&1 | tee "$out/$what.log" ;;
esac

#!/usr/bin/env bash
# One prepared GPU check for OVQ (issue 6). Written without a GPU: it has NOT been run yet.
#
#   bash benchmarks/gpu_check.sh            # results in $OUT if set, else outputs/benchmarks/gpu/
#
# 1. the Triton tests on the GPU: compiled kernels, no TRITON_INTERPRET (tests/test_ovq_triton.py picks
#    the GPU by itself when CUDA is available), plus the reference's own tests and the mixer contract;
# 2. op level, T = 1k .. 64k: OVQ on its Triton kernels (and on the PyTorch reference) against PyTorch
#    SDPA (flash, bf16; and fp32) and fla's Triton kernels for linear attention and Gated DeltaNet,
#    forward and forward + backward (benchmarks/gpu_ops.py);
# 3. layer level, all six mixers on the GPU: time and peak memory against T up to 64k, OVQ across N,
#    achieved FLOP/s of the OVQ read next to the GPU's matmul peak (benchmarks/speed_memory.py).
# Budget: about 8-10 minutes on one H100/H200-class GPU (each step has its own timeout).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-outputs/benchmarks/gpu}"
mkdir -p "$OUT"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python; fi
fi
unset TRITON_INTERPRET
export PYTHONUNBUFFERED=1

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__); print(torch.cuda.get_device_name())"
  "$PY" -c "import fla; print('fla', fla.__version__)" || echo "fla not installed: pip install 'ovq-cl[cuda]'"
} 2>&1 | tee "$OUT/environment.txt"

echo "== 1. tests on the GPU" | tee "$OUT/tests.txt"
timeout 420 "$PY" -m pytest -q -p no:cacheprovider tests/test_ovq_triton.py tests/test_ovq_op.py tests/test_mixers.py \
  2>&1 | tee -a "$OUT/tests.txt"

echo "== 2. op level vs SDPA flash and fla" | tee "$OUT/gpu_ops.txt"
timeout 300 "$PY" -m benchmarks.gpu_ops --max-T 65536 --batch 1 --repeats 5 --out "$OUT" 2>&1 | tee -a "$OUT/gpu_ops.txt"

echo "== 3. layer level, all mixers" | tee "$OUT/speed_memory.txt"
timeout 420 "$PY" -m benchmarks.speed_memory --device cuda --max-T 65536 --max-T-train 65536 --repeats 3 \
  --max-seconds 20 --out "$OUT" 2>&1 | tee -a "$OUT/speed_memory.txt"

echo "results in $OUT"

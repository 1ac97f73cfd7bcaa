#!/usr/bin/env bash
# One prepared GPU check for OVQ (issues 6 and 16), sized to one call of under 8 minutes on an H100/H200.
# Run on an H200 on 2026-11-29 (issue 6, in two calls): BENCHMARKS.md, section GPU, and results/gpu/.
#
#   bash benchmarks/gpu_check.sh            # results in $OUT if set, else outputs/benchmarks/gpu/
#   GPU_FULL=1 bash benchmarks/gpu_check.sh # also the layer-level run and fla's linear attention (+5 min)
#
# 0. packages missing from the GPU machine's image (omegaconf, fla-core) install from wheels in .whl/
#    when that folder exists (the machine has no network: download them beside the repo first);
# 1. the Triton tests on the GPU: compiled kernels (TRITON_INTERPRET=0: tests/conftest.py would switch
#    the interpreter on otherwise); tests/test_ovq_triton.py picks the GPU by itself (the split read,
#    TF32); the static-shape tests, with the CUDA-graph capture test that only a GPU runs;
# 2. op level, T = 1k .. 64k, batch 1: OVQ on its Triton kernels (dynamic; static shapes; static +
#    CUDA graphs per 16 chunks; the same with TF32 dots) against PyTorch SDPA (flash, bf16; and fp32)
#    and fla's Gated DeltaNet, forward and forward + backward (benchmarks/gpu_ops.py), after a profile
#    of one OVQ layer call (benchmarks/gpu_profile.py: launches and syncs per chunk, GPU-busy fraction);
# 3. throughput (benchmarks/throughput.py): tokens/s at batch 1, 8, 64 and T up to 16k (training) and
#    256k (inference, batch 1), ratios to SDPA flash in the same run.
# Each step has its own timeout, so a hang in one still leaves the others' results.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-outputs/benchmarks/gpu}"
mkdir -p "$OUT"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ovq_site .whl/*.whl \
    && export PYTHONPATH="/tmp/ovq_site${PYTHONPATH:+:$PYTHONPATH}"
fi

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv || true
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__); print(torch.cuda.get_device_name())"
  "$PY" -c "import fla; print('fla', fla.__version__)" || echo "fla not installed: pip install 'ovq-cl[cuda]'"
} 2>&1 | tee "$OUT/environment.txt"

echo "== 1. Triton tests on the GPU" | tee "$OUT/tests.txt"
timeout "${GPU_TESTS_S:-100}" "$PY" -m pytest -q -p no:cacheprovider tests/test_ovq_triton.py tests/test_ovq_static.py 2>&1 | tee -a "$OUT/tests.txt"

echo "== 2. op level vs SDPA flash and fla" | tee "$OUT/gpu_ops.txt"
timeout 40 "$PY" -m benchmarks.gpu_profile --T 4096 2>&1 | tee "$OUT/profile.txt"
# fla-linear last, alone: its first call autotunes for minutes (seen on an H200, fla-core 0.6.0)
timeout "${GPU_OPS_S:-150}" "$PY" -m benchmarks.gpu_ops --max-T 65536 --batch 1 --repeats 2 \
  --ops ovq,ovq-static,ovq-graph,ovq-tf32,sdpa-flash,sdpa-fp32,fla-gdn --out "$OUT" 2>&1 | tee -a "$OUT/gpu_ops.txt"

echo "== 3. throughput: tokens/s by batch and T, against SDPA flash and fla" | tee "$OUT/throughput.txt"
timeout "${GPU_THROUGHPUT_S:-130}" "$PY" -m benchmarks.throughput --batches 1,8,64 --max-T 16384 --max-T-infer 262144 \
  --max-tokens 1048576 --repeats 2 --max-seconds 8 --ops ovq-graph,ovq-tf32,ovq,sdpa-flash,sdpa-fp32,fla-gdn \
  --out "$OUT" 2>&1 | tee -a "$OUT/throughput.txt"

if [ -n "${GPU_FULL:-}" ]; then        # recorded on 2026-11-29 (BENCHMARKS.md); a second call reruns them
  echo "== 4. layer level, all mixers" | tee "$OUT/speed_memory.txt"
  timeout "${GPU_LAYERS_S:-190}" "$PY" -m benchmarks.speed_memory --device cuda --max-T 65536 --max-T-train 65536 \
    --repeats 2 --max-seconds 10 --out "$OUT" 2>&1 | tee -a "$OUT/speed_memory.txt"
  echo "== 5. fla linear attention (slow first call)" | tee "$OUT/fla_linear.txt"
  mkdir -p "$OUT/fla"
  timeout "${GPU_FLA_S:-120}" "$PY" -m benchmarks.gpu_ops --max-T 16384 --repeats 2 --ops sdpa-flash,fla-linear \
    --out "$OUT/fla" 2>&1 | tee -a "$OUT/fla_linear.txt"
fi

echo "results in $OUT"

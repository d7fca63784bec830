#!/usr/bin/env bash
# The GPU runs of this project, in one device call (see tools/README.md for the two-call recipe
# that carries the 94 MiB default model in two halves). Results land in $OUT.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
cat /tmp/sm/part00 .device/part01 > /tmp/sm/model.gguf
export STRATA_MODEL=/tmp/sm/model.gguf
python3 tools/gpu_check.py --model "$STRATA_MODEL" --out "$OUT/gpu_check.json" 2>&1 | grep -v "loading weights"
python3 tools/prefill_preempt_test.py --device gpu --chunk 256 --prompt-tokens 3000 --json "$OUT/preempt_parity_gpu.json" 2>&1 | grep -v "loading weights"
python3 tools/prefill_preempt_bench.py --device gpu --chunk 512 --a-tokens 8000 --b-delay 0.5 --repeats 5 --out "$OUT" 2>&1 | grep -v "loading weights"

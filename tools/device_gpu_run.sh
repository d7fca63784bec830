#!/usr/bin/env bash
# The GPU runs of this project. A device call carries at most 64 MiB and the default model is
# 94 MiB, so it travels in two halves (`split -n 2 -d MODEL .device/part`): a first call carries
# .device/part00 and copies it to /tmp/sm/; the next call, while the machine is warm, carries
# .device/part01 and the wheels in .whl/ (gguf, fastapi and their needs) and runs this script.
# Results land in $OUT. SKIP_CHECKS=1 runs only the benchmark and the decode profile.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
cat /tmp/sm/part00 .device/part01 > /tmp/sm/model.gguf
export STRATA_MODEL=/tmp/sm/model.gguf
[ "${SKIP_CHECKS:-}" ] || python3 tools/gpu_check.py --model "$STRATA_MODEL" --out "$OUT/gpu_check.json" 2>&1 | grep -v "loading weights"
[ "${SKIP_CHECKS:-}" ] || python3 tools/prefill_preempt_test.py --device gpu --chunk 256 --prompt-tokens 3000 --json "$OUT/preempt_parity_gpu.json" 2>&1 | grep -v "loading weights"
python3 tools/prefill_preempt_bench.py --device gpu --chunk 512 --a-tokens 8000 --b-delay 0.5 --repeats 5 --out "$OUT" 2>&1 | grep -v "loading weights"
python3 tools/gpu_profile_decode.py --model "$STRATA_MODEL" 2>&1 | grep -v "loading weights" | head -40

#!/usr/bin/env bash
# The Qwen2.5-Coder-0.5B fixture (469 MiB) goes to the device in parts: a call carries 64 MiB with the tree, which
# takes ~33 of them, so 30 MiB a part, sixteen calls of `gpu_run.sh qpart` back to back (the first one carrying
# .whl alone: the wheels and a part do not fit together). This stages part N alone in .device/q (the only path
# such a call carries), split from the fixture once (tools/fixtures/fetch_fixture.py fetches and checks it).
#   bash tools/device/stage_part.sh N      then run `bash tools/device/gpu_run.sh qpart` with carry [".device/q"]
set -euo pipefail
cd "$(dirname "$0")/../.."
parts=${STRATA_PARTS_DIR:-/tmp/strata_qparts}
if [ ! -f "$parts/part15" ]; then
  fixture=$(.venv/bin/python -c 'from tools.fixtures.fetch_fixture import fetch, cache_dir; print(fetch(cache_dir(), "coder-0.5b"))')
  mkdir -p "$parts" && (cd "$parts" && split -b 30M -d -a 2 "$fixture" part)
fi
rm -rf .device/q && mkdir -p .device/q && cp "$parts/part$(printf %02d "$1")" .device/q/
ls .device/q

#!/usr/bin/env bash
# Issue 44: `--step-tokens`' default chosen by measurement. For each budget in STEPS, the httpquick step
# (tools/device/http_quick.sh: the server as a user starts it on the 8B chat model, pool_bench's CASES) with
# step traces on, each under PER_S seconds; results in $OUT/steps.tgz (st<budget>/: a device call brings back
# only a few files).
#   STEPS="1024 2048 4096" CASES="subagents clients" REPEATS=3 LIMIT=75 bash tools/device/step_budget_sweep.sh
set -uo pipefail
export STRATA_STEP_TRACE=1 CASES="${CASES:-subagents clients}" REPEATS=${REPEATS:-3} LIMIT=${LIMIT:-75}
base=$OUT
for st in ${STEPS:-1024 2048 4096}; do
  mkdir -p "$base/st$st"
  OUT="$base/st$st" SERVER_FLAGS="--step-tokens $st ${SERVER_FLAGS:-}" timeout ${PER_S:-190} \
    bash tools/device/gpu_run.sh httpquick 2>&1 | tail -40
  gzip -f "$base/st$st/server.log"
done
tar -czf "$base/steps.tgz" -C "$base" $(cd "$base" && ls -d st*) && rm -rf "$base"/st*

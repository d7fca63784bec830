#!/usr/bin/env bash
# Issue 44: a step rule's default chosen by measurement. For each value in VALUES of the server flag FLAG
# (default: `--step-tokens` over STEPS), the httpquick step (tools/device/http_quick.sh: the server as a user starts
# it on the 8B chat model, pool_bench's CASES) with step traces on, each under PER_S seconds; results in
# $OUT/steps.tgz (v<flag>-<value>/: a device call brings back only a few files).
#   STEPS="1024 2048 4096" CASES="subagents clients" REPEATS=3 LIMIT=75 bash tools/device/step_budget_sweep.sh
#   FLAG=--decode-interval-ms VALUES="50 150 300" CASES="clients subagents hol" bash tools/device/step_budget_sweep.sh
#   (the decode steps' interval during reads: a burst's last first token against the decoders' gaps)
#   SETS="--decode-interval-ms=50,--step-ms=0 --decode-interval-ms=35,--step-ms=60" CASES=hol bash ...
#   (several flags a run: each set's flags comma-separated, each flag's value after =; v<the set>/ its results)
set -uo pipefail
export STRATA_STEP_TRACE=1 CASES="${CASES:-subagents clients}" REPEATS=${REPEATS:-3} LIMIT=${LIMIT:-75}
base=$OUT
sets=${SETS:-$(for value in ${VALUES:-${STEPS:-1024 2048 4096}}; do echo "${FLAG:---step-tokens}=$value"; done)}
for set in $sets; do  # (one flag a run: a set of one)
  flags=$(echo "$set" | tr ',=' '  ') name=$(echo "$set" | tr -d '-' | tr ',=' '_-')
  mkdir -p "$base/v$name"
  echo "=== $flags"
  OUT="$base/v$name" SERVER_FLAGS="$flags ${SERVER_FLAGS:-}" timeout ${PER_S:-190} \
    bash tools/device/gpu_run.sh httpquick 2>&1 | tail -40
  gzip -f "$base/v$name/server.log"
done
tar -czf "$base/steps.tgz" -C "$base" $(cd "$base" && ls -d v*) && rm -rf "$base"/v*

#!/usr/bin/env bash
# The pending patches' device check in one call that fits whatever the call was given (a session's first call when
# machines are scarce: a start may leave less than the 600 s gpu_run.sh's steps plan for).
#   LIMIT_S=450 bash tools/device/pending_check.sh      (LIMIT_S: the call's timeout_s, default 600)
# In order, each only while time is left: the patches applied (tools/device/apply_pending.sh); the host tier's
# byte-for-byte check and timing (hosttier); the real engine's paged checks, f16 then q8_0 (paged); then, traced,
# the defaults through HTTP (peers_strata: PEERS_CASES, default hol,clients,subagents, PEERS_REPEATS 3) with the
# server log kept, its bench's deadline moved up to the call's end (gpu_run.sh's steps count SECONDS from their
# start toward 560-600 s: SECONDS set in the environment moves their start back).
set -uo pipefail
limit=${LIMIT_S:-600}
start=$(date +%s)
spent() { echo $(( $(date +%s) - start )); }
left() { echo $(( limit - 15 - $(spent) )); }

bash tools/device/apply_pending.sh || { echo "PENDING PATCHES DID NOT APPLY"; exit 1; }
for step in hosttier "paged" "paged q8_0"; do
  [ "$(left)" -gt 60 ] || { echo "no time left for $step ($(spent) s spent)"; exit 0; }
  set -- $step
  KV_TYPE=${2:-} timeout -k 5 "$(left)" bash tools/device/gpu_run.sh "$1"
  echo "== $step done at $(spent) s"
done
[ "$(left)" -gt 150 ] || { echo "no time left for peers_strata ($(spent) s spent)"; exit 0; }
SECONDS=$(( $(spent) + 600 - limit )) KEEP_SERVER_LOG=1 STRATA_STEP_TRACE=1 \
  PEERS_CASES=${PEERS_CASES:-hol,clients,subagents} PEERS_REPEATS=${PEERS_REPEATS:-3} \
  bash tools/device/gpu_run.sh peers_strata
echo "== peers_strata done at $(spent) s"

#!/usr/bin/env bash
# What waits for a device check, in device calls back to back (each under ten minutes on a fresh machine), each
# part under its own limit, results packed in $OUT/pending.tgz (a call brings back only a few files). The
# patches of tools/device/pending/ are applied first (apply_pending.sh; main's tree kept as the before):
#   fusions   a decode step's fused kernels (matvec_act, matvec_norm, moe_act, ...): their checks, pdl_check, decode
#             before (when a patch is pending) and after on the 8B Q4_K_M and 135M shapes (gpu_run.sh fusions)
#   fusions80 the hybrids' fusions: hybrid_check, parity, the 80B-A3B shape before and after (gpu_run.sh fusions80)
#   checks    every kernel check without timings (gpu_run.sh checksonly): after a change to the launchers
#   fusedswitch decode with the fused matvecs off (the default) and on ($STRATA_FUSED_MATVEC=1), the 8B and 80B shapes
#   a3b       the 30B-A3B shape's resident decode with moe_act and without ($STRATA_MOE_ACT=0: gpu_run.sh moeactswitch)
#   a3b80     the same on the 80B-A3B hybrid's shape (gpu_run.sh moeactswitch80)
#   sampling  the batched draws (a row alone = in any batch = draw_segmented), the picks' graphs, their times
#   iq        gpu_run.sh weights: every GGUF type's dequant, embed and matvec against gguf's NumPy (the IQ types
#             among them), and mmq.cu's rows against the dp4a matvec's, every kind
#   spec      n-gram drafts as decode-graph rows: the same tokens with and without (tools/device/speculation_check.py)
#   specpace  the drafts' measured pace against every draft made, the 135M shape (gpu_run.sh specpace)
#   draft     --speculative draft on the GPU, self-drafts and the 135M drafting for the 8B shape, the same tokens
#             with and without (gpu_run.sh draftspec)
#   clients   the 64 clients and 16 sub-agents through HTTP as a user starts the server (the batched draws' gain)
#   qspec     issue 47 on the Qwen2.5-0.5B fixture (carried first in sixteen calls, tools/device/model_parts.sh, and
#             joined at /tmp/q/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf): the four workloads, Strata off / ngram, and 16
#             at once
#   hol       B beside A's 46.9K read and 4 / 16 / 64 decoders through HTTP (issue 44's B: short reads first)
#   hosttier  01-host-shelf-chunks-ahead (issue 44): the shelf's every byte back, its copies' and chunks' times
#             (gpu_run.sh hosttier), the real engine's paged checks with an f16 and a q8_0 cache, then, traced, the
#             defaults through HTTP (peers_strata: hol, clients, subagents x3; the 64 clients after the pool fills)
#             with the server log kept
#   issue44   what issue 44 still lacks, the Strata side (with the pending patches): gpu_run.sh hosttier, then the
#             defaults through HTTP traced with the server log kept (peers_strata: hol, clients, subagents, agent x3;
#             the 64 clients' runs 2-3 after the pool fills), then llama.cpp built for the next part
#   issue44b  the llama-server side in the same session (peers_llama, its default slots -np 66 -kvu -c 262144: the
#             same four cases, one run each), the HTTP ladder at 1 / 16 / 64 / 256 clients (gpu_run.sh clients), and
#             the 8B Q4_K_M shape's reads of 4K / 16K / 65K (gpu_run.sh benchq, SIZES): two calls on one machine
#   before44  the 64 clients through HTTP, traced and profiled (as profile44), on the patched tree, the HTTP ladder on
#             it, then the 64 clients on main's (.device/base): a host-side engine change's before and after
#   base44    before44's pair without the ladder, main's tree first (PROFILE_S= : no py-spy, the trace alone)
#   ladder    the HTTP ladder at 1 / 16 / 64 / 256 clients alone (texts against solo runs)
#   ladder256 the 256 clients on main's tree, then the ladder on the patched one, both traced (the step trace's
#             draws and decode lines: trace_waits.py --rows 64 on each clients_server.log)
#   drawsbehind the engine loop's lines with the draws behind the forward and without (gpu_run.sh drawsbehind)
#   profile44 the 64 clients through HTTP, traced, the engine sampled by py-spy meanwhile (waits included): where a
#             decode step's time on the host goes (tools/profiling/spy_summary.py), the draws lines' parts
#   issue44s  issue 44 through HTTP with the host tier's checks: gpu_run.sh hosttier (the copies ahead beside a stand-in
#             for steps, every byte back), the real engine's paged checks, then the defaults through HTTP traced with the
#             server log kept (peers_strata: hol, clients, subagents, agent x3; tools/profiling/clients_split.py: where
#             the 64 clients' slowest first token went), then the HTTP ladder at 1 / 16 / 64 / 256 clients: one call
#   hybrid    issue 45's GPU path: the attention kernels (256-wide heads among them), the hybrid fixtures against
#             transformers, the GPU path's exactness and park/resume parity (gpu_run.sh kernels, hybrid)
#   hybridbench issue 45's speed: the 80B-A3B shape (IQ3_S), its reads of 4K and 32K with their profile, decode at
#             1 / 16 / 64 (gpu_run.sh hybridbench)
#   offload   issue 46's expert cache: the 30B-A3B shape resident against 32 / 64 slots (gpu_run.sh offload): decode
#             graphs through the expert tables, the same bits as resident, the refills' counts
#   moe       the MoE kernels' checks (gpu_run.sh moecheck: routing, a decode step's and a prompt chunk's experts,
#             through the expert tables)
#   moegemm   the routed experts' prompt pass alone (tools/device/moe_gemm_bench.py), main's kernels and the patched
#             ones: each grouped GEMM's time, tensor-core rate and output digest; ncu's sections for moe_gemm_Q4_K
#   moeread   the 80B-A3B shape's ($NEXT_TYPE) reads of 4K and 32K, main's tree and the patched one (gpu_run.sh
#             moeread: the grouped experts' GEMM of 05-moe-gemm-bm128)
#   order     issue 48's slab order: mmq and the weight kernels' checks (gpu_run.sh order); orderbench: the 8B shape's
#             decode at 1-64 requests before and after, the 64-row profile (gpu_run.sh orderbench); ordershot: the two
#             trimmed to one call (no block shapes, no profile, one repeat); orderprobe: the kernels' times before and
#             after on one machine, and ncu's sections for mmq at 64 rows
#   sbq       issue 48's third probe: tools/device/sbq_check.py (gpu_run.sh sbq: x's form, every row the solo kernel's
#             bits, errors against the exact product, times on the 8B Q4_K_M shapes beside today's kernels), then
#             the 135M shape's prompt log-probabilities against the CPU's (gpu_run.sh logprobsynth)
#   PENDING=03 applies only tools/device/pending/03*.patch (apply_pending.sh).
#   PARTS=fusions bash tools/device/pending_round.sh        (carry [".whl", ".device"]; tools/device/setup.sh makes them)
# LIMIT_S: the call's timeout_s where a start left less than 600 s; every part's limit is cut to what is left of
# it (a part with under 30 s left is skipped), and gpu_run.sh's own deadlines move up to the call's end.
set -uo pipefail
limit=${LIMIT_S:-600}
cap() {  # a part's limit cut to what is left of the call's, at least 1 s (`timeout 0` would mean no limit)
  local left=$(( limit - 15 - SECONDS )); left=$(( $1 < left ? $1 : left )); echo $(( left > 1 ? left : 1 ))
}
traced_peers() {  # $1 the cases: the server's defaults through HTTP, traced, its log kept, three runs each
  [ "$(cap 600)" -gt 150 ] && env SECONDS=$(( SECONDS + 600 - limit )) KEEP_SERVER_LOG=1 STRATA_STEP_TRACE=1 \
    PEERS_CASES=$1 PEERS_REPEATS=3 timeout $(cap 300) bash tools/device/gpu_run.sh peers_strata 2>&1 \
    | grep -E "TTFT|median|agent|rror" | tail -30
}
profiled_clients() {  # $1 a prefix for its files: the 64 clients traced with py-spy sampling the engine, then the
  # 64-row steps' medians (trace_waits --rows) and where DecodeSteps.step's time went (spy_summary)
  PROFILE_S=${PROFILE_S-30} traced_peers clients
  for f in pool_strata.json server_strata.log.gz spy_strata.txt; do
    [ -f "$OUT/$f" ] && [ -n "$1" ] && mv "$OUT/$f" "$OUT/$1$f"
  done
  tail -2 /tmp/spy_strata.log
  python3 tools/profiling/trace_waits.py "$OUT/$1server_strata.log.gz" --rows 64 2>&1 | tail -3
  python3 tools/profiling/spy_summary.py "$OUT/$1spy_strata.txt" --within DecodeSteps.step --top 24
}
in_main_tree() {  # LABEL CMD...: CMD run in main's tree (.device/base, made at /tmp/base by gpu_run.sh basetree)
  local label=$1
  shift
  bash tools/device/gpu_run.sh basetree 2>&1 | tail -1
  [ -d /tmp/base/engine ] || return 0
  echo "--- before$label"
  (cd /tmp/base && "$@")
}
clients_256_before() {  # main's tree's 256 clients, traced, its files named before_
  STRATA_STEP_TRACE=1 CLIENTS=256 CLIENTS_LIMIT=$(cap 110) timeout $(cap 120) bash tools/device/gpu_run.sh clients 2>&1 \
    | tail -4
  for f in clients_h200.json clients_server.log; do [ -f "$OUT/$f" ] && mv "$OUT/$f" "$OUT/before_$f"; done
}
ladder() {  # the HTTP ladder at 1 / 16 / 64 / 256 clients
  CLIENTS=1,16,64,256 CLIENTS_LIMIT=$(cap 280) timeout $(cap 290) bash tools/device/gpu_run.sh clients 2>&1 | tail -12
}
bash tools/device/apply_pending.sh || { echo "A PENDING PATCH DOES NOT APPLY"; exit 1; }
base=$OUT
mkdir -p "$base/p"
export OUT="$base/p"
for part in ${PARTS:-fusions}; do
  echo "=== $part ($(date +%T), ${SECONDS} s into the call)"
  [ "$(cap 30)" -ge 30 ] || { echo "no time left for $part"; continue; }
  case $part in
    fusions) timeout $(cap 560) bash tools/device/gpu_run.sh fusions 2>&1 | tail -40 ;;
    fusions80) timeout $(cap 560) bash tools/device/gpu_run.sh fusions80 2>&1 | tail -30 ;;
    checks) timeout $(cap 300) bash tools/device/gpu_run.sh checksonly 2>&1 | tail -20 ;;
    fusedswitch) timeout $(cap 560) bash tools/device/gpu_run.sh fusedswitch 2>&1 | tail -20 ;;
    a3b) timeout $(cap 400) bash tools/device/gpu_run.sh moeactswitch 2>&1 | tail -10 ;;
    a3b80) timeout $(cap 500) bash tools/device/gpu_run.sh moeactswitch80 2>&1 | tail -10 ;;
    sampling) timeout $(cap 150) bash tools/device/gpu_run.sh sampling 2>&1 | tail -25 ;;
    drawsbehind) timeout $(cap 250) bash tools/device/gpu_run.sh drawsbehind 2>&1 | tail -6 ;;
    sbq)
      timeout $(cap 300) bash tools/device/gpu_run.sh sbq 2>&1 | grep -v "^strata:" | tail -30
      timeout $(cap 200) bash tools/device/gpu_run.sh logprobsynth 2>&1 | grep -v "^strata:" | tail -3 ;;
    iq) timeout $(cap 360) bash tools/device/gpu_run.sh weights 2>&1 | tail -30 ;;
    spec) timeout $(cap 240) bash tools/device/gpu_run.sh spec 2>&1 | tail -8 ;;
    specpace) timeout $(cap 300) bash tools/device/gpu_run.sh specpace 2>&1 | tail -4 ;;
    draft) timeout $(cap 500) bash tools/device/gpu_run.sh draftspec 2>&1 | tail -12 ;;
    clients)
      STRATA_STEP_TRACE=1 CASES="clients subagents" REPEATS=3 LIMIT=70 timeout $(cap 220) \
        bash tools/device/gpu_run.sh httpquick 2>&1 | grep -v "^INFO" | tail -20
      gzip -f "$OUT/server.log" ;;
    hybrid) timeout $(cap 480) bash tools/device/gpu_run.sh hybrid 2>&1 | tail -30 ;;
    hybridbench) timeout $(cap 200) bash tools/device/gpu_run.sh hybridbench 2>&1 | tail -10 ;;
    offload) timeout $(cap 420) bash tools/device/gpu_run.sh offload 2>&1 | tail -8 ;;
    order) timeout $(cap 520) bash tools/device/gpu_run.sh order 2>&1 | tail -40 ;;
    orderprobe) timeout $(cap 560) bash tools/device/gpu_run.sh orderprobe 2>&1 | tail -50 ;;
    ordershot) timeout $(cap 560) bash tools/device/gpu_run.sh ordershot 2>&1 | tail -40 ;;
    orderbench) timeout $(cap 520) bash tools/device/gpu_run.sh orderbench 2>&1 | tail -30 ;;
    moe) timeout $(cap 200) bash tools/device/gpu_run.sh moecheck 2>&1 | tail -6 ;;
    moeread) timeout $(cap 560) bash tools/device/gpu_run.sh moeread 2>&1 | tail -12 ;;
    moegemm) timeout $(cap 500) bash tools/device/gpu_run.sh moegemm 2>&1 | tail -40 ;;
    qspec) SPEC_CONCURRENCY=16 timeout $(cap 560) bash tools/device/gpu_run.sh qspec 2>&1 | tail -14 ;;
    hol) PEERS_CASES=hol PEERS_REPEATS=2 timeout $(cap 540) bash tools/device/gpu_run.sh peers_strata 2>&1 | tail -25 ;;
    hosttier)
      timeout $(cap 120) bash tools/device/gpu_run.sh hosttier 2>&1 | tail -4
      timeout $(cap 200) bash tools/device/gpu_run.sh paged 2>&1 | tail -6
      KV_TYPE=q8_0 timeout $(cap 200) bash tools/device/gpu_run.sh paged 2>&1 | tail -6
      traced_peers hol,clients,subagents ;;
    issue44)
      timeout $(cap 90) bash tools/device/gpu_run.sh hosttier 2>&1 | tail -4
      traced_peers hol,clients,subagents,agent
      timeout $(cap 400) bash tools/device/gpu_run.sh peers_build 2>&1 | tail -2 ;;
    issue44s)
      timeout $(cap 150) bash tools/device/gpu_run.sh hosttier 2>&1 | tail -6
      timeout $(cap 150) bash tools/device/gpu_run.sh paged 2>&1 | tail -6
      traced_peers hol,clients,subagents,agent
      python3 tools/profiling/clients_split.py "$OUT/pool_strata.json" 2>&1 | tail -3
      ladder ;;
    before44)  # the patched tree's 64 clients profiled, its ladder (its exactness first where time is short), then
      # main's tree's (.device/base, made at /tmp/base by gpu_run.sh basetree)
      echo "--- after"; profiled_clients after_
      ladder
      in_main_tree "" profiled_clients before_ ;;
    profile44) profiled_clients "" ;;
    ladder) ladder ;;
    ladder256)  # the 256 clients on main's tree (traced), then the patched tree's ladder (traced)
      in_main_tree " (256 clients)" clients_256_before
      echo "--- after"; STRATA_STEP_TRACE=1 ladder ;;
    base44)  # main's tree's 64 clients profiled (as before44's before), then the patched tree's: one machine's pair
      in_main_tree "" profiled_clients before_
      echo "--- after"; profiled_clients after_ ;;
    issue44b)
      PEERS_CASES=hol,clients,subagents,agent PEERS_REPEATS=1 timeout $(cap 300) bash tools/device/gpu_run.sh \
        peers_llama 2>&1 | grep -E "TTFT|median|agent|rror" | tail -20
      ladder
      SIZES=4096,16384,65536 FORMS=kept timeout $(cap 200) bash tools/device/gpu_run.sh benchq 2>&1 \
        | grep -E "prefill|decode_at" | tail -8 ;;
  esac
done
tar -czf "$base/pending.tgz" -C "$base" p && rm -rf "$base/p"

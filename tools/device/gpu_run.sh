#!/usr/bin/env bash
# The GPU runs of this project, on the device machine (see /work/.library/device): one call runs the
# steps named on the command line, in order, and leaves results under $OUT.
#
#   bash tools/device/gpu_run.sh kernels synth bench parity hol real
#
# kernels  tools/device/gpu_kernels_check.py: every kernel against NumPy, GEMM and attention speed
# weights  tools/device/gpu_kernels_check.py --only weights and tools/device/mmq_check.py --quick: every GGUF type's
#          kernels (the IQ types' too) against gguf's NumPy and the dp4a matvec's rows, no timings
# hybrid   issue 45: tools/device/hybrid_check.py (the hybrid fixtures against transformers, the GPU path's
#          exactness) and park/resume parity on each fixture (tools/checks/prefill_preempt_test.py)
# spec     tools/device/speculation_check.py (issue 47): n-gram drafts through the decode graphs, the same tokens
#          with and without them, on the 135M and 8B Q4_K_M shapes -> $OUT/speculation_gpu.json
# specpace the drafts' measured pace against every draft made (--draft-row-cost 0), the 135M shape
# draftspec --speculative draft on the GPU: self-drafts and the 135M drafting for the 8B shape, the same tokens
# sampling tools/device/gpu_kernels_check.py's sampling and argmax checks alone, with the picks' times (fast)
# hosttier tools/device/host_tier_check.py: the host tier's shelf against a copy a block, 800 blocks of the 8B shape's
#          KV evicted at once, f16 and q8_0, every block equal after the round trip (after apply_pending.sh: the
#          pending patch's page-locked slots and strided copies queued on the stream)
# logprobs tools/device/logprob_rows_check.py: a step's log-probabilities in one launch against the host sampler's, times
# sm90     the wgmma prompt attention (attention_sm90.cu) against NumPy alone (fast); on failure, again with
#          V's descriptor offsets swapped (V_LBO_IS_PANEL=0)
# longread bench/engine_bench.py prompt reads of 65,536 and 131,072 tokens, 8B shape in Q4_K_M, chunk 2048,
#          with STRATA_PROMPT_ATTENTION=sm90 and =mma (KINDS, SIZES override) -> $OUT/long_read.json
# profile  tools/profiling/gpu_profile_decode.py: one decode-graph replay of the 8B shape in Q4_K_M (and PROFILE_MODELS) under
#          ncu, each kernel's time and DRAM bytes against the replay's time -> $OUT/decode_profile.json;
#          PROFILE_ROWS="1 16 64" profiles batch steps too
# mmqround a change to mmq.cu in one call: tools/device/mmq_check.py (every kind bit for bit, Q4_K and Q6_K times), the 8B
#          step's profile at 64 rows, pdl_check (logits, greedy = eager), one request at 512, 16 and 64 requests
# order    issue 48's slab order (a pending patch): mmq_check (every kind bit for bit, times, block shapes), the weight
#          and fused kernels' checks, pdl_check; orderbench: the 8B Q4_K_M decode at 1-64 requests before and after
# detail   ncu's full sections (warp stalls, pipes, the SASS with its samples) for the kernels matching DETAIL_RE
#          (mmq) of the 8B Q4_K_M step at DETAIL_ROWS (64) rows -> $OUT/detail_<rows>rows_{details,source}.txt, and
#          tools/profiling/ncu_source_summary.py's instructions and stalls by opcode and code region -> _summary.txt
# decode   issue 23's round in one call (about 6 minutes once the 8B file exists): the kernel checks a decode
#          step's kernels have (weights, norm_rope, attention, fused_q8), the paged batch checks (135M shape),
#          tools/device/pdl_check.py on the 8B, 135M and 4-layer MoE shapes (same bits, greedy = eager, replay times),
#          the 8B step's profile at 1 and 64 rows, bench/engine_bench.py decode at 512 and 32K context, and
#          aggregate decode at 1, 16, 64 requests; each part under its own time limit
# attn32k  the 8B Q4_K_M step at 32,768 context, f16 and q8_0 cache, under ncu, and flash decoding's full sections
#          (stalls, SASS) with each -> $OUT/decode_profile_32k.json, $OUT/<kv>/detail_1rows_*.txt (and $OUT/f16_512/)
# a3b      issue 23's MoE figures in one call (Qwen3-30B-A3B shape, Q4_K_M): decode at 512 context, the step's
#          kernels under ncu, aggregate decode at 1, 16, 64 requests
# long32k  issue 23's 32K target: the 8B shape in Q4_K_M decoding at 512 and 32,768 context, with the f16 and the
#          q8_0 cache -> $OUT/engine_gpu_32k.json
# fusions  a decode step's fused kernels: their checks, pdl_check, decode at 1 and 16 rows before and after on the
#          8B Q4_K_M and 135M shapes (.device/base: tools/device/apply_pending.sh), the 1-row profile
# fusedswitch the fused matvecs off (default) and on ($STRATA_FUSED_MATVEC=1): decode on the 8B and 80B-A3B shapes
# checksonly every kernel check, no timings
# moeactswitch the 30B-A3B shape's resident decode with moe_act (default) and without ($STRATA_MOE_ACT=0)
# fusions80 the hybrids' fusions: the hybrid checks, then the 80B-A3B shape's decode at 1 and 16 rows before and after
# moedecode a MoE decode step's rows in one launch per kernel (issue 23): the moe kernel checks (a batch's rows
#          equal to each row alone, bit for bit) and times, tools/device/pdl_check.py and aggregate decode at 1-64 requests
#          on the 4-layer MoE shape; with .device/base/engine (`git archive REV engine | tar -x -C .device/base`)
#          the same aggregate decode on that engine, for a before/after in one call
# times    tools/profiling/decode_kernel_times.py: each decode kernel's GPU time per launch
# grammar  tools/device/gpu_grammar_check.py: constrained decoding (regex, JSON schema) on the GPU
# grammarcost bench/grammar_bench.py --gpu: the mask per token with the logits on the GPU (masked there: the mask goes to the device)
# moetimes tools/profiling/moe_decode_times.py: each kernel of a Qwen3-30B-A3B decode step, GPU time per launch
# families tools/device/gpu_families_check.py: qwen2, qwen3, qwen3moe and rope scaling on the GPU against the
#          reference fixtures; needs .device/smol_tok.gguf, the default model's tokenizer alone (1.7 MB:
#          tools/fixtures/make_synthetic_gguf.py OUT --vocab-only), for the fixtures' synthetic files to come out the same
# synth    synthetic GGUFs in /tmp/m: the Llama-3-8B shape (F16) and the SmolLM2-135M shape (Q4_1)
# small    bench/engine_bench.py on the 135M shape -> $OUT/engine_gpu.json (load, prefill, decode, profile)
# gpucheck tools/device/gpu_check.py on the 135M shape (Q4_1): the GPU's logits against NumPy's on the golden prompts,
#          decode graphs against eager steps, the engine process on the GPU, engine_bench at chunk 512 and 2048
#          -> $OUT/gpu_check_135m_shape.json (the real model's run is `real`, which needs its parts carried first)
# bench    the same on the 8B F16 shape
# synthq   the Llama-3-8B shape in Q4_K_M (Q4_K, with Q6_K for attn_v, ffn_down and the head)
# benchq   bench/engine_bench.py on it, --weights quantized and kept (FORMS: e.g. "quantized kept fp16"), reads of SIZES
#          (default 4096,16384) -> $OUT/engine_gpu.json
# big      the Llama-3-70B shape in Q4_K_M (~45 GB, made in /tmp/m after the others are removed):
#          load on one H200 and decode -> $OUT/engine_gpu.json
# paged    the KV pool on the GPU, 135M shape: park/resume parity (tools/checks/prefill_preempt_test.py), a prefix
#          reused from another request equal to a cold read, batches equal to solo runs; KV_TYPE=q8_0 runs
#          them on the 8-bit cache (results named _q8_0)
# long     tools/checks/long_context_run.py on the 8B shape in Q4_K_M with --kv-type q8_0: the 1M-token plan, a
#          262,144-token request read, parked half-way and resumed (parity), decode at that depth
# prefetch flash-decoding's DEC_PREFETCH variants side by side (tools/device/gpu_kernels_check.py --block-sweep 64
#          --define DEC_PREFETCH=0|1, twice each), after the kernel checks of the default (no timings)
# depth    decode at a 131,072-token context beside 512, f16 and q8_0 caches (tools/checks/long_context_run.py --no-park)
# startup  bench/startup_time.py: the server as a user starts it on the 8B shape in Q4_K_M, to /health 200, 3 times
# startupq the same on the Qwen3-8B shape in Q4_K_M with Qwen2.5's 151,665-token vocabulary; needs
#          .device/qwen_tok.gguf (tools/fixtures/make_synthetic_gguf.py OUT --preset qwen3-8b --vocab-only --tokenizer
#          the Qwen2.5-Coder fixture)
# longhttp_strata  bench/long_read_http.py: a 97,000- and a 130,000-token request through HTTP to
#          `python3 -m serve --model FILE` (8B shape, Q4_K_M) -> $OUT/long_read_http_strata.json
# longhttp_llama   the same to `llama-server -m FILE -ngl 99 -fa on -c 132000` (built first, as peers_build)
# tp       tools/checks/tp_check.py: tensor parallel's split (2 ranks, one process) against the whole 8B Q4_K_M model
#          on one GPU: logits and greedy tokens (issue 26's check before two GPUs are lent)
# chunkbench bench/chunk_default_bench.py on the 8B shape in Q4_K_M: the server as a user starts it per
#          --chunk (256..4096), a 97K-token request's time, a newcomer's wait behind a 32K read, start-up
# parity   tools/checks/prefill_preempt_test.py --device gpu on the 8B shape
# parityq  the same on the 8B shape in Q4_K_M (with the read beside three decoders, pausing per layer)
# hol      bench/prefill_preempt_bench.py on the 8B shape, A = 46,832 tokens, B 2 s in
# moe      a 4-layer qwen3moe of Qwen3-30B-A3B's layer shape (Q4_K_M): park/resume parity on the GPU
# bench8q  the Llama-3-8B and Qwen3-8B shapes in Q4_K_M side by side (bench/engine_bench.py: prompt
#          reads at 4,096 and 16,384 tokens, decode at 512 and 16K context)
# bencha3b the same on the Qwen3-30B-A3B shape in Q4_K_M
# hybridbench  issue 45: the Qwen3-Next-80B-A3B shape in IQ3_S (~35 GB, made on the machine): prompt reads of 4K and
#          32K, decode at 1 / 16 / 64 requests; hybridbench_llama: llama-bench and llama-batched-bench on the same file;
#          hybridlong: a 262,144-token request on it read, parked half-way and resumed (parity)
# drawsbehind a decode step's sampling rows drawn behind its forward against those drawn at the next step: the engine
#          loop's lines the same, 64 seeded requests on the 135M shape, a pool with room and one too small
#          (tools/device/draws_behind_check.py)
# realmodel the default model (SmolLM2-135M Q4_1, a real one) joined from parts carried in earlier calls
#          (tools/device/model_parts.sh): prompt log-probabilities against the CPU engine's, n-gram speculation on it
# offload  issue 46: tools/device/expert_cache_check.py on the Qwen3-30B-A3B shape (resident vs 32 / 64 slots; 1, 4, 16 requests)
# offloadpeers issue 46 against llama.cpp through HTTP: Strata at --gpu-memory CAP, llama-server with --n-cpu-moe for the
#          same cap, for each of OFFLOAD_CAPS (16 full): decode at 1 and 4 clients, a 4K prompt, memory (builds llama-server)
# batch    bench/batch_decode_bench.py: aggregate decode at 1, 2, 4, 8, 16 requests in slots, and each
#          request's tokens equal to its solo run's (batch invariance), on the 135M shape (Q4_1) and
#          the Llama-3-8B shape in F16 and Q4_K_M -> $OUT/batch_decode_gpu.json
# mmv      tools/device/mmv_check.py: the tensor-core fp16 matvec against NumPy, batch invariance, its time
# mmq      tools/device/mmq_check.py: the int8 tensor-core quantized matvec: every row equal to the dp4a matvec's
#          row alone (bit for bit), NumPy, its time beside the dp4a kernels at 1-64 rows, the block's knobs
# sbq      tools/device/sbq_check.py: issue 48's third probe, integer sums over a Q4_K super-block (x in Q8K), one
#          chain an output: x's form against NumPy, every row the solo kernel's bits, errors, times beside today's
# q8kcheck tools/device/q8k_check.py (issue 48): the decode step's producers write their rows' Q8K for sbq.cu's
#          matvecs, byte for byte NumPy's of the fp16 rows -> $OUT/q8k_check.json
# sbqdecode the engine with sbq.cu ($STRATA_SBQ=1) against without: 8B Q4_K_M decode at
#          1 / 16 / 64 requests, each request's tokens against its solo run's
# gemmprobe tools/device/prompt_gemm_probe.py (issue 44): whether cuBLAS's prompt GEMM rows depend on the step's rows
#          (M, offset; default, CUBLAS_WORKSPACE_CONFIG=:0:0, pedantic), fixed slices and batched forms with their
#          times, mmq.cu against expand + cuBLAS at 64-4096 rows -> $OUT/prompt_gemm_probe.json (PROBE_ARGS: its flags)
# decodegemm the same probe at decode sizes, without cuBLAS's workspace as the engine runs: cuBLAS on the fp16 weights
#          against the decode matvec at 1-256 rows, each row's bits at 1-64 rows against 4,096 -> decode_gemm_probe.json
# shared   tools/device/shared_steps_check.py (issue 44): the start-up check (runner.shape_free), a read cut anywhere,
#          reads sharing steps and a decode row after them, bit for bit, on the 135M shape (Q4_1), the 8B shape in
#          Q4_K_M and the 4-layer Qwen3-MoE shape, f16 and q8_0 caches -> $OUT/shared_steps_h200.json
# httpquick tools/device/http_quick.sh: the server as a user starts it (SERVER_FLAGS: flags added) on the 8B shape in Q4_K_M, pool_bench cases
#          (CASES, default subagents) each under LIMIT seconds, the log checked
# batchf16 the batch step on the 8B F16 shape only (batchq: on the Q4_K_M one); BATCHES=1,4,16,64 sets the sizes
# wide     tools/profiling/matvec_wide_times.py: quantized launches of 16 rows with 2, 4, 8 weight rows a warp
# agent    bench/agent_reuse_bench.py on the 8B shape (Q4_K_M): a 10-turn conversation growing to 16K
#          tokens, time to first token with prompt reuse and without -> $OUT/agent_reuse_gpu.json
# mixed    bench/mixed_load_bench.py on the 8B shape (Q4_K_M): A reads 46,832 tokens while 4 clients
#          decode, B (short) arrives 2 s in -> $OUT/mixed_load_gpu.json
# real     the real default model: tools/device/gpu_check.py and parity. The model (94 MiB) is larger than
#          one call may carry (64 MiB, the tree and .whl included): earlier calls on the same warm
#          machine carry .device/part00, part01 (`split -n 3 -d MODEL .device/part`), one each, and run
#          `bash tools/device/gpu_run.sh stash`; the call with `real` carries the last part.
# peers_strata  issue 21's table through HTTP (bench/pool_bench.py: B beside A and 4/16/64 decoders, 64
#          clients at once, 16 sub-agents sharing a 5.9K-token system prompt, KV held by finished
#          conversations; with PEERS_CASES=agent, issue 44's agent loop: 20 turns growing to 30K tokens) against
#          Strata started as a user starts it (`python3 -m serve --model FILE`) on
#          the Llama-3-8B shape in Q4_K_M with the Llama-3.1 chat template -> $OUT/pool_strata.json
# qpart    one part of the Qwen2.5-Coder-0.5B fixture per call (.device/q/partNN from `split -b 50M -d -a 2`),
#          gathered in /tmp/q on the warm machine; qpeers_strata, qpeers_llama: llama.cpp's server test scripts
#          (bench/peer_scripts.py) against Strata and llama-server on it -> $OUT/peer_scripts_*_h200.json (issue 22)
# specdefault  issue 47's default drafter on a GPU (pending 01-speculation-default-gpu): the clients ladder with it
#          and with --speculative off, the texts against solo runs -> $OUT/clients_spec_*.json
# qspec    issue 47 on the fixture (after qpart): bench/speculation_bench.py, Strata --speculative off / ngram;
#          and 16 requests at once (SPEC_CONCURRENCY); SPEC_TRACE=1: again with each step traced (the logs);
#          qspec_llama: llama-server off / ngram-simple on the same file -> $OUT/speculation_gpu.json
# peers_build   llama.cpp's llama-server (CUDA, sm_90) built from .device/llama.tgz in /tmp/llama (about
#          4 minutes on 16 cores; skipped when built; a build cut short by the call's end resumes)
# peers_llama   the same client against `llama-server -m FILE -ngl 99 -fa on -np 66 -kvu -c 262144` (built
#          first if need be) -> $OUT/pool_llama.json. 66 slots: 64 decoders + A + B each get a slot at
#          once (fewer, and A and B wait for a decoder to finish: the slot count measured, not the
#          server); one unified KV buffer (-kvu) shared by all slots, 256K positions (32 GiB), so any
#          slot can hold A (46.9K) while 64 others decode: 66 separate slots of 50K would need 3.3M
#          positions (412 GiB). Strata's pool takes what its weights leave of the GPU.
#          LLAMA_SLOTS replaces "-np 66 -kvu -c 262144" (e.g. "-np 16 -c 131072", the slots a case needs, each
#          its own KV: with -kvu its 64-client figures were 2-3x worse).
#          Both steps stop their bench by 560 s into the call (partial JSON is kept); PEERS_CASES and
#          PEERS_REPEATS override the cases (hol,clients,subagents,kv; agent too) and the repeats (3).
#          .device/llama.tgz: the llama-cpp-python sdist's vendor/llama.cpp, packed as ../shared/PEERS.md says.
#
# coldstart  issue 42: the server's first start with CuPy's kernel cache emptied (the kernels compiled in parts on
#          every core, engine/kernels/build.py), then two warm starts -> $OUT/startup_cold_h200.json
# upload   tools/device/upload_check.py: the 8B Q4_K_M weights loaded through pinned buffers and by cupy.asarray,
#          alternating (UPLOAD_THREADS, 2,4,8), seconds and every weight equal -> $OUT/upload_h200.json
# graphseq tools/device/decode_graph_sequence_check.py on the 8B shape: decode graphs through batches growing to 1, 63, 64,
#          65, 128, 256 rows and back, each row against its solo decode; graphseqbase: the same on the engine before
#          the fix (.device/base, `git archive REV engine serve protocol | tar -x -C .device/base` plus this tool, at
#          tools/device/, and bench/clients_bench.py); graphseqmem: on the 135M shape under compute-sanitizer's memcheck
# promptweights tools/device/prompt_weights_check.py on the 8B Q4_K_M and 135M shapes: kept prompt weights give the
#          expanded-each-step bits, and the prompt steps' times both ways
# servercost bench/server_cost_bench.py on this machine's CPU: the server's own CPU a request and a token (no model)
# clients  bench/clients_bench.py: the server as a user starts it, 1, 16, 64, 128, 256 streaming clients (300-word
#          prompts, 256 tokens), gaps between tokens, restarts, texts against solo runs; clientsbase: on .device/base
# Python packages the device image lacks travel as wheels in .whl/ (gguf, fastapi and their needs): made here by
# tools/device/setup.sh (with .device/tok.gguf).
set -euo pipefail
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  # the wheels for this interpreter (.whl/ may hold several Python versions' builds)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    --find-links .whl $(ls .whl | sed 's/-[0-9].*//' | sort -u)
  export PYTHONPATH=/tmp/site
elif [ -d /tmp/site ]; then  # installed by an earlier call on this warm machine
  export PYTHONPATH=/tmp/site
fi
mkdir -p /tmp/m /tmp/sm
M8=/tmp/m/llama3-8b-f16.gguf
MS=/tmp/m/smollm2-135m-q4_1.gguf
MQ=/tmp/m/llama3-8b-q4_k_m.gguf
M70=/tmp/m/llama3-70b-q4_k_m.gguf
MQ3=/tmp/m/qwen3-8b-q4_k_m.gguf
MQ3Q=/tmp/m/qwen3-8b-q4_k_m-qwen-vocab.gguf  # with Qwen2.5's 151,665-token vocabulary (.device/qwen_tok.gguf)
MQA=/tmp/m/qwen3-30b-a3b-q4_k_m.gguf
NEXT_TYPE=${NEXT_TYPE:-IQ3_S}  # the Qwen3-Next-80B-A3B shape's type (IQ3_S ~35 GB, Q4_K_M ~48 GB): the hybrid steps'
MNX=/tmp/m/qwen3-next-80b-a3b-${NEXT_TYPE,,}.gguf
MQS=/tmp/m/qwen3moe-4layer-q4_k_m.gguf
MQC=/tmp/m/llama3-8b-q4_k_m-chat-l3.gguf  # the 8B shape in Q4_K_M with Llama 3's own vocabulary (llama.cpp's
# ggml-vocab-llama-bpe.gguf, 128,256 tokens) and the Llama-3.1 chat template: servers render chats, and the template's
# control tokens (<|start_header_id|>, <|eot_id|>) are tokens of the vocabulary, as in the real model's file
LLAMA=/tmp/llama
MQW=/tmp/q/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf  # the real-model fixture (issue 22), carried in parts
quiet() { grep --line-buffered -v "loading weights" || true; }
strata_version() { echo "strata $(python3 -c 'import engine; print(engine.__version__)' 2>/dev/null)"; }

base_tree() {  # the "before" of a before/after run at /tmp/base: this tree under what .device/base holds (main's
  # engine, bench and tools, kept by apply_pending.sh; or an engine alone put there by hand), with this tree's .device
  # and .whl linked (the models' tokenizer, the wheels); false when none is kept
  [ -d .device/base/engine ] || return 1
  rm -rf /tmp/base && mkdir /tmp/base && cp -r bench protocol serve tests tools pyproject.toml /tmp/base/ \
    && cp -r .device/base/. /tmp/base/ && ln -s "$PWD/.device" /tmp/base/.device && ln -s "$PWD/.whl" /tmp/base/.whl
}
in_both_trees() {  # FN: FN from main's tree's root (base_tree, with TAG=-before; when a patch is pending), then from
  # this one's (TAG empty): a before/after run on one machine
  local dir
  for dir in /tmp/base .; do
    TAG=""
    if [ $dir = /tmp/base ]; then base_tree || continue; TAG=-before; fi
    (cd $dir && "$@")
  done
}
batch_before_after() {  # LABEL JSON LIMIT PATTERN ARGS...: bench/batch_decode_bench.py ARGS in both trees (in_both_trees),
  # labelled LABEL-before and LABEL, into $OUT/JSON; its lines matching PATTERN shown
  local label=$1 json=$2 limit=$3 pattern=$4
  shift 4
  local args=("$@")
  batch_run() {
    timeout $limit python3 bench/batch_decode_bench.py "${args[@]}" --label "$label$TAG" --json "$OUT/$json" 2>&1 \
      | grep "$pattern" || echo "BATCH DECODE BENCH FAILED ($label$TAG)"
  }
  in_both_trees batch_run
}
decode_before_after() {  # MODEL LABEL JSON REPEATS BATCHES [LIMIT] [STEPS]: the aggregate decode at 512 context
  batch_before_after "$2" "$3" ${6:-150} "requests:" --model $1 --device gpu --context 512 --steps ${7:-32} \
    --repeats $4 --batches $5
}
reads_before_after() {  # MODEL LABEL JSON: the prompt reads alone of 4K and 32K, the 4K read profiled
  batch_before_after "$2" "$3" 150 "read\|profile, read" --model $1 --device gpu --context 512 --steps 8 --repeats 1 \
    --batches 1 --chunk 2048 --reads 4096,32768 --profile 4096
}
synth_mq() {  # the Llama-3-8B shape in Q4_K_M, made once per machine
  [ -f $MQ ] || python3 tools/fixtures/make_synthetic_gguf.py $MQ --preset llama3-8b --type Q4_K_M --tokenizer .device/tok.gguf 2>&1 | tail -1
}

synth_ms() {  # the SmolLM2-135M shape in Q4_1, made once per machine, with a chat template (whichever step makes it:
  # .device/tok.gguf may be a vocabulary without one, and the paged checks' engines render chats)
  [ -f $MS ] || python3 tools/fixtures/make_synthetic_gguf.py $MS --preset smollm2-135m --type Q4_1 --tokenizer .device/tok.gguf \
    --chat-template tests/fixtures/templates/meta-llama-Llama-3.1-8B-Instruct.jinja 2>&1 | tail -1
}

decode_switch() {  # VAR NAME [BENCH ARGS...]: the 8B Q4_K_M shape's decode at 1 / 16 / 64 requests with $VAR=0 and
  # =1 (an opt-in route), each request's tokens against its solo run's -> $OUT/batch_decode_NAME.json
  local var=$1 name=$2 v
  shift 2
  synth_mq
  for v in 0 1; do
    env $var=$v timeout 200 python3 bench/batch_decode_bench.py --model $MQ --device gpu --context 512 --steps 32 \
      --repeats 3 --batches 1,16,64 "$@" --label llama3-8b-shape-q4_k_m-$name$v --json "$OUT/batch_decode_$name.json" \
      2>&1 | grep -E "requests:|Error" || echo "DECODE $name ($v) FAILED"
  done
}

synth_a3b() {  # the Qwen3-30B-A3B shape in Q4_K_M, made once per machine (with a chat template: servers render chats)
  [ -f $MQA ] || python3 tools/fixtures/make_synthetic_gguf.py $MQA --preset qwen3-30b-a3b --type Q4_K_M --tokenizer .device/tok.gguf \
    --chat-template tests/fixtures/templates/meta-llama-Llama-3.1-8B-Instruct.jinja 2>&1 | tail -1
}
offload_bench() {  # NAME CAP COMMAND...: issue 46's figures of one server on $MQA: decode through HTTP at 1 and 4
  # clients (128 tokens), a 4K- and a 32K-token prompt's first token (words: ~1.89 tokens each), the GPU memory and
  # the server's host memory it took, and (Strata) the expert cache's counts from /status
  local name=$1 cap=$2 n words flags
  shift 2
  flags="$*"  # (the server's command, as pool_bench records it)
  [ $SECONDS -lt 520 ] || { echo "$name at $cap: no time left in this call"; return 0; }
  start_server $name "$@" || return 0
  echo "$name at $cap: GPU $(nvidia-smi --query-gpu=memory.used --format=csv,noheader), host RSS of the server's" \
    "processes $(ps -o rss= --pid $SERVER_PID --ppid $SERVER_PID | awk '{s += $1} END {printf "%.1f GiB", s / 2^20}')"
  # (pool_bench's clients case: CLIENTS WORDS TOKENS REPEATS, its JSON's name)
  offload_case() { timeout -k 10 $((590 - SECONDS)) python3 bench/pool_bench.py --url http://127.0.0.1:8080 \
    --label "$name" --cases clients --clients $1 --client-words $2 --client-tokens $3 --repeats $4 --tokenizer $MQA \
    --server-flags "$flags" --json "$OUT/offload_${name}_${cap}_$5.json" 2>&1 | grep -i "ttft" | tail -1 \
    || echo "OFFLOAD CASE $5 CUT"; }
  for n in 1 4; do offload_case $n 100 128 2 clients$n; done
  for words in 2150 17000; do offload_case 1 $words 16 1 read$words; done
  [ $name = strata ] && curl -s http://127.0.0.1:8080/status | python3 -c "import json, sys; s = json.load(sys.stdin); \
print('expert cache:', json.dumps(s.get('kv', {}).get('expert_cache')))" 2>&1 | tail -1
  echo "$name at $cap after: GPU $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
  cp /tmp/server_$name.log "$OUT/offload_${name}_${cap}.log" 2>/dev/null || true
  stop_server $name
}

synth_next() {  # the Qwen3-Next-80B-A3B shape in $NEXT_TYPE, made once per machine; the disk (64 GB) holds it beside
  # the 8B Q4_K_M shape only: the F16 8B, the 30B-A3B and the shape's other type are removed first
  rm -f $M8 $MQA
  for f in /tmp/m/qwen3-next-80b-a3b-*.gguf; do [ "$f" = $MNX ] || rm -f "$f"; done
  [ -f $MNX ] || python3 tools/fixtures/make_synthetic_gguf.py $MNX --preset qwen3-next-80b-a3b --type $NEXT_TYPE \
    --tokenizer .device/tok.gguf 2>&1 | tail -1  # (the default model's 49K vocabulary: a smaller head than Qwen's 152K)
}

next_strata() {  # issue 45's speed, Strata's half: the 80B-A3B shape's prompt reads of 4K and 32K (with the 4K read's
  # profile), decode at 1 / 16 / 64 requests (bench/engine_bench.py drives no hybrid: batch_decode_bench's reads alone)
  synth_next
  timeout 300 python3 bench/batch_decode_bench.py --model $MNX --device gpu --context 512 --steps 32 --repeats 1 \
    --chunk 2048 --reads 4096,32768 --profile 4096 --batches 1,16,64 --label qwen3-next-80b-a3b-shape-${NEXT_TYPE,,} \
    --json "$OUT/batch_decode_next.json" 2>&1 | quiet | tail -8
}

next_llama() {  # llama.cpp on the same file: llama-bench (prompt 4K / 32K, decode) and llama-batched-bench
  synth_next; build_llama
  timeout -k 10 $((580 - SECONDS)) cmake --build $LLAMA/build --target llama-bench llama-batched-bench -j 16 \
    > /tmp/llama_build_bench.log 2>&1 || tail -5 /tmp/llama_build_bench.log
  timeout 240 $LLAMA/build/bin/llama-bench -m $MNX -ngl 99 -fa 1 -p 4096,32768 -n 64 -r 2 -o json \
    > "$OUT/llama_bench_next.json" 2> /tmp/llama_bench.log || tail -5 /tmp/llama_bench.log
  timeout 200 $LLAMA/build/bin/llama-batched-bench -m $MNX -ngl 99 -fa on -c 40960 -npp 128 -ntg 128 \
    -npl 1,16,64 > "$OUT/llama_batched_next.txt" 2>&1 || tail -5 "$OUT/llama_batched_next.txt"
}

synth_moe_small() {  # a 4-layer Qwen3-MoE shape in Q4_K_M (128 experts, 8 used), made once per machine
  [ -f $MQS ] || python3 tools/fixtures/make_synthetic_gguf.py $MQS --arch qwen3moe --layers 4 --dim 2048 --ffn 6144 \
    --heads 32 --kv-heads 4 --head-dim 128 --experts 128 --experts-used 8 --expert-ffn 768 --ctx 8192 \
    --type Q4_K_M --tokenizer .device/tok.gguf 2>&1 | tail -1
}

# peers: one server on :8080 at a time, bench/pool_bench.py against it, then the server stopped
start_server() {  # NAME COMMAND...: the server in the background, SERVER_PID set once /health answers (else 1, at
  # once when its engine could not be started: bench/server_health.py)
  local name=$1 waited=0 state
  shift
  "$@" > /tmp/server_$name.log 2>&1 &
  SERVER_PID=$!
  while true; do
    python3 bench/server_health.py; state=$?
    [ $state = 0 ] && break
    if [ $state = 2 ] || ! kill -0 $SERVER_PID 2>/dev/null || [ $waited -ge 600 ]; then
      echo "$name did not start"; tail -30 /tmp/server_$name.log; kill -9 $SERVER_PID 2>/dev/null || true; return 1
    fi
    sleep 1; waited=$((waited + 1))
  done
  echo "$name ready after ~${waited} s ($SECONDS s into the call): $*"
}
stop_server() {  # NAME: SIGINT, then SIGKILL to the server and its children after 30 s
  local children
  children=$(pgrep -P $SERVER_PID | tr '\n' ' ' || true)
  kill -INT $SERVER_PID 2>/dev/null || true
  for _ in $(seq 30); do kill -0 $SERVER_PID 2>/dev/null || break; sleep 1; done
  kill -9 $SERVER_PID $children 2>/dev/null || true
  wait $SERVER_PID 2>/dev/null || true
  echo "--- $1 server log, last lines"; tail -5 /tmp/server_$1.log
  [ -n "${KEEP_SERVER_LOG:-}" ] && gzip -c /tmp/server_$1.log > "$OUT/server_$1.log.gz"  # (with STRATA_STEP_TRACE=1:
  # a line per engine step, engine/loop/step_trace.py)
  return 0
}
profile_engine() {  # NAME: py-spy samples the server's engine process for $PROFILE_S s from now, waits included
  # (--idle: a step's GPU waits show as such), into $OUT/spy_NAME.txt (folded stacks; .whl carries py-spy)
  local engine
  engine=$(pgrep -P $SERVER_PID -f "engine" | head -1 || true)
  [ -n "$engine" ] || { echo "no engine process to profile"; return 0; }
  /tmp/site/bin/py-spy record --pid $engine --duration $PROFILE_S --rate 500 --idle --format raw \
    --output "$OUT/spy_$1.txt" > /tmp/spy_$1.log 2>&1 &
}
serve_and_bench() {  # NAME JSON VERSION COMMAND...
  local name=$1 json=$2 version=$3
  shift 3
  start_server $name "$@" || return 0
  [ -n "${PROFILE_S:-}" ] && profile_engine $name
  if [ $SECONDS -gt 500 ]; then
    echo "no time left in this call for the bench"
  else timeout -k 10 $((560 - SECONDS)) python3 bench/pool_bench.py --url http://127.0.0.1:8080 --label $name \
    --server-flags "$*" --server-version "$version" --tokenizer ${BENCH_TOKENIZER:-$MQC} --repeats ${PEERS_REPEATS:-3} --cases ${PEERS_CASES:-hol,clients,subagents,kv} \
    --json "$OUT/$json" || echo "POOL BENCH ($name) FAILED OR CUT SHORT"
  fi
  stop_server $name
}
qwen_fixture() {  # the fixture from the parts earlier calls left in /tmp/q, its SHA-256 checked
  [ -f $MQW ] || cat /tmp/q/part?? > $MQW
  echo "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32  $MQW" | sha256sum -c - \
    || { rm -f $MQW; ls -la /tmp/q; return 1; }
}
serve_and_scripts() {  # NAME JSON COMMAND...: llama.cpp's URL test scripts against a server (bench/peer_scripts.py)
  local name=$1 json=$2
  shift 2
  start_server $name "$@" || return 0
  timeout -k 10 $((570 - SECONDS)) python3 bench/peer_scripts.py --scripts $LLAMA/scripts --port 8080 --label "$name: $*" \
    --limit-s ${SCRIPT_LIMIT_S:-170} --out "$OUT/$json" || echo "PEER SCRIPTS ($name) CUT SHORT"
  stop_server $name
}
build_llama() {
  [ -x $LLAMA/build/bin/llama-server ] && return 0
  [ -f $LLAMA/CMakeLists.txt ] || { mkdir -p $LLAMA && tar -xzf .device/llama.tgz -C $LLAMA; }
  [ -f $LLAMA/build/build.ninja ] || cmake -S $LLAMA -B $LLAMA/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DCMAKE_BUILD_TYPE=Release > /tmp/llama_cmake.log 2>&1 || { tail -20 /tmp/llama_cmake.log; return 0; }
  [ $SECONDS -lt 540 ] || { echo "no time left in this call for the llama.cpp build"; return 0; }
  timeout -k 10 $((580 - SECONDS)) cmake --build $LLAMA/build --target llama-server -j 16 > /tmp/llama_build.log 2>&1 \
    || { echo "llama-server build failed or cut short (it resumes on the next call)"; tail -5 /tmp/llama_build.log; }
}
ncu_detail() {  # DIR ROWS ARGS...: ncu's full sections and SASS for the kernels gpu_profile_decode.py's --detail
  # (in ARGS) matches, into DIR/detail_<ROWS>rows_*.txt, and ncu_source_summary.py's digest of them
  local dir=$1 rows=$2
  shift 2
  mkdir -p "$dir"
  timeout 300 python3 tools/profiling/gpu_profile_decode.py --rows $rows --detail-out "$dir" "$@" 2>&1 | tail -5 \
    || echo "DETAIL FAILED ($rows rows: $*)"
  python3 tools/profiling/ncu_source_summary.py "$dir/detail_${rows}rows_source.txt" > "$dir/detail_${rows}rows_summary.txt" \
    && sed -n 1,30p "$dir/detail_${rows}rows_summary.txt"
}
chat_model() {
  [ -f $MQC ] || python3 tools/fixtures/make_synthetic_gguf.py $MQC --preset llama3-8b --type Q4_K_M \
    --tokenizer tests/fixtures/vocab/ggml-vocab-llama-bpe.gguf \
    --chat-template tests/fixtures/templates/meta-llama-Llama-3.1-8B-Instruct.jinja 2>&1 | tail -1
}

for step in "$@"; do
  echo "=== $step ($(date +%T))"
  case $step in
    stash)  # the parts of the default model this call carries (.device/partNN; a call carries 64 MiB), kept for `real`
      cp .device/part* /tmp/sm/ && ls /tmp/sm ;;
    kernels)
      python3 tools/device/gpu_kernels_check.py --json "$OUT/kernels.json" || echo "KERNEL CHECKS FAILED" ;;
    checksonly)  # every kernel check, no timings
      python3 tools/device/gpu_kernels_check.py --no-speed --json "$OUT/kernels.json" | grep -v "^ok " \
        || echo "KERNEL CHECKS FAILED" ;;
    sampling)  # the sampler's checks alone (launched picks against NumPy's, graph picks against launched ones, the
      # batched draws: a row alone = in any batch, = draw_segmented) and the picks' times
      python3 tools/device/gpu_kernels_check.py --only sampling,argmax --json "$OUT/sampling_check.json" \
        | grep -v "^ok " || echo "SAMPLING CHECKS FAILED" ;;
    weights)  # every GGUF type's dequant, embed and matvec against gguf's NumPy (the IQ types among them), and mmq.cu's
      # rows against the dp4a matvec's alone, every kind (no timings)
      timeout 200 python3 tools/device/gpu_kernels_check.py --only weights --no-speed --json "$OUT/weights_check.json" \
        | grep -v "^ok " || echo "WEIGHT CHECKS FAILED"
      timeout 150 python3 tools/device/mmq_check.py --quick --json "$OUT/mmq_check.json" | grep -v "^ok " \
        || echo "MMQ CHECK FAILED" ;;
    hybrid)  # issue 45: the hybrid families on the GPU: the fixtures against transformers and the GPU path's exactness
      # (tools/device/hybrid_check.py), the attention kernels (256-wide heads among them), then park/resume parity
      # through the engine on each fixture
      python3 tools/device/hybrid_check.py --json "$OUT/hybrid_check.json" || echo "HYBRID CHECK FAILED"
      timeout 200 python3 tools/device/gpu_kernels_check.py --only attention --no-speed --json "$OUT/attention.json" \
        2>&1 | grep -v "^ok " | tail -12 || echo "ATTENTION CHECKS FAILED"
      for arch in qwen3next qwen35 qwen35moe; do  # a read parked half-way and resumed: the same tokens and state
        timeout 200 python3 tools/checks/long_context_run.py --model tests/fixtures/hybrid/$arch.gguf --device gpu \
          --ctx 2048 --prompt-tokens 1000 --chunk 128 --vocab-high 4000 --max-new 16 \
          --json "$OUT/parity_gpu_$arch.json" 2>&1 | grep -v "^strata" | tail -2 || echo "HYBRID PARITY FAILED ($arch)"
      done ;;
    spec)  # issue 47: n-gram drafts as decode-graph rows (tools/device/speculation_check.py): the same tokens with and
      # without drafts, greedy, together and seeded, and decode's time either way, on the 135M and 8B Q4_K_M shapes
      synth_ms; synth_mq
      # (the 8B shape's random text never repeats: nothing to draft, its row says what speculating then costs)
      timeout 300 python3 tools/device/speculation_check.py $MS $MQ --drafts-optional $MQ \
        --json "$OUT/speculation_gpu.json" 2>&1 | quiet \
        || echo "SPECULATION CHECK FAILED" ;;
    specpace)  # issue 47: the drafts' pace on the GPU: the 135M shape's looping answer with every draft made
      # (--draft-row-cost 0) and with the measured pace (the default), 400 tokens each
      synth_ms
      for cost in 0 measured; do
        timeout 120 python3 tools/device/speculation_check.py $MS --row-cost $cost --max-new 400 \
          --json "$OUT/speculation_pace_$cost.json" 2>&1 | quiet | tail -1 || echo "SPECULATION CHECK FAILED ($cost)"
      done ;;
    draftspec)  # issue 47: --speculative draft on the GPU: each of the 135M and 8B shapes drafting for itself (every
      # greedy draft its own pick), then the 135M shape with the 8B's 128,256-token vocabulary drafting for the 8B shape
      # (random drafts): the same tokens with and without, alone, together and seeded (speculation_check.py --draft)
      synth_ms; synth_mq
      timeout 240 python3 tools/device/speculation_check.py $MS $MQ --draft self --json "$OUT/draft_self_gpu.json" \
        2>&1 | quiet || echo "DRAFT CHECK FAILED (self)"
      MSV=/tmp/m/smollm2-135m-v128k-q4_1.gguf
      [ -f $MSV ] || python3 tools/fixtures/make_synthetic_gguf.py $MSV --preset smollm2-135m --vocab 128256 --type Q4_1 \
        --tokenizer .device/tok.gguf 2>&1 | tail -1
      timeout 240 python3 tools/device/speculation_check.py $MQ --draft $MSV --json "$OUT/draft_135m_gpu.json" 2>&1 \
        | quiet || echo "DRAFT CHECK FAILED (135M for 8B)" ;;
    sm90)  # the wgmma prompt attention's checks alone; when they fail, again with V's descriptor offsets swapped
      python3 tools/device/gpu_kernels_check.py --only attention,q8_cache --no-speed --json "$OUT/sm90_check.json" \
        | grep -v "^ok " || { echo "SM90 CHECKS FAILED; V_LBO_IS_PANEL=0:"
        python3 tools/device/gpu_kernels_check.py --only attention --no-speed --define V_LBO_IS_PANEL=0 | grep -v "^ok "; } ;;
    longread)  # prompt reads of 65,536 and 131,072 tokens (8B shape, Q4_K_M, chunk 2048): wgmma beside mma.sync attention
      synth_mq
      for kind in ${KINDS:-sm90 mma}; do
        STRATA_PROMPT_ATTENTION=$kind python3 bench/engine_bench.py --model $MQ --device gpu --chunk 2048 \
          --sizes ${SIZES:-65536,131072} --repeats 2 --decode-steps 0 --label llama3-8b-q4_k_m-$kind \
          --json "$OUT/long_read.json" 2>&1 | grep -E "prefill_|prompt_attention|Error|error" || true
      done ;;
    pdl)  # decode graphs with and without programmatic dependent launch: same bits, replay times (issue 23)
      synth_mq
      synth_ms
      synth_moe_small
      for m in $MQ $MS $MQS ${PDL_MODELS:-}; do
        python3 tools/device/pdl_check.py --model $m --json "$OUT/pdl_check.json" 2>&1 | quiet || echo "PDL CHECK FAILED ($m)"
      done ;;
    profile)
      synth_mq
      for m in $MQ ${PROFILE_MODELS:-}; do
        for rows in ${PROFILE_ROWS:-1}; do
          python3 tools/profiling/gpu_profile_decode.py --model $m --rows $rows --json "$OUT/decode_profile.json" 2>&1 | quiet \
            || echo "PROFILE FAILED ($m, $rows rows)"
        done
      done ;;
    mmqround)  # a change to mmq.cu checked and measured in one call (about 4 minutes with the 8B file made)
      synth_mq
      timeout 120 python3 tools/device/mmq_check.py --no-knobs --time-kinds Q4_K,Q6_K --json "$OUT/mmq_check.json" 2>&1 \
        | grep -v "checked:" | cut -c1-600 || echo "MMQ CHECK FAILED"
      timeout 60 python3 tools/profiling/gpu_profile_decode.py --model $MQ --rows 64 --json "$OUT/decode_profile.json" 2>&1 | sed -n 1,9p \
        || echo "PROFILE FAILED"
      timeout 50 python3 tools/device/pdl_check.py --model $MQ --json "$OUT/pdl_check.json" 2>&1 | quiet | tail -1
      timeout 60 python3 bench/engine_bench.py --model $MQ --device gpu --chunk 2048 --sizes 2048 --repeats 3 --decode-steps 64 \
        --decode-contexts 512 --label llama3-8b-shape-q4_k_m --json "$OUT/engine_gpu.json" 2>&1 | grep decode_at
      timeout 70 python3 bench/batch_decode_bench.py --model $MQ --device gpu --context 512 --steps 32 --repeats 1 \
        --batches 16,64 --label llama3-8b-shape-q4_k_m --json "$OUT/batch_decode_gpu.json" 2>&1 | grep "requests:" ;;
    order)  # issue 48's slab order (the dropped pending 04, bench/HISTORY.md) checked: mmq against the dp4a rows alone at
      # 1-256 rows and against NumPy (every kind), its times beside the dp4a kernels' and its block shapes; the dp4a
      # and fused matvecs against NumPy; the decode graphs' logits (pdl_check)
      synth_mq
      timeout 240 python3 tools/device/mmq_check.py --time-kinds Q4_K,Q6_K --json "$OUT/mmq_check.json" 2>&1 \
        | grep -v "checked:" | cut -c1-600 || echo "MMQ CHECK FAILED"
      timeout 150 python3 tools/device/gpu_kernels_check.py --only weights,fused,fused_q8 --no-speed \
        --json "$OUT/kernels_order.json" | grep -v "^ok " || echo "KERNEL CHECKS FAILED OR CUT SHORT"
      timeout 60 python3 tools/device/pdl_check.py --model $MQ --json "$OUT/pdl_check.json" 2>&1 | quiet | tail -1 ;;
    ordershot)  # order and orderbench in one call's ten minutes (a session with one machine in sight): mmq_check without
      # the block shapes (Q4_K times), the weight kernels' checks, the 8B decode at 1 / 16 / 64 before and after
      synth_mq
      timeout 150 python3 tools/device/mmq_check.py --no-knobs --time-kinds Q4_K --json "$OUT/mmq_check.json" 2>&1 \
        | grep -v "checked:" | cut -c1-400 || echo "MMQ CHECK FAILED"
      timeout 100 python3 tools/device/gpu_kernels_check.py --only weights,fused_q8 --no-speed \
        --json "$OUT/kernels_order.json" | grep -v "^ok " || echo "KERNEL CHECKS FAILED OR CUT SHORT"
      decode_before_after $MQ llama3-8b-shape-q4_k_m batch_decode_order.json 1 1,16,64 100 ;;
    orderprobe)  # the slab order's kernels timed beside main's on one machine, and where mmq's time goes: mmq_check's
      # times (Q4_K, no block shapes) with main's tree (base_tree) and with the patch; then ncu's full sections for
      # the mmq kernels of the 8B Q4_K_M step at 64 rows
      synth_mq
      if base_tree; then
        (cd /tmp/base && timeout 120 python3 tools/device/mmq_check.py --no-knobs --time-kinds Q4_K \
          --json "$OUT/mmq_check_before.json" 2>&1 | grep -v "checked:\|compiled" | cut -c1-300)
      fi
      timeout 120 python3 tools/device/mmq_check.py --no-knobs --time-kinds Q4_K --json "$OUT/mmq_check.json" 2>&1 \
        | grep -v "checked:\|compiled" | cut -c1-300 || echo "MMQ CHECK FAILED"
      [ "${ORDERPROBE_NCU:-1}" = 1 ] && ncu_detail "$OUT" 64 --model $MQ --detail mmq ;;  # (ORDERPROBE_NCU=0: times only)
    orderbench)  # the slab order's speed: the 8B Q4_K_M shape's decode at 1 / 16 / 32 / 64 requests with main's engine
      # (.device/base: apply_pending.sh) and the patched one, then the 64-row step's profile
      synth_mq
      decode_before_after $MQ llama3-8b-shape-q4_k_m batch_decode_order.json 3 1,16,32,64
      timeout 90 python3 tools/profiling/gpu_profile_decode.py --model $MQ --rows 64 --json "$OUT/decode_profile_64.json" \
        2>&1 | sed -n 1,14p || echo "PROFILE FAILED" ;;
    detail)  # DETAIL_RE (mmq), DETAIL_ROWS (64): ncu's full sections for those kernels of the 8B step
      synth_mq
      for rows in ${DETAIL_ROWS:-64}; do
        ncu_detail "$OUT" $rows --model $MQ --detail "${DETAIL_RE:-mmq}"
      done ;;
    attn32k)  # the 8B Q4_K_M step at 32,768 context with either cache under ncu, and flash decoding's full sections
      synth_mq
      for kv in f16 q8_0; do
        timeout 150 python3 tools/profiling/gpu_profile_decode.py --model $MQ --context 32768 --kv-type $kv --label 32k-$kv \
          --json "$OUT/decode_profile_32k.json" 2>&1 | sed -n 1,8p || echo "PROFILE FAILED ($kv)"
        ncu_detail "$OUT/$kv" 1 --model $MQ --context 32768 --kv-type $kv --detail flash_decode --detail-count 2
      done
      # and at 512 keys, where the kernel is latency: 10 us a layer, 13% of the step
      ncu_detail "$OUT/f16_512" 1 --model $MQ --context 512 --detail flash_decode --detail-count 2 ;;
    decode)
      synth_mq
      synth_ms
      synth_moe_small
      timeout 200 python3 tools/device/gpu_kernels_check.py --only weights,norm_rope,attention,fused_q8 --no-speed \
        --json "$OUT/kernels_decode.json" | grep -v "^ok " || echo "KERNEL CHECKS FAILED OR CUT SHORT"
      timeout 100 python3 tools/checks/paged_check.py --model $MS --device gpu --json "$OUT/paged_check_gpu.json" 2>&1 | quiet \
        | tail -6 || echo "PAGED CHECK FAILED"
      for m in $MQ $MS $MQS; do
        timeout 90 python3 tools/device/pdl_check.py --model $m --json "$OUT/pdl_check.json" 2>&1 | quiet | tail -1 \
          || echo "PDL CHECK FAILED ($m)"
      done
      for rows in 1 64; do
        timeout 120 python3 tools/profiling/gpu_profile_decode.py --model $MQ --rows $rows --json "$OUT/decode_profile.json" \
          > /tmp/profile_$rows.txt 2>&1 || echo "PROFILE FAILED ($rows rows)"
        head -14 /tmp/profile_$rows.txt
      done
      timeout 90 python3 bench/engine_bench.py --model $MQ --device gpu --chunk 2048 --sizes 2048 --repeats 3 --decode-steps 64 \
        --decode-contexts 512,32768 --label llama3-8b-shape-q4_k_m --json "$OUT/engine_gpu.json" 2>&1 | grep decode_at
      timeout 120 python3 bench/batch_decode_bench.py --model $MQ --device gpu --context 512 --steps 32 --repeats 1 \
        --batches 1,16,64 --label llama3-8b-shape-q4_k_m --json "$OUT/batch_decode_gpu.json" 2>&1 | quiet | tail -4 ;;
    fusions)  # a lone decode row's fused kernels (quant.cu's matvec_act_<T>, matvec_norm_<T>): their checks (the bits of
      # the launches each replaces, staged and not, the norm's scale to its last bit), the decode graphs' logits and
      # greedy tokens (pdl_check), and one request's decode (1 and 16 rows, the latter unfused) on the 8B Q4_K_M and
      # 135M Q4_1 shapes before (.device/base: tools/device/apply_pending.sh keeps it) and after; the 1-row
      # profile after
      synth_mq
      synth_ms
      timeout 240 python3 tools/device/gpu_kernels_check.py --only fused,fused_q8,norm_rope,moe --no-speed \
        --json "$OUT/kernels_fused.json" | grep -v "^ok " || echo "FUSED CHECKS FAILED OR CUT SHORT"
      for m in $MQ $MS; do
        timeout 90 python3 tools/device/pdl_check.py --model $m --json "$OUT/pdl_check.json" 2>&1 | quiet | tail -1 \
          || echo "PDL CHECK FAILED ($m)"
      done
      for m in $MQ $MS; do  # one request's and 16 requests' decode
        decode_before_after $m "$(basename $m .gguf)" batch_decode_fused.json 3 1,16 120 64
      done
      timeout 120 python3 tools/profiling/gpu_profile_decode.py --model $MQ --rows 1 --json "$OUT/decode_profile_fused.json" \
        > /tmp/profile_1.txt 2>&1 || echo "PROFILE FAILED"
      head -16 /tmp/profile_1.txt ;;
    fusions80)  # the hybrids' decode fusions (add_gated_rms_norm, moe_act, conv_l2, delta_norm, the mixers' 8-bit
      # rows): the hybrid fixtures against transformers and exact on the GPU (hybrid_check.py, a read parked and
      # resumed), then the Qwen3-Next-80B-A3B shape in IQ3_S decoding 1 / 16 requests before (.device/base) and after
      bash tools/device/gpu_run.sh hybrid 2>&1 | tail -8
      synth_next
      decode_before_after $MNX qwen3-next-80b-a3b-${NEXT_TYPE,,} batch_decode_next.json 2 1,16 200 ;;
    fusedswitch)  # the fused matvecs (matvec_act, matvec_norm) off (the default) and on ($STRATA_FUSED_MATVEC=1): one
      # request's and 16 requests' decode on the 8B Q4_K_M and the 80B-A3B IQ3_S shapes, in one call
      synth_mq
      synth_next
      for m in $MQ $MNX; do
        for on in 0 1; do
          STRATA_FUSED_MATVEC=$on timeout 150 python3 bench/batch_decode_bench.py --model $m --device gpu --context 512 \
            --steps 32 --repeats 2 --batches 1,16 --label "$(basename $m .gguf)-fused$on" \
            --json "$OUT/batch_decode_switch.json" 2>&1 | quiet | tail -2 || echo "DECODE FAILED ($m fused $on)"
        done
      done ;;
    moeactswitch|moeactswitch80)  # a MoE shape's resident decode at 1 / 4 / 16 requests with moe_act and without
      # ($STRATA_MOE_ACT=1, and 0 the default: moe_matvec then silu_mul, the same bits): the 30B-A3B shape, or the 80B-A3B
      # hybrid's (moeactswitch80)
      if [ $step = moeactswitch ]; then rm -f $MNX; synth_a3b; m=$MQA; else synth_next; m=$MNX; fi
      for on in 1 0; do  # (the disk holds one of the two files)
        STRATA_MOE_ACT=$on timeout 150 python3 bench/batch_decode_bench.py --model $m --device gpu --context 512 \
          --steps 32 --repeats 2 --batches 1,4,16 --label "$(basename $m .gguf)-moe_act$on" \
          --json "$OUT/batch_decode_moe_act.json" 2>&1 | quiet | tail -3 || echo "DECODE FAILED ($m moe_act $on)"
      done ;;
    moegemm)  # the routed experts' prompt pass alone (tools/device/moe_gemm_bench.py: the 80B-A3B layer's shapes over
      # 4,096 rows, Q4_K / IQ3_S / Q6_K stacks; the 30B-A3B layer's, 256 entries an expert): the route's and each
      # grouped GEMM's time and tensor-core rate with main's tree (base_tree, when a patch is pending) and this one, and
      # the outputs' digests (a patch that keeps the bits keeps them); then ncu's full sections for this tree's
      # moe_gemm_Q4_K (the gate's launch) and the SASS's stalls
      moe_gemm_run() {
        timeout 200 python3 tools/device/moe_gemm_bench.py --label "moe_gemm$TAG" --json "$OUT/moe_gemm.json" \
          && timeout 150 python3 tools/device/moe_gemm_bench.py --experts 128 --used 8 --ffn 768 --kinds Q4_K,Q6_K \
            --label "moe_gemm_a3b$TAG" --json "$OUT/moe_gemm.json" || echo "MOE GEMM BENCH FAILED ($TAG)"
      }
      in_both_trees moe_gemm_run
      mkdir -p "$OUT/moe_ncu"
      rep=/tmp/moe_gemm.ncu-rep
      timeout 240 ncu --clock-control none --set full -k regex:moe_gemm_Q4_K --launch-count 1 -f -o "${rep%.ncu-rep}" \
        python3 tools/device/moe_gemm_bench.py --once --kinds Q4_K > /tmp/moe_ncu.log 2>&1 || tail -5 /tmp/moe_ncu.log
      if [ -f $rep ]; then
        ncu --import $rep --page details > "$OUT/moe_ncu/details.txt" 2>&1
        ncu --import $rep --page source --csv --print-source sass > "$OUT/moe_ncu/source.txt" 2>&1
        python3 tools/profiling/ncu_source_summary.py "$OUT/moe_ncu/source.txt" > "$OUT/moe_ncu/summary.txt" \
          && sed -n 1,25p "$OUT/moe_ncu/summary.txt"
        grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy" \
          "$OUT/moe_ncu/details.txt" | head -12
      fi ;;
    synthnext) synth_next ;;  # the 80B-A3B shape's file ($NEXT_TYPE) alone, for the calls after on a warm machine
    moeread)  # the 80B-A3B shape's ($NEXT_TYPE) reads of 4K and 32K before (main) and after a pending patch: the
      # routed experts' grouped GEMM (05-moe-gemm-bm128) is 60% of them
      synth_next
      reads_before_after $MNX qwen3-next-80b-a3b-${NEXT_TYPE,,} reads_next.json ;;
    statemem)  # a hybrid's recurrent states in their own pool, made at start (tools/device/state_memory_check.py)
      timeout 120 python3 tools/device/state_memory_check.py --json "$OUT/state_memory.json" || echo "STATE MEMORY CHECK FAILED" ;;
    moecheck)  # the MoE kernels' checks alone (route, experts, a batch's rows against each alone)
      timeout 150 python3 tools/device/gpu_kernels_check.py --only moe --no-speed --json "$OUT/kernels_moe.json" | grep -v "^ok " \
        || echo "MOE CHECKS FAILED OR CUT SHORT" ;;
    moedecode)
      synth_moe_small
      timeout 240 python3 tools/device/gpu_kernels_check.py --only moe --json "$OUT/kernels_moe.json" | grep -v "^ok " \
        || echo "MOE CHECKS FAILED OR CUT SHORT"
      timeout 90 python3 tools/device/pdl_check.py --model $MQS --json "$OUT/pdl_check.json" 2>&1 | quiet | tail -1 \
        || echo "PDL CHECK FAILED ($MQS)"
      decode_before_after $MQS qwen3moe-4layer-q4_k_m batch_decode_gpu_moe.json 3 1,4,16,64 ;;
    times)
      python3 tools/profiling/decode_kernel_times.py --json "$OUT/decode_kernel_times.json" ;;
    grammar)  # constrained decoding through the GPU sampler path (a small synthetic model, graphs on)
      [ -f /tmp/m/small-q8.gguf ] || python3 tools/fixtures/make_synthetic_gguf.py /tmp/m/small-q8.gguf --preset smollm2-135m \
        --type Q8_0 --tokenizer .device/tok.gguf 2>&1 | tail -1
      python3 tools/device/gpu_grammar_check.py --model /tmp/m/small-q8.gguf --json "$OUT/gpu_grammar.json" 2>&1 | quiet ;;
    grammarcost)  # the grammar mask per token with the logits on the GPU (Qwen2 vocabulary; issue 22)
      python3 -c "import llguidance; print(\"llguidance\", llguidance.__version__)"
      python3 bench/grammar_bench.py --gpu --json "$OUT/grammar_gpu_h200.json" || echo "GRAMMAR BENCH FAILED" ;;
    moetimes)
      python3 tools/profiling/moe_decode_times.py --json "$OUT/moe_decode_times.json" ;;
    families)  # the default model's vocabulary alone (.device/smol_tok.gguf), so that the fixtures' files come out the same
      python3 tools/device/gpu_families_check.py --tokenizer .device/smol_tok.gguf --json "$OUT/gpu_families.json" 2>&1 | quiet ;;
    synth)
      [ -f $M8 ] || python3 tools/fixtures/make_synthetic_gguf.py $M8 --preset llama3-8b --type F16 --tokenizer .device/tok.gguf 2>&1 | tail -2
      synth_ms ;;
    gpucheck)
      synth_ms
      python3 tools/device/gpu_check.py --model $MS --out "$OUT/gpu_check_135m_shape.json" 2>&1 | quiet ;;
    small)
      synth_ms
      python3 bench/engine_bench.py --model $MS --device gpu --chunk 2048 --sizes 2048,8192 --repeats 5 \
        --decode-steps 128 --decode-contexts 512,4096 --profile-depth 6144 --label smollm2-135m-shape-q4_1 \
        --json "$OUT/engine_gpu.json" 2>&1 | quiet ;;
    bench)
      python3 bench/engine_bench.py --model $M8 --device gpu --chunk 2048 --sizes 4096,16384,65536 --repeats 3 \
        --decode-steps 64 --decode-contexts 512,16384,46832 --profile-depth 14336 --label llama3-8b-shape-f16 \
        --json "$OUT/engine_gpu.json" 2>&1 | quiet ;;
    synthq)
      synth_mq ;;
    benchq)
      synth_mq
      for form in ${FORMS:-quantized kept}; do
        python3 bench/engine_bench.py --model $MQ --device gpu --chunk 2048 --sizes ${SIZES:-4096,16384} --repeats 3 \
          --decode-steps 64 --decode-contexts 512,16384 --profile-depth 14336 --weights $form \
          --label llama3-8b-shape-q4_k_m-$form --json "$OUT/engine_gpu.json" 2>&1 | quiet
      done ;;
    big)
      rm -f $M8 $MQ
      [ -f $M70 ] || python3 tools/fixtures/make_synthetic_gguf.py $M70 --preset llama3-70b --type Q4_K_M --tokenizer .device/tok.gguf 2>&1 | tail -1
      python3 bench/engine_bench.py --model $M70 --device gpu --chunk 2048 --sizes 4096 --repeats 2 \
        --decode-steps 32 --decode-contexts 512 --label llama3-70b-shape-q4_k_m --json "$OUT/engine_gpu.json" 2>&1 | quiet ;;
    drawsbehind)
      synth_ms
      timeout 240 python3 tools/device/draws_behind_check.py $MS --json "$OUT/draws_behind_check.json" 2>&1 \
        | grep -v "^strata:" || echo "DRAWS BEHIND CHECK FAILED" ;;
    paged)
      synth_ms
      kv=${KV_TYPE:-auto}; tag=${KV_TYPE:+_$KV_TYPE}
      python3 tools/checks/prefill_preempt_test.py --model $MS --device gpu --chunk 256 --prompt-tokens 3000 \
        --engine-args "--kv-type $kv" --json "$OUT/preempt_parity_gpu_135m_paged$tag.json" 2>&1 | quiet || echo "PAGED PARITY FAILED"
      python3 tools/checks/paged_check.py --model $MS --device gpu --engine-args "--kv-type $kv" \
        --json "$OUT/paged_check_gpu$tag.json" 2>&1 | quiet || echo "PAGED CHECK FAILED" ;;
    long)
      synth_mq
      python3 tools/checks/long_context_run.py --model $MQ --kv-type q8_0 --ctx 1048576 --prompt-tokens 262144 --chunk 2048 \
        --json "$OUT/long_context_q8_0_h200.json" 2>&1 | quiet || echo "LONG CONTEXT RUN FAILED" ;;
    prefetch)
      python3 tools/device/gpu_kernels_check.py --no-speed --json "$OUT/kernels_checks.json" | tail -1
      for p in 0 1 0 1; do
        python3 tools/device/gpu_kernels_check.py --block-sweep 64 --define DEC_PREFETCH=$p --json "$OUT/sweep_p$p.json" \
          | grep -o "decode_depth[0-9]*\(_q8\)\?_us=[0-9.]*" | tr '\n' ' '; echo " (DEC_PREFETCH=$p)"
      done ;;
    depth)
      synth_mq
      for kv in f16 q8_0; do
        python3 tools/checks/long_context_run.py --model $MQ --kv-type $kv --ctx 133120 --prompt-tokens 131072 --chunk 2048 \
          --max-new 64 --no-park --json "$OUT/decode_depth_${kv}_h200.json" 2>&1 | quiet || echo "DEPTH RUN FAILED"
      done ;;
    startup)
      synth_mq
      python3 bench/startup_time.py --model $MQ --repeats 3 --json "$OUT/startup_h200.json" ;;
    startupq)  # the same on a 150K-vocabulary model: the Qwen3-8B shape in Q4_K_M with Qwen2.5's tokenizer (.device/qwen_tok.gguf)
      [ -f $MQ3Q ] || python3 tools/fixtures/make_synthetic_gguf.py $MQ3Q --preset qwen3-8b --type Q4_K_M --tokenizer .device/qwen_tok.gguf 2>&1 | tail -1
      python3 bench/startup_time.py --model $MQ3Q --repeats 3 --json "$OUT/startup_qwen_h200.json" ;;
    longhttp_strata)  # a 97,000- and a 130,000-token request through HTTP, the server as a user starts it
      synth_mq
      python3 bench/long_read_http.py --server "strata=python3 -m serve --model $MQ --port 8080" \
        --json "$OUT/long_read_http_strata.json" || echo "LONG READ (STRATA) FAILED" ;;
    longhttp_llama)  # the same requests to llama-server on the same file (built first if need be)
      build_llama
      python3 bench/long_read_http.py --server "llama.cpp=$LLAMA/build/bin/llama-server -m $MQ -ngl 99 -fa on -c 132000 --port 8080" \
        --json "$OUT/long_read_http_llama.json" || echo "LONG READ (LLAMA.CPP) FAILED" ;;
    tp)  # tensor parallel's split on one GPU: 2 ranks of the 8B shape in Q4_K_M (blocks kept) against the whole model
      synth_mq
      python3 tools/checks/tp_check.py --model $MQ --device gpu --world 2 --json "$OUT/tp_check_h200.json" 2>&1 | quiet \
        || echo "TP CHECK FAILED" ;;
    chunkbench)
      synth_mq
      python3 bench/chunk_default_bench.py --model $MQ --deadline-s $((540 - SECONDS)) --chunks ${CHUNKS:-256,512,1024,2048,4096} \
        --json "$OUT/chunk_default_h200.json" 2>&1 | quiet || echo "CHUNK BENCH FAILED OR CUT SHORT"
      grep -h "strata: loaded" /tmp/chunk_bench_server_*.log || true ;;
    parity)
      python3 tools/checks/prefill_preempt_test.py --model $M8 --device gpu --chunk 256 --prompt-tokens 3000 \
        --json "$OUT/preempt_parity_gpu_8b.json" 2>&1 | quiet ;;
    parityq)
      synth_mq
      python3 tools/checks/prefill_preempt_test.py --model $MQ --device gpu --chunk 256 --prompt-tokens 3000 \
        --json "$OUT/preempt_parity_gpu_8b_q4_k_m.json" 2>&1 | quiet ;;
    hol)
      STRATA_MODEL=$M8 python3 bench/prefill_preempt_bench.py --device gpu --chunk 2048 --a-tokens 46832 \
        --b-delay 2 --repeats 3 --out "$OUT" 2>&1 | quiet ;;
    moe)
      synth_moe_small
      python3 tools/checks/prefill_preempt_test.py --model $MQS --device gpu --chunk 256 --prompt-tokens 3000 \
        --json "$OUT/preempt_parity_gpu_qwen3moe.json" 2>&1 | quiet ;;
    bench8q)  # the 8B shapes side by side
      for m in "$MQ llama3-8b q4_k_m" "$MQ3 qwen3-8b q4_k_m"; do
        set -- $m
        [ -f $1 ] || python3 tools/fixtures/make_synthetic_gguf.py $1 --preset $2 --type Q4_K_M --tokenizer .device/tok.gguf 2>&1 | tail -1
        python3 bench/engine_bench.py --model $1 --device gpu --chunk 2048 --sizes 4096,16384 --repeats 3 \
          --decode-steps 64 --decode-contexts 512,16384 --label $2-shape-$3 --json "$OUT/engine_gpu.json" 2>&1 | quiet
      done ;;
    a3b)  # issue 23's MoE figures in one call: the Qwen3-30B-A3B shape's decode at 512 context, its step under ncu
      # (each kernel's time and bytes) and aggregate decode at 1, 16, 64 requests
      synth_a3b
      # (the first run on a fresh machine compiles the kernels: minutes, not seconds)
      timeout 300 python3 bench/engine_bench.py --model $MQA --device gpu --chunk 2048 --sizes 2048 --repeats 3 --decode-steps 64 \
        --decode-contexts 512 --label qwen3-30b-a3b-shape-q4_k_m --json "$OUT/engine_gpu_a3b.json" 2>&1 | grep decode_at \
        || echo "A3B BENCH FAILED OR CUT SHORT"
      timeout 150 python3 tools/profiling/gpu_profile_decode.py --model $MQA --rows 1 --json "$OUT/decode_profile_a3b.json" 2>&1 \
        | sed -n 1,16p || echo "PROFILE FAILED"  # (sed reads to the end: head's early close failed the pipe)
      timeout 150 python3 bench/batch_decode_bench.py --model $MQA --device gpu --context 512 --steps 32 --repeats 1 \
        --batches 1,16,64 --label qwen3-30b-a3b-shape-q4_k_m --json "$OUT/batch_decode_a3b.json" 2>&1 | quiet | tail -4 ;;
    long32k)  # issue 23's 32K target with either cache: the 8B shape in Q4_K_M decoding at 512 and 32,768 context
      synth_mq
      for kv in f16 q8_0; do
        timeout 120 python3 bench/engine_bench.py --model $MQ --device gpu --chunk 2048 --sizes 2048 --repeats 3 \
          --decode-steps 64 --decode-contexts 512,32768 --kv-type $kv --label llama3-8b-shape-q4_k_m-kv-$kv \
          --json "$OUT/engine_gpu_32k.json" 2>&1 | grep decode_at || echo "BENCH FAILED ($kv)"
      done ;;
    hybridbench) next_strata ;;  # issue 45's speed on the 80B-A3B shape ($NEXT_TYPE, IQ3_S unless set): Strata's half
    hybridbench_llama) next_llama ;;  # llama.cpp's half on the same file
    hybridpair) next_strata; next_llama ;;  # both halves in one call (NEXT_TYPE=Q4_K_M: the issue's second file)
    hybridlong)  # issue 45: a 262,144-token request on the Qwen3-Next-80B-A3B shape (IQ3_S) read, parked half-way and
      # resumed (its tokens and state fingerprint, the recurrent states included, equal the uninterrupted run's)
      synth_next
      timeout 560 python3 tools/checks/long_context_run.py --model $MNX --device gpu --ctx 262400 --prompt-tokens 262144 \
        --chunk 2048 --vocab-high 150000 --json "$OUT/long_context_next.json" 2>&1 | quiet | tail -8 \
        || echo "HYBRID LONG RUN FAILED" ;;
    logprobsynth)  # issue 49's prompt log-probabilities on the GPU without the carried model: the 135M shape's
      # random weights (the CPU's float32 the reference; the same bits beside another read and a decoder)
      synth_ms
      timeout 240 python3 tools/device/logprobs_check.py $MS --json "$OUT/logprobs_gpu_synth.json" 2>&1 | quiet | tail -2 \
        || echo "LOGPROBS CHECK FAILED" ;;
    realmodel)
      [ -f /tmp/m/smollm2.gguf ] || bash tools/device/model_parts.sh join /tmp/m/smollm2.gguf
      timeout 240 python3 tools/device/logprobs_check.py /tmp/m/smollm2.gguf --json "$OUT/logprobs_gpu.json" 2>&1 \
        | quiet | tail -2 || echo "LOGPROBS CHECK FAILED"
      timeout 240 python3 tools/device/speculation_check.py /tmp/m/smollm2.gguf --json "$OUT/speculation_real.json" \
        2>&1 | quiet | tail -2 || echo "SPECULATION CHECK FAILED" ;;
    offload)  # issue 46's first slice: the Qwen3-30B-A3B shape (Q4_K_M) with every expert resident against 32 and 64
      # device slots a layer (of 128): the same bits, decode's tokens per second, the cache's hits and copies
      synth_a3b
      timeout 400 python3 tools/device/expert_cache_check.py $MQA --slots 32 64 --batch 1 4 16 --prompt 256 --steps 16 --json "$OUT/expert_cache.json" 2>&1 \
        | quiet | tail -5 || echo "EXPERT CACHE CHECK FAILED" ;;
    offloadpeers)  # issue 46 against llama.cpp: the Qwen3-30B-A3B shape (Q4_K_M, ~17 GB) served as a user starts it,
      # Strata at --gpu-memory CAP and llama-server with --n-cpu-moe chosen for the same cap
      # (tools/device/ncmoe_for_cap.py), for each CAP of OFFLOAD_CAPS (GiB; full: the whole card) -> $OUT/offload.tgz
      build_llama > /tmp/build_llama.out 2>&1 &  # (beside the file's writing: the build takes the cores, it one)
      synth_a3b
      wait
      cat /tmp/build_llama.out
      for cap in ${OFFLOAD_CAPS:-16 full}; do
        if [ $cap = full ]; then capflag=""; ncmoe=0; else
          capflag="--gpu-memory $cap"  # llama-server's KV of 32,768 positions (unified over its 4 slots) and buffers
          ncmoe=$(python3 tools/device/ncmoe_for_cap.py $MQA $cap --allowance-gib 4) || continue
        fi
        offload_bench strata $cap python3 -m serve --model $MQA $capflag
        [ -x $LLAMA/build/bin/llama-server ] && offload_bench llama.cpp $cap $LLAMA/build/bin/llama-server -m $MQA \
          -ngl 99 -fa on -c 32768 -np 4 -kvu --n-cpu-moe $ncmoe --port 8080
      done
      (cd "$OUT" && tar czf offload.tgz offload_* && rm -f offload_*) ;;  # one file back (a run returns a few)
    bencha3b)
      synth_a3b
      python3 bench/engine_bench.py --model $MQA --device gpu --chunk 2048 --sizes 4096,16384 --repeats 3 \
        --decode-steps 64 --decode-contexts 512,16384 --profile-depth 2048 --label qwen3-30b-a3b-shape-q4_k_m \
        --json "$OUT/engine_gpu.json" 2>&1 | quiet ;;
    batch)
      synth_ms
      python3 bench/batch_decode_bench.py --model $MS --device gpu --context 512 --steps 32 --repeats 3 \
        --label smollm2-135m-shape-q4_1 --json "$OUT/batch_decode_gpu.json" 2>&1 | quiet || echo "BATCH CHECK FAILED"
      for m in "$MQ q4_k_m Q4_K_M" "$M8 f16 F16"; do
        set -- $m
        [ -f $1 ] || python3 tools/fixtures/make_synthetic_gguf.py $1 --preset llama3-8b --type $3 --tokenizer .device/tok.gguf 2>&1 | tail -1
        python3 bench/batch_decode_bench.py --model $1 --device gpu --context 512 --steps 32 --repeats 3 \
          --label llama3-8b-shape-$2 --json "$OUT/batch_decode_gpu.json" 2>&1 | quiet || echo "BATCH CHECK FAILED"
      done ;;
    mmv)
      python3 tools/device/mmv_check.py --json "$OUT/mmv_check.json" || echo "MMV CHECK FAILED" ;;
    mmq)
      python3 tools/device/mmq_check.py --json "$OUT/mmq_check.json" || echo "MMQ CHECK FAILED" ;;
    sbq)  # issue 48's third probe: sbq.cu (integer sums over a Q4_K super-block, x in Q8K) against today's kernels
      python3 tools/device/sbq_check.py --json "$OUT/sbq_check.json" || echo "SBQ CHECK FAILED" ;;
    q8kcheck)  # issue 48: the producers' Q8K (pending 02-q8k-producers): tools/device/q8k_check.py, the norm, SwiGLU
      # and flash-decoding's output at the 8B's widths, each row's super-blocks NumPy's Q8K of its fp16 row
      timeout 300 python3 tools/device/q8k_check.py --json "$OUT/q8k_check.json" | tail -4 || echo "Q8K CHECK FAILED" ;;
    sbqdecode)  # the engine with sbq.cu ($STRATA_SBQ=1) against without: the 8B Q4_K_M shape's decode at 1 / 16 / 64
      # requests, each request's tokens against its solo run's
      decode_switch STRATA_SBQ sbq ;;
    shared)
      synth_ms; synth_mq; synth_moe_small
      python3 tools/device/shared_steps_check.py $MS $MQ $MQS --json "$OUT/shared_steps_h200.json" 2>&1 | quiet \
        || echo "SHARED STEPS CHECK FAILED" ;;
    httpquick)  # issue 44: tools/device/http_quick.sh (CASES, REPEATS, LIMIT) on the 8B chat model, as a user starts it
      chat_model; bash tools/device/http_quick.sh ${SERVER_FLAGS:-} ;;
    gemmprobe)
      python3 tools/device/prompt_gemm_probe.py --json "$OUT/prompt_gemm_probe.json" ${PROBE_ARGS:-} || echo "GEMM PROBE FAILED" ;;
    decodegemm)  # decode rows through cuBLAS on the fp16 weights, as the engine runs it (no workspace): each row's
      # bits at 1-64 rows against 4,096 (part 1), and the 8B shapes' products at 1-256 rows beside the engine's
      # decode matvec (part 3) -> $OUT/decode_gemm_probe.json
      CUBLAS_WORKSPACE_CONFIG=:0:0 timeout 400 python3 tools/device/prompt_gemm_probe.py --modes "" --no-times \
        --mmq-rows 1,2,4,8,16,32,64,128,256 --json "$OUT/decode_gemm_probe.json" 2>&1 | grep -E "summed|done|Error" \
        || echo "DECODE GEMM PROBE FAILED" ;;
    batchf16|batchq)  # FROM="1 65": each run with STRATA_MMQ_FROM at that value (mmq.cu from that many rows)
      if [ $step = batchf16 ]; then set -- $M8 F16 f16; else set -- $MQ Q4_K_M q4_k_m; fi
      [ -f $1 ] || python3 tools/fixtures/make_synthetic_gguf.py $1 --preset llama3-8b --type $2 --tokenizer .device/tok.gguf 2>&1 | tail -1
      for from in ${FROM:-default}; do
        if [ $from = default ]; then suffix=""; else suffix="-mmq-from-$from"; fi
        (if [ $from != default ]; then export STRATA_MMQ_FROM=$from; fi
         python3 bench/batch_decode_bench.py --model $1 --device gpu --context 512 --steps 32 \
           --repeats ${REPEATS:-3} --batches ${BATCHES:-1,2,4,8,16} --label llama3-8b-shape-$3$suffix \
           --json "$OUT/batch_decode_gpu.json" 2>&1 | quiet) || echo "BATCH CHECK FAILED ($from)"
      done ;;
    wide)
      python3 tools/profiling/matvec_wide_times.py --json "$OUT/matvec_wide.json" || echo "WIDE CHECK FAILED" ;;
    agent)
      synth_mq
      python3 bench/agent_reuse_bench.py --model $MQ --device gpu --turns 10 --final 16384 --chunk 2048 --answer 16 \
        --label llama3-8b-shape-q4_k_m --json "$OUT/agent_reuse_gpu.json" 2>&1 | quiet ;;
    mixed)
      synth_mq
      STRATA_MODEL=$MQ python3 bench/mixed_load_bench.py --device gpu --a-tokens 46832 --decoders 4 --b-delay 2 \
        --chunk 2048 --repeats 2 --json "$OUT/mixed_load_gpu.json" 2>&1 | quiet ;;
    real)
      cp .device/part* /tmp/sm/ && cat /tmp/sm/part* > /tmp/sm/model.gguf
      python3 tools/device/gpu_check.py --model /tmp/sm/model.gguf --out "$OUT/gpu_check.json" 2>&1 | quiet
      python3 tools/checks/prefill_preempt_test.py --model /tmp/sm/model.gguf --device gpu --chunk 256 \
        --prompt-tokens 3000 --json "$OUT/preempt_parity_gpu.json" 2>&1 | quiet ;;
    promptweights)  # prompt weights kept expanded: the same bits as expanded each step, and the steps' times
      synth_mq; synth_ms
      python3 tools/device/prompt_weights_check.py $MQ $MS --json "$OUT/prompt_weights_check.json" 2>&1 | quiet \
        || echo "PROMPT WEIGHTS CHECK FAILED" ;;
    hosttier)  # the host tier's copies (engine/kvcache/host_shelf.py): times against a copy a block, every byte back
      python3 tools/device/host_tier_check.py --json "$OUT/host_tier_check.json" 2>&1 | tail -4 \
        || echo "HOST TIER CHECK FAILED" ;;
    logprobs)  # a step's log-probabilities in one launch (engine/runner/logprob_rows.py) against the host sampler's
      python3 tools/device/logprob_rows_check.py --json "$OUT/logprob_rows_check.json" 2>&1 | tail -25 \
        || echo "LOGPROB ROWS CHECK FAILED" ;;
    servercost)  # the HTTP server's own CPU a request and a streamed token, before the mock engine (no model)
      python3 bench/server_cost_bench.py --repeats 5 --json "$OUT/server_cost.json" 2>&1 | tail -2 ;;
    peers_strata)
      chat_model
      serve_and_bench strata pool_strata.json "$(strata_version)" \
        python3 -m serve --model $MQC ;;
    holnext)  # the mixed case (pool_bench's hol: a short request beside a 46.9K read and 4 / 16 / 64 decoders; PEERS_CASES
      # for others) on the 80B-A3B hybrid shape ($NEXT_TYPE), as a user starts the server
      synth_next
      BENCH_TOKENIZER=$MNX PEERS_CASES=${PEERS_CASES:-hol} serve_and_bench strata pool_next.json \
        "$(strata_version)" python3 -m serve --model $MNX ;;
    qpart)  # parts of the Qwen2.5 fixture (469 MiB; a call carries 64 MiB): .device/q/partNN, kept in /tmp/q
      mkdir -p /tmp/q && cp .device/q/part* /tmp/q/ && ls /tmp/q | tr '\n' ' ' && du -sh /tmp/q ;;
    qpeers_strata)  # llama.cpp's three server test scripts against Strata on the fixture, as a user starts it
      qwen_fixture && serve_and_scripts strata peer_scripts_strata_h200.json python3 -m serve --model $MQW ;;
    qpeers_llama)  # the same against llama-server on the same file (built first if need be)
      build_llama
      qwen_fixture && [ -x $LLAMA/build/bin/llama-server ] && serve_and_scripts llama.cpp peer_scripts_llama_h200.json \
        $LLAMA/build/bin/llama-server -m $MQW -ngl 99 --jinja --port 8080 ;;
    qspec)  # issue 47 on a real model: bench/speculation_bench.py's four workloads on the Qwen2.5 fixture through
      # HTTP, --speculative off / ngram (medians of 3) -> $OUT/speculation_gpu.json
      qwen_fixture && timeout -k 10 $((590 - SECONDS)) python3 bench/speculation_bench.py --model $MQW --device gpu \
        --arms off,ngram --repeats 3 --concurrency ${SPEC_CONCURRENCY:-16} --label "coder-0.5b, strata" \
        --json "$OUT/speculation_gpu.json" 2>&1 | grep -v "^INFO" | tail -12
      if [ -n "${SPEC_TRACE:-}" ]; then  # once more, each step traced: the servers' logs -> $OUT/spec_trace_logs.tgz
        STRATA_STEP_TRACE=1 timeout -k 10 $((590 - SECONDS)) python3 bench/speculation_bench.py --model $MQW \
          --device gpu --arms off,ngram 2>&1 | grep -v "^INFO" > /tmp/spec_trace.out
        tail -9 /tmp/spec_trace.out
        tar -czf "$OUT/spec_trace_logs.tgz" -C "$(sed -n 's/^logs: //p' /tmp/spec_trace.out)" .
      fi ;;
    qspec_llama)  # the same workloads against llama-server's speculation on the same file (built first if need be)
      build_llama
      qwen_fixture && [ -x $LLAMA/build/bin/llama-server ] && timeout -k 10 $((590 - SECONDS)) python3 \
        bench/speculation_bench.py --model $MQW --device gpu --arms "" --llama-server $LLAMA/build/bin/llama-server \
        --llama-args "-ngl 99 -fa on -c 8192" --llama-arms off,ngram --repeats 3 \
        --label "coder-0.5b, llama-server" --json "$OUT/speculation_gpu.json" 2>&1 | tail -12 ;;
    peers_build)
      build_llama
      ls -la $LLAMA/build/bin/llama-server 2>/dev/null || true ;;
    peers_llama)
      build_llama
      chat_model
      if [ -x $LLAMA/build/bin/llama-server ]; then
        serve_and_bench llama.cpp pool_llama.json "llama.cpp vendored in llama-cpp-python 0.3.36 (.device/llama.tgz)" \
          $LLAMA/build/bin/llama-server -m $MQC -ngl 99 -fa on ${LLAMA_SLOTS:--np 66 -kvu -c 262144} --port 8080
      fi ;;
    coldstart)  # issue 42: the server's first start on a fresh machine (CuPy's kernel cache emptied), then two more
      chat_model
      rm -rf ~/.cupy/kernel_cache ~/.cache/strata/kernels
      python3 bench/startup_time.py --model $MQC --repeats 3 --json "$OUT/startup_cold_h200.json"
      grep -h "compil" /tmp/startup_time_0.log | head -40 ;;
    upload)  # the weights' upload through pinned buffers against cupy.asarray: times, every byte equal
      chat_model
      python3 tools/device/upload_check.py --model $MQC --threads ${UPLOAD_THREADS:-2,4,8} --json "$OUT/upload_h200.json" \
        | tail -25 || echo "UPLOAD CHECK FAILED" ;;
    graphseq)  # issue 42: decode graphs through batches growing to the largest size and back (the engine's own
      # runner and memory plan, the 8B shape), every row against its solo decode
      chat_model
      timeout ${SEQ_LIMIT:-240} python3 tools/device/decode_graph_sequence_check.py $MQC --rows ${SEQ_ROWS:-1,63,64,65,128,256} \
        --steps ${SEQ_STEPS:-40} --json "$OUT/graphseq_8b.json" 2>&1 | grep -v "loading weights" | tail -${SEQ_TAIL:-12} \
        || echo "GRAPH SEQUENCE CHECK FAILED" ;;
    graphseqbase)  # the same check on the engine before issue 42's fix (.device/base: engine/ of that commit and
      # this tool): it failed there, as the server did at 64 clients
      chat_model
      (cd .device/base && timeout ${SEQ_LIMIT:-240} python3 tools/device/decode_graph_sequence_check.py $MQC \
        --rows ${SEQ_ROWS:-1,63,64,65,128,256} --steps ${SEQ_STEPS:-40} 2>&1 | grep -v "loading weights" | tail -12) \
        || echo "GRAPH SEQUENCE CHECK FAILED (base)" ;;
    graphseqmem)  # the sequence check on the 135M shape under compute-sanitizer's memcheck
      synth_ms
      rows=${MEM_ROWS:-1,63,64,65,128,256}
      # (a pool of 32K positions: the sanitizer's own allocations take room the engine's plan does not know of;
      # API errors not reported: a kernel looked up in a part that lacks it, engine/kernels find_function).
      # The kernels compiled first, outside the sanitizer; the prompt reads' GEMMs and attention (cuBLAS,
      # flash_attention, dequant_) left unchecked, and 8 prompts read, the other sequences copies of their
      # blocks (--reads): 128 prompts' reads under the sanitizer took more than 400 s
      python3 tools/device/decode_graph_sequence_check.py $MS --rows 1 --steps 2 --solo 1 --kv-tokens 32768 2>&1 | tail -1
      timeout ${MEM_LIMIT:-300} compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 30 \
        --kernel-name-exclude "regex=${MEM_EXCLUDE:-gemm|xmma|cutlass|flash_attention|dequant_}" \
        python3 tools/device/decode_graph_sequence_check.py $MS --rows $rows --steps ${MEM_STEPS:-10} \
        --solo 1 --reads ${MEM_READS:-8} --kv-tokens ${MEM_KV:-131072} > "$OUT/memcheck_${rows//,/_}.log" 2>&1 && echo "memcheck: no errors" || echo "MEMCHECK RUN FAILED"
      grep -v "loading weights" "$OUT/memcheck_${rows//,/_}.log" | head -${MEM_HEAD:-60}; tail -5 "$OUT/memcheck_${rows//,/_}.log" ;;
    clients)  # issue 42: the server as a user starts it (defaults), 1..256 streaming clients, texts against solo runs
      chat_model
      timeout ${CLIENTS_LIMIT:-420} python3 bench/clients_bench.py --model $MQC --clients ${CLIENTS:-1,16,64,128,256} \
        --words 300 --max-tokens 256 --solo 8 --log "$OUT/clients_server.log" --json "$OUT/clients_h200.json" \
        || echo "CLIENTS BENCH FAILED" ;;
    specdefault)  # issue 47's default (pending 01-speculation-default-gpu): the ladder as a user starts the server,
      # its default drafter (auto) and then --speculative off, 1 / 16 / 64 / 256 clients, texts against solo runs
      # -> $OUT/clients_spec_{default,off}.json (and their server logs)
      chat_model
      for arm in default off; do  # (CALL_S: the seconds the call may take, where its device time is short)
        flag="" limit=$(((${CALL_S:-590} - SECONDS) / 2))  # (the first arm half the time left)
        [ $arm = off ] && flag="--speculative off" limit=$((${CALL_S:-590} - SECONDS))
        timeout -k 10 $limit python3 bench/clients_bench.py --model $MQC \
          --clients ${CLIENTS:-1,16,64,256} --words 300 --max-tokens 256 --solo 8 ${flag:+--server-arg "$flag"} \
          --log "$OUT/clients_spec_${arm}.log" --json "$OUT/clients_spec_${arm}.json" 2>&1 | tail -6 \
          || echo "CLIENTS ($arm) FAILED"
        grep -c "Traceback\|restart" "$OUT/clients_spec_${arm}.log" || true
      done ;;
    clientsnext)  # the same on the 80B-A3B hybrid shape ($NEXT_TYPE): its reads chunked, its states in the memory plan
      synth_next
      timeout ${CLIENTS_LIMIT:-500} python3 bench/clients_bench.py --model $MNX --clients ${CLIENTS:-1,16,64,256} \
        --words 300 --max-tokens 256 --solo 8 --log "$OUT/clients_next_server.log" --json "$OUT/clients_next.json" \
        || echo "CLIENTS BENCH FAILED" ;;
    clientsbase)  # the same on the server and engine before issue 42's fix (.device/base)
      chat_model
      (cd .device/base && timeout ${CLIENTS_LIMIT:-300} python3 bench/clients_bench.py --model $MQC \
        --clients ${CLIENTS_BASE:-16,64} --words 300 --max-tokens 256 --solo 0 --log "$OUT/clients_base_server.log" \
        --json "$OUT/clients_base_h200.json") || echo "CLIENTS BENCH FAILED (base)" ;;
    basetree)  # /tmp/base made (base_tree) for a script that runs its own steps there (pending_round.sh before44)
      base_tree || echo "no main's tree kept (.device/base: no patch pending)" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done

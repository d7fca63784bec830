#!/usr/bin/env bash
# A short HTTP round on a warm device machine (issue 44): the server as a user starts it on the 8B shape in
# Q4_K_M (made by gpu_run.sh's peers steps), bench/pool_bench.py's CASES (default subagents) under a time limit
# each, the server's log checked for tracebacks and restarts. Leftover servers of a cut-short call are stopped
# first. Results under $OUT.
#   CASES="subagents clients" REPEATS=3 LIMIT=140 bash tools/device/http_quick.sh [server flags...]
set -uo pipefail
M=/tmp/m/llama3-8b-q4_k_m-chat-l3.gguf
pkill -f "python3 -m serve --model" ; pkill -f "engine --serve"; sleep 2
[ -f /tmp/server_strata.log ] && tail -c 3000 /tmp/server_strata.log > "$OUT/prev_server_tail.txt"
python3 -m serve --model $M "$@" > "$OUT/server.log" 2>&1 &
server=$!
for i in $(seq 120); do
  python3 bench/server_health.py; state=$?
  [ $state = 0 ] && break
  [ $state = 2 ] && { tail -20 "$OUT/server.log"; kill -9 $server; exit 1; }  # its engine refused to start
  sleep 1
done
echo "server up after $i s"
for case in ${CASES:-subagents}; do
  timeout -k 5 ${LIMIT:-140} python3 bench/pool_bench.py --url http://127.0.0.1:8080 --label strata --tokenizer $M \
    --repeats ${REPEATS:-3} --cases $case --server-flags "$*" --json "$OUT/pool_strata_$case.json" > "$OUT/bench_$case.txt" 2>&1
  echo "$case rc $?"; tail -12 "$OUT/bench_$case.txt"
done
kill -INT $server; sleep 5; kill -9 $server 2>/dev/null
echo "tracebacks/restarts in the log: $(grep -ci 'traceback\|restart' "$OUT/server.log")"; tail -4 "$OUT/server.log"

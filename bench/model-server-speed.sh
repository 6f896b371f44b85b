#!/usr/bin/env bash
# Model server speed on this machine: the portable llama-server that
# scripts/model-server.sh installs (ggml's CPU variants, the best one chosen
# at start, none with AMX) against a native build of the same pinned
# sources (GGML_NATIVE on, ggml's default: compiled for this CPU, AMX
# included where it has it), built here in a temporary folder only for this
# and never installed. The native build runs twice: as built, and with
# --no-repack, which keeps it off its AMX path (for this model's Q4_1 the
# only extra buffer type it has), in case the AMX path crashes. The
# portable build also runs left with one variant: haswell (AVX2, what a
# node without AVX-512 gets) and x64 (the fallback).
#
#   bash bench/model-server-speed.sh
#   ROUNDS=10 THREADS=2 MAX_TOKENS=128 bash bench/model-server-speed.sh
#   NATIVE_BUILD=/tmp/native bash bench/model-server-speed.sh
# NATIVE_BUILD: a folder for the native build that stays (built there the
# first time, used as it is later), for reruns without the build.
#
# Every server (SmolLM2-135M Q4_1, -t $THREADS, one slot, -c 2048) runs at
# once; after one warm-up each, they answer $ROUNDS chat completions in
# rotation (so that other load on the machine falls on all alike): a prompt
# of about 500 tokens, never from the prompt cache, and $MAX_TOKENS tokens
# generated (ignore_eos). The figures are the servers' own timings
# (prompt_per_second, predicted_per_second): mean, median, min and max. A server
# that does not start is listed with how it ended.
# The native build takes about 6 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-2}
MAX_TOKENS=${MAX_TOKENS:-128}

models=$(bash scripts/model-server.sh | tail -n 1)
# Its functions only: fetch_sdist, build_llama_server, start_server, ...
# shellcheck source=scripts/model-server.sh
source scripts/model-server.sh

tmp=$(mktemp -d /tmp/onepool-bench-model-server.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

native=${NATIVE_BUILD:-$tmp/native}
if [ ! -x "$native/bin/llama-server" ]; then
    fetch_sdist "$tmp"
    say "building a native llama-server (GGML_NATIVE=ON, static) in $native, for this benchmark only"
    build_llama_server "$src" "$native" -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF
fi

# The portable bin/ with one CPU variant only (copied: llama-server looks
# for its variants next to its resolved path).
only_variant() {
    mkdir "$tmp/only-$1"
    cp -P "$models/bin/llama-server" "$models"/bin/*.so* "$tmp/only-$1/"
    find "$tmp/only-$1" -name 'libggml-cpu-*.so' ! -name "libggml-cpu-$1.so" -delete
}
only_variant haswell
only_variant x64

servers=() failed=() backend=
serve() { # LABEL BINARY [ARG...]
    local label=$1 bin=$2
    shift 2
    start_server "$bin" "$models/models/$MODEL" "$THREADS" "$tmp/${label// /_}.log" "$@"
    pids+=("$server_pid")
    if wait_ready 60 2>/dev/null; then
        backend=$(server_cpu_backend || true)
        servers+=("$label (${backend:-static})=$server_port")
    else
        sleep 0.5
        stop_server
        failed+=("$label: did not start, $server_end; its log ends: $(grep -v '^ *$' "$tmp/${label// /_}.log" | tail -n 1 | cut -c1-100)")
    fi
}
serve native "$native/bin/llama-server"
serve "native --no-repack" "$native/bin/llama-server" --no-repack
serve portable "$models/bin/llama-server"
serve portable-haswell "$tmp/only-haswell/llama-server"
serve portable-x64 "$tmp/only-x64/llama-server"

echo "== $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; $(date -u +%Y-%m-%d); onepool $(git rev-parse --short HEAD)"
echo "== llama.cpp of llama-cpp-python $LLAMA_CPP_PYTHON, $MODEL, -t $THREADS, $ROUNDS rounds, $MAX_TOKENS tokens generated"
python3 - "$ROUNDS" "$MAX_TOKENS" "${servers[@]}" <<'PY'
import json, statistics, sys, urllib.request
rounds, max_tokens = int(sys.argv[1]), int(sys.argv[2])
servers = [s.rsplit("=", 1) for s in sys.argv[3:]]
text = " ".join(f"Note {i}: the shared pool lends idle GPUs to inference replicas and takes them back when training needs them."
                for i in range(20))
body = {"messages": [{"role": "user", "content": "Summarise these notes.\n" + text}], "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True, "cache_prompt": False}

def ask(port):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        t = json.load(r)["timings"]
    return t["prompt_n"], t["prompt_per_second"], t["predicted_n"], t["predicted_per_second"]

for _, port in servers:
    ask(port)  # warm-up
got = {label: [] for label, _ in servers}
for _ in range(rounds):
    for label, port in servers:
        got[label].append(ask(port))

def fig(xs):
    return f"{statistics.mean(xs):.1f} {statistics.median(xs):.1f} {min(xs):.1f}-{max(xs):.1f}"
print("tokens/s as mean, median, min-max")
print(f"{'build (CPU backend)':42} {'prompt tok':>10} {'prompt tokens/s':>26} {'gen tok':>7} {'generation tokens/s':>26}")
for label, rows in got.items():
    print(f"{label:42} {rows[0][0]:10d} {fig([r[1] for r in rows]):>26} {rows[0][2]:7d} {fig([r[3] for r in rows]):>26}")
PY
for f in "${failed[@]}"; do echo "$f"; done

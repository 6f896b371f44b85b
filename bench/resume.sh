#!/usr/bin/env bash
# What following answers costs the router (issue #43): onepoold's CPU per
# streamed token and memory per stream, with answers continued by token
# ids (`[endpoint.resume] method = "tokens"`: the router asks for each
# token's id, reads every event and takes the ids out), by text
# (`method = "text"`: every event read) and off (bytes passed as they
# come), side by side in one run, at STREAMS concurrent streams from a
# streaming stand-in of llama-server (elastic-daemon/examples/stream_backend.rs,
# a token every INTERVAL_MS ms, with ids in log-probabilities when asked).
#
#   bash bench/resume.sh                       # 10,000 streams of 100 tokens
#   STREAMS=2000 TOKENS=100 bash bench/resume.sh
#   SHAPE=json_schema BASELINE=/path/to/onepoold VARIANTS="text text@base" bash bench/resume.sh
#
# SHAPE (plain, tools, json_schema) is what every request asks for besides
# its chat (issue #51); a variant named VARIANT@base runs BASELINE's
# onepoold, side by side with this tree's.
#
# Each variant: a fresh onepoold (one tokio worker: pinned to PROXY_CPU),
# the same backend and client (pinned to LOAD_CPU). The router's CPU is
# its utime + stime over the whole run (/proc/PID/stat), per token the
# clients read; memory per stream is its peak RSS while the streams are
# open, less its RSS before them, over the streams. Nothing moves here:
# this is the cost of being ready to.
set -euo pipefail

cd "$(dirname "$0")/.."
source bench/proxy-lib.sh
STREAMS=${STREAMS:-10000}
TOKENS=${TOKENS:-100}
INTERVAL_MS=${INTERVAL_MS:-200}
RAMP=${RAMP:-10}
PROXY_CPU=${PROXY_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
BACKEND_PORT=${BACKEND_PORT:-18090}
ROUTER_PORT=${ROUTER_PORT:-18091}
VARIANTS=${VARIANTS:-"off tokens text"}
SHAPE=${SHAPE:-plain}
case $SHAPE in
    plain) EXTRA_FIELDS= ;;
    tools) EXTRA_FIELDS='"tool_choice":"auto","tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]' ;;
    json_schema) EXTRA_FIELDS='"response_format":{"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object","properties":{"city":{"type":"string"}}}}}' ;;
    *) echo "bench/resume.sh: SHAPE is plain, tools or json_schema, not $SHAPE" >&2; exit 2 ;;
esac
export EXTRA_FIELDS

# Every stream holds a descriptor in the client, two in the router and one
# in the backend: the router needs 2 x STREAMS and a few more.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
if ((2 * STREAMS + 64 > $(ulimit -n))); then
    echo "bench/resume.sh: $STREAMS streams need $((2 * STREAMS + 64)) descriptors in the router; this shell may open $(ulimit -n) (hard limit $(ulimit -Hn)): lower STREAMS" >&2
    exit 1
fi

echo "== building onepoold, the streaming backend and the clients (release)"
cargo build --release -q -p onepool-elastic-daemon --bin onepoold --example stream_backend
cargo build --release -q -p onepool-bench --bin stream_clients
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
ONEPOOLD=$TARGET_DIR/release/onepoold
BACKEND=$TARGET_DIR/release/examples/stream_backend
CLIENTS=$TARGET_DIR/release/stream_clients

TMP=$(mktemp -d /tmp/onepool-bench-resume.XXXXXX)
PIDS=()
cleanup() {
    stop_all "${PIDS[@]}"
    [ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"
}
trap cleanup EXIT


# CPU seconds (utime + stime) of a process.
cpu_seconds() {
    awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"
}
rss_kib() {
    awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"
}

taskset -c "$LOAD_CPU" "$BACKEND" "127.0.0.1:$BACKEND_PORT" "$INTERVAL_MS" 2>"$TMP/backend.log" &
PIDS+=($!)
wait_port "$BACKEND_PORT"

echo "== $STREAMS streams of $TOKENS tokens ($SHAPE), a token every $INTERVAL_MS ms; router on CPU $PROXY_CPU, backend and clients on CPU $LOAD_CPU"
printf '%-8s %8s %10s %10s %12s %14s %14s %12s\n' VARIANT WHOLE TOKENS SECONDS CPU_S US_PER_TOKEN IDLE_RSS_MIB KIB_PER_STREAM
for variant in $VARIANTS; do
    binary=$ONEPOOLD
    if [[ $variant == *@base ]]; then
        binary=${BASELINE:?"bench/resume.sh: $variant needs BASELINE, an onepoold to compare with"}
    fi
    resume=$'\n[endpoint.resume]\nmethod = "'${variant%@base}$'"'
    printf 'control_socket = "%s"\nshutdown_grace = "1s"\n\n[[endpoint]]\nname = "bench"\nlisten = "127.0.0.1:%s"\nreplica_concurrency = 100000\nqueue_size = 100000\nmax_connections = 60000\nmax_connections_per_ip = 60000\nheader_read_timeout = "60s"\n%s\n' \
        "$TMP/$variant.sock" "$ROUTER_PORT" "$resume" >"$TMP/$variant.toml"
    ONEPOOLD_LOG=warn taskset -c "$PROXY_CPU" "$binary" --config "$TMP/$variant.toml" 2>"$TMP/$variant.log" &
    pid=$!
    PIDS+=("$pid")
    wait_port "$ROUTER_PORT"
    curl -sS --fail --unix-socket "$TMP/$variant.sock" -H 'content-type: application/json' \
        -d "{\"address\": \"127.0.0.1:$BACKEND_PORT\", \"ready\": true}" \
        http://onepoold/v1/endpoints/bench/replicas >/dev/null
    sleep 1
    idle=$(rss_kib "$pid")
    cpu0=$(cpu_seconds "$pid")
    peak=$idle
    taskset -c "$LOAD_CPU" "$CLIENTS" "127.0.0.1:$ROUTER_PORT" "$STREAMS" "$TOKENS" "$RAMP" >"$TMP/$variant.json" 2>&2 &
    cpid=$!
    while kill -0 "$cpid" 2>/dev/null; do
        r=$(rss_kib "$pid")
        ((r > peak)) && peak=$r
        sleep 0.2
    done
    wait "$cpid"
    cpu1=$(cpu_seconds "$pid")
    echo "   $variant clients: $(cat "$TMP/$variant.json")" >&2
    read -r whole tokens seconds < <(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["whole"], j["tokens"], j["seconds"])' "$TMP/$variant.json")
    python3 - "$variant" "$whole" "$tokens" "$seconds" "$cpu0" "$cpu1" "$idle" "$peak" "$STREAMS" <<'PY'
import sys
v, whole, tokens, secs, c0, c1, idle, peak, streams = sys.argv[1:]
cpu = float(c1) - float(c0)
per_token = cpu / max(int(tokens), 1) * 1e6
per_stream = (int(peak) - int(idle)) / int(streams)
print(f"{v:<8} {whole:>8} {tokens:>10} {float(secs):>10.1f} {cpu:>12.2f} {per_token:>14.2f} {int(idle)/1024:>14.1f} {per_stream:>12.2f}")
PY
    kill "$pid"
    wait "$pid" 2>/dev/null || true
done

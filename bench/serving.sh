#!/usr/bin/env bash
# Serving benchmark: what onepool adds to a real model server's latency.
# One llama-server (SmolLM2-135M, scripts/model-server.sh) started by
# `onepool replica` (the launcher, as on a compute node), reached three
# ways in the same run, request by request in rotation:
#   direct     llama-server itself
#   launcher   through the launcher's front (counts requests, drains)
#   onepoold   through onepoold's router, then the launcher
# Streamed chat completions of $MAX_TOKENS tokens, one at a time, $ROUNDS
# per target: time to first token and total time, p50 and p99.
#
#   bash bench/serving.sh
#   ROUNDS=100 MAX_TOKENS=32 bash bench/serving.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/proxy-lib.sh
ROUNDS=${ROUNDS:-60}
MAX_TOKENS=${MAX_TOKENS:-16}
LAUNCHER_PORT=${LAUNCHER_PORT:-18090}
ONEPOOLD_PORT=${ONEPOOLD_PORT:-18092}

models=$(bash scripts/model-server.sh | tail -n 1)
echo "== building onepool and onepoold (release)"
cargo build --release -q -p onepool-cli -p onepool-elastic-daemon --bin onepool --bin onepoold
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')

TMP=$(mktemp -d /tmp/onepool-bench-serving.XXXXXX)
PIDS=()
cleanup() {
    stop_all "${PIDS[@]}"
    rm -rf "$TMP"
}
trap cleanup EXIT

# The bench is the launcher's onepoold: it names the replica key and the
# server's own key, and its client sends each where it goes.
export ONEPOOL_REPLICA_KEY=serving-bench-replica-key-0123456789 ONEPOOL_BACKEND_API_KEY=serving-bench-server-key-0123456789
printf '%s\n' "$ONEPOOL_REPLICA_KEY" >"$TMP/replica.key"
chmod 600 "$TMP/replica.key"
start_llama_replica "$LAUNCHER_PORT" 4 "$TMP/replica.log"
cat >"$TMP/onepoold.toml" <<CONF
control_socket = "$TMP/onepoold.sock"
shutdown_grace = "1s"
replica_key_file = "$TMP/replica.key"

[[endpoint]]
name = "chat"
listen = "127.0.0.1:$ONEPOOLD_PORT"
replica_concurrency = 4
CONF
ONEPOOLD_LOG=warn "$TARGET_DIR/release/onepoold" --config "$TMP/onepoold.toml" 2>"$TMP/onepoold.log" &
PIDS+=($!)
for _ in $(seq 200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' -H "x-onepool-replica-key: $ONEPOOL_REPLICA_KEY" "http://127.0.0.1:$LAUNCHER_PORT/health")" = 200 ] && [ -S "$TMP/onepoold.sock" ] && break
    sleep 0.1
done
curl -sS --fail --unix-socket "$TMP/onepoold.sock" -H 'content-type: application/json' \
    -d "{\"address\": \"127.0.0.1:$LAUNCHER_PORT\", \"ready\": true}" \
    http://onepoold/v1/endpoints/chat/replicas >/dev/null

echo "== $ROUNDS streamed chat completions of $MAX_TOKENS tokens per target, one at a time, in rotation"
echo "   ($(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1))"
printf '%-9s %5s %10s %10s %10s %10s\n' target n ttft_p50 ttft_p99 total_p50 total_p99
python3 bench/serving_client.py "$ROUNDS" "$MAX_TOKENS" \
    direct=$((LAUNCHER_PORT + 1)) launcher="$LAUNCHER_PORT" onepoold="$ONEPOOLD_PORT" |
    while read -r name n a b c d; do printf '%-9s %5s %8s ms %8s ms %8s ms %8s ms\n' "$name" "$n" "$a" "$b" "$c" "$d"; done

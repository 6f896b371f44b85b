#!/usr/bin/env bash
# Request classes on a real model (issue #44): live requests (a key of the
# endpoint's own class) at half a replica's capacity, alone and then beside
# an agents' flood (a key of the agents class) of AGENTS clients sending
# back to back, through onepoold's router to one llama-server (SmolLM2-135M,
# scripts/model-server.sh, SLOTS requests at once) under `onepool replica`.
# Two variants in the same run, the same replica: classes on (the agents'
# key names its class) and off (both keys plain: one FIFO queue).
# bench/src/bin/class_clients.rs measures the flood alone first (the
# capacity), then live alone, then both; each phase PHASE_SECS.
#
#   bash bench/classes.sh
#   AGENTS=40 TOKENS=32 PHASE_SECS=30 bash bench/classes.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/proxy-lib.sh
SLOTS=${SLOTS:-4}
TOKENS=${TOKENS:-32}
AGENTS=${AGENTS:-$((10 * SLOTS))}
PHASE_SECS=${PHASE_SECS:-30}
LAUNCHER_PORT=${LAUNCHER_PORT:-18094}
ONEPOOLD_PORT=${ONEPOOLD_PORT:-18096}
VARIANTS=${VARIANTS:-"on off"}
LIVE_KEY=bench-live-key-0123456789abcdef
AGENTS_KEY=bench-agents-key-0123456789abcdef

models=$(bash scripts/model-server.sh | tail -n 1)
echo "== building onepool, onepoold and the clients (release)"
cargo build --release -q -p onepool-cli -p onepool-elastic-daemon --bin onepool --bin onepoold
cargo build --release -q -p onepool-bench --bin class_clients
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')

TMP=$(mktemp -d /tmp/onepool-bench-classes.XXXXXX)
PIDS=()
cleanup() {
    stop_all "${PIDS[@]}"
    rm -rf "$TMP"
}
trap cleanup EXIT

export ONEPOOL_REPLICA_KEY=classes-bench-replica-key-0123456789 ONEPOOL_BACKEND_API_KEY=classes-bench-server-key-0123456789
printf '%s\n' "$ONEPOOL_REPLICA_KEY" >"$TMP/replica.key"
chmod 600 "$TMP/replica.key"
start_llama_replica "$LAUNCHER_PORT" "$SLOTS" "$TMP/replica.log"
for _ in $(seq 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' -H "x-onepool-replica-key: $ONEPOOL_REPLICA_KEY" "http://127.0.0.1:$LAUNCHER_PORT/health")" = 200 ] && break
    sleep 0.1
done

echo "== $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
echo "== one llama-server of $SLOTS slots; streams of $TOKENS tokens; an agents' flood of $AGENTS clients; phases of $PHASE_SECS s"
for variant in $VARIANTS; do
    if [ "$variant" = on ]; then
        printf '%s\n%s agents\n' "$LIVE_KEY" "$AGENTS_KEY" >"$TMP/keys"
        class=$'request_class = "inference"\n'
    else
        printf '%s\n%s\n' "$LIVE_KEY" "$AGENTS_KEY" >"$TMP/keys"
        class=
    fi
    chmod 600 "$TMP/keys"
    cat >"$TMP/onepoold.toml" <<CONF
control_socket = "$TMP/onepoold.sock"
shutdown_grace = "1s"
replica_key_file = "$TMP/replica.key"
policy = "$PWD/etc/onepool.toml"

[[endpoint]]
name = "chat"
listen = "127.0.0.1:$ONEPOOLD_PORT"
replica_concurrency = $SLOTS
queue_size = 10000
queue_timeout = "300s"
request_timeout = "300s"
${class}
[endpoint.auth]
bearer_tokens_file = "$TMP/keys"
CONF
    ONEPOOLD_LOG=warn "$TARGET_DIR/release/onepoold" --config "$TMP/onepoold.toml" 2>"$TMP/onepoold-$variant.log" &
    pid=$!
    wait_port "$ONEPOOLD_PORT"
    for _ in $(seq 50); do [ -S "$TMP/onepoold.sock" ] && break; sleep 0.1; done
    curl -sS --fail --unix-socket "$TMP/onepoold.sock" -H 'content-type: application/json' \
        -d "{\"address\": \"127.0.0.1:$LAUNCHER_PORT\", \"ready\": true}" \
        http://onepoold/v1/endpoints/chat/replicas >/dev/null
    echo "-- classes $variant"
    "$TARGET_DIR/release/class_clients" "127.0.0.1:$ONEPOOLD_PORT" "$LIVE_KEY" "$AGENTS_KEY" "$TOKENS" 0 "$AGENTS" "$PHASE_SECS"
    stop_all "$pid"
done

#!/usr/bin/env bash
# Router benchmark: added latency and maximum throughput of onepoold against
# nginx, both proxying the same backend, and against the backend directly,
# side by side in one run.
#
#   bash bench/router.sh                 # defaults below
#   DURATION=10 CONNS=64 bash bench/router.sh
#
# Pinning (taskset): the proxy under test (nginx or onepoold) on core
# $PROXY_CPU, the backend and the load generator (wrk) on core $LOAD_CPU;
# the same for both proxies. nginx runs one worker process and onepoold one
# tokio worker thread (the runtime sizes itself to the one core it may use).
#
# Maximum throughput: wrk, $CONNS connections, $DURATION s, one thread.
# Latency at half load: wrk has no rate limit (wrk2 is not in Debian), so
# each of $HALF_CONNS connections waits $HALF_DELAY_MS ms (wrk's delay()
# hook) before each request; $HALF_CONNS is chosen so that the offered rate
# is about half of the lower proxy maximum, the same for all three targets.
# The achieved rate is printed beside each figure. Latencies are wrk's
# --latency distribution (no coordinated-omission correction).
#
# Side by side with it, in the same run and under the same load:
# - onepoold, prefix routing: the same onepoold binary, an endpoint routing
#   by prompt prefix ([endpoint.routing] policy = "prefix");
# - onepoold, TLS to the replica: the same onepoold binary, its replica a
#   second backend serving TLS as `onepool replica --tls` does (a
#   certificate made at start), pinned by its fingerprint (issue #36); its
#   rows against onepoold's are what the encrypted hop adds (both ends:
#   the backend's side of TLS runs on the load core);
# - onepoold baseline: another onepoold binary, when BASELINE=PATH names one
#   (e.g. built from an earlier commit), to show a change did not make the
#   forward path slower.
# With BODY_BYTES=N every target gets a POST of an OpenAI chat completion
# with an N-byte system prompt (the prefix endpoint then hashes a real
# prompt) instead of a GET.
#
# Needs: Debian (apt-get installs nginx and wrk if missing), cargo, curl.
set -euo pipefail

cd "$(dirname "$0")/.."
source bench/proxy-lib.sh
ROOT=$PWD
DURATION=${DURATION:-10}
CONNS=${CONNS:-64}
HALF_DELAY_MS=${HALF_DELAY_MS:-2}
WARMUP=${WARMUP:-2}
PROXY_CPU=${PROXY_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
BACKEND_PORT=${BACKEND_PORT:-18080}
NGINX_PORT=${NGINX_PORT:-18081}
ONEPOOLD_PORT=${ONEPOOLD_PORT:-18082}
PREFIX_PORT=${PREFIX_PORT:-18083}
BASELINE_PORT=${BASELINE_PORT:-18084}
TLS_BACKEND_PORT=${TLS_BACKEND_PORT:-18085}
TLS_PORT=${TLS_PORT:-18086}
BASELINE=${BASELINE:-}
BODY_BYTES=${BODY_BYTES:-0}

need=()
command -v nginx >/dev/null || need+=(nginx)
command -v wrk >/dev/null || need+=(wrk)
if ((${#need[@]})); then
    echo "== installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v taskset >/dev/null || { echo "taskset (util-linux) is missing" >&2; exit 1; }

echo "== building onepoold and the bench backend (release)"
cargo build --release -q -p onepool-elastic-daemon --bin onepoold --example bench_backend
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
ONEPOOLD=$TARGET_DIR/release/onepoold
BACKEND=$TARGET_DIR/release/examples/bench_backend

TMP=$(mktemp -d /tmp/onepool-bench.XXXXXX)
PIDS=()
cleanup() {
    stop_all "${PIDS[@]}"
    rm -rf "$TMP"
}
trap cleanup EXIT


# --- backend
taskset -c "$LOAD_CPU" "$BACKEND" "127.0.0.1:$BACKEND_PORT" 2>"$TMP/backend.log" &
PIDS+=($!)
wait_port "$BACKEND_PORT"
# The TLS replica prints its certificate's fingerprint first.
taskset -c "$LOAD_CPU" "$BACKEND" "127.0.0.1:$TLS_BACKEND_PORT" --tls >"$TMP/tls-backend.pin" 2>"$TMP/tls-backend.log" &
PIDS+=($!)
wait_port "$TLS_BACKEND_PORT"
TLS_PIN=$(cat "$TMP/tls-backend.pin")

# --- nginx: one worker, keep-alive to the backend, no access log
mkdir -p "$TMP/nginx"
cat >"$TMP/nginx/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 1;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $TMP/nginx/body;
    proxy_temp_path $TMP/nginx/proxy;
    fastcgi_temp_path $TMP/nginx/fastcgi;
    uwsgi_temp_path $TMP/nginx/uwsgi;
    scgi_temp_path $TMP/nginx/scgi;
    keepalive_requests 1000000;
    upstream backend {
        server 127.0.0.1:$BACKEND_PORT;
        keepalive 256;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
taskset -c "$PROXY_CPU" nginx -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" &
NGINX_PID=$!
PIDS+=("$NGINX_PID")
wait_port "$NGINX_PORT"

# --- onepoold: an endpoint per variant, the backend added through the
# control socket. NAME BINARY PORT [ROUTING TABLE [BACKEND PORT [PIN]]];
# sets PID_<NAME>.
start_onepoold() {
    local name=$1 binary=$2 port=$3 routing=${4:-} backend=${5:-$BACKEND_PORT} pin=${6:-}
    printf 'control_socket = "%s"\nshutdown_grace = "1s"\n\n[[endpoint]]\nname = "bench"\nlisten = "127.0.0.1:%s"\nreplica_concurrency = 100000\nqueue_size = 100000\n%s\n' \
        "$TMP/$name.sock" "$port" "$routing" >"$TMP/$name.toml"
    ONEPOOLD_LOG=warn taskset -c "$PROXY_CPU" "$binary" --config "$TMP/$name.toml" 2>"$TMP/$name.log" &
    PIDS+=($!)
    printf -v "PID_$name" %s "$!"
    wait_port "$port"
    curl -sS --fail --unix-socket "$TMP/$name.sock" -H 'content-type: application/json' \
        -d "{\"address\": \"127.0.0.1:$backend\", \"ready\": true${pin:+, \"pin\": \"$pin\"}}" \
        http://onepoold/v1/endpoints/bench/replicas >/dev/null
}
start_onepoold onepoold "$ONEPOOLD" "$ONEPOOLD_PORT"
ONEPOOLD_PID=$PID_onepoold
start_onepoold prefix "$ONEPOOLD" "$PREFIX_PORT" $'[endpoint.routing]\npolicy = "prefix"'
start_onepoold tls "$ONEPOOLD" "$TLS_PORT" "" "$TLS_BACKEND_PORT" "$TLS_PIN"
if [ -n "$BASELINE" ]; then
    start_onepoold baseline "$BASELINE" "$BASELINE_PORT"
fi

WORKERS=$(ls /proc/"$ONEPOOLD_PID"/task | while read -r t; do cat "/proc/$ONEPOOLD_PID/task/$t/comm"; done | grep -c '^tokio-r' || true)
NGINX_WORKERS=$(pgrep -P "$NGINX_PID" | wc -l)
ports=("$BACKEND_PORT" "$NGINX_PORT" "$ONEPOOLD_PORT" "$PREFIX_PORT" "$TLS_PORT")
[ -z "$BASELINE" ] || ports+=("$BASELINE_PORT")
for port in "${ports[@]}"; do
    body=$(curl -sS --fail "http://127.0.0.1:$port/")
    [ "$body" = "hello, world" ] || { echo "127.0.0.1:$port answered ${body@Q}" >&2; exit 1; }
done

# CPU time (ticks) of a process and its children (nginx's worker).
HZ=$(getconf CLK_TCK)
cpu_ticks() {
    local total=0 p
    for p in "$1" $(pgrep -P "$1" || true); do
        total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
    done
    echo "$total"
}

# The request: a GET, or with BODY_BYTES a chat completion's POST (one
# system prompt shared by every request, as an agent's or a chat's).
if ((BODY_BYTES > 0)); then
    prompt=$(head -c "$BODY_BYTES" /dev/zero | tr '\0' 'x')
    {
        echo 'wrk.method = "POST"'
        echo 'wrk.headers["Content-Type"] = "application/json"'
        echo "wrk.body = '{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"$prompt\"},{\"role\":\"user\",\"content\":\"hi\"}]}'"
    } >"$TMP/max.lua"
else
    : >"$TMP/max.lua"
fi
{ cat "$TMP/max.lua"; echo 'function delay() return '"$HALF_DELAY_MS"' end'; } >"$TMP/pace.lua"

# run NAME URL CONNS [pace] -> "rps p50_us p99_us cpu_us_per_req"
run() {
    local url=$2 conns=$3 pace=${4:-} pid=${5:-} args=(-s "$TMP/max.lua") before after out
    [ -n "$pace" ] && args=(-s "$TMP/pace.lua")
    taskset -c "$LOAD_CPU" wrk -t1 -c"$conns" -d"${WARMUP}s" "${args[@]}" "$url" >/dev/null
    before=$([ -n "$pid" ] && cpu_ticks "$pid" || echo 0)
    out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$conns" -d"${DURATION}s" --latency "${args[@]}" "$url")
    after=$([ -n "$pid" ] && cpu_ticks "$pid" || echo 0)
    echo "$out" >"$TMP/wrk-$1.txt"
    if grep -q 'Non-2xx\|Socket errors' <<<"$out"; then
        echo "$1: wrk saw errors:" >&2
        echo "$out" >&2
        exit 1
    fi
    awk -v ticks=$((after - before)) -v hz="$HZ" -v dur="$DURATION" '
        function us(v) {
            if (v ~ /us$/) return v + 0
            if (v ~ /ms$/) return (v + 0) * 1000
            if (v ~ /s$/) return (v + 0) * 1000000
        }
        /^ +50%/ { p50 = us($2) }
        /^ +99%/ { p99 = us($2) }
        /^Requests\/sec:/ { rps = $2 }
        END {
            cpu = (ticks > 0 && rps > 0) ? ticks / hz * 1000000 / (rps * dur) : 0
            printf "%.0f %.0f %.0f %.1f\n", rps, p50, p99, cpu
        }' <<<"$out"
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
echo "== maximum throughput: wrk -t1 -c$CONNS -d${DURATION}s (after ${WARMUP}s warm-up)"
read -r D_RPS D_P50 D_P99 _ < <(run direct-max "http://127.0.0.1:$BACKEND_PORT/" "$CONNS")
read -r N_RPS N_P50 N_P99 N_CPU < <(run nginx-max "http://127.0.0.1:$NGINX_PORT/" "$CONNS" "" "$NGINX_PID")
read -r O_RPS O_P50 O_P99 O_CPU < <(run onepoold-max "http://127.0.0.1:$ONEPOOLD_PORT/" "$CONNS" "" "$ONEPOOLD_PID")
read -r P_RPS P_P50 P_P99 P_CPU < <(run prefix-max "http://127.0.0.1:$PREFIX_PORT/" "$CONNS" "" "$PID_prefix")
read -r T_RPS T_P50 T_P99 T_CPU < <(run tls-max "http://127.0.0.1:$TLS_PORT/" "$CONNS" "" "$PID_tls")
if [ -n "$BASELINE" ]; then
    read -r B_RPS B_P50 B_P99 B_CPU < <(run baseline-max "http://127.0.0.1:$BASELINE_PORT/" "$CONNS" "" "$PID_baseline")
fi

LOW=$((N_RPS < O_RPS ? N_RPS : O_RPS))
HALF=$((LOW / 2))
# Each paced connection sends one request per (delay + about 0.1 ms).
HALF_CONNS=${HALF_CONNS:-$(awk -v r="$HALF" -v d="$HALF_DELAY_MS" 'BEGIN { c = int(r * (d + 0.1) / 1000 + 0.5); print (c < 1 ? 1 : c) }')}
echo "== half load: about $HALF req/s offered (half of the lower proxy maximum, $LOW):" \
    "wrk -t1 -c$HALF_CONNS, ${HALF_DELAY_MS} ms delay before each request"
read -r DH_RPS DH_P50 DH_P99 _ < <(run direct-half "http://127.0.0.1:$BACKEND_PORT/" "$HALF_CONNS" pace)
read -r NH_RPS NH_P50 NH_P99 NH_CPU < <(run nginx-half "http://127.0.0.1:$NGINX_PORT/" "$HALF_CONNS" pace "$NGINX_PID")
read -r OH_RPS OH_P50 OH_P99 OH_CPU < <(run onepoold-half "http://127.0.0.1:$ONEPOOLD_PORT/" "$HALF_CONNS" pace "$ONEPOOLD_PID")
read -r PH_RPS PH_P50 PH_P99 _ < <(run prefix-half "http://127.0.0.1:$PREFIX_PORT/" "$HALF_CONNS" pace "$PID_prefix")
read -r TH_RPS TH_P50 TH_P99 TH_CPU < <(run tls-half "http://127.0.0.1:$TLS_PORT/" "$HALF_CONNS" pace "$PID_tls")
if [ -n "$BASELINE" ]; then
    read -r BH_RPS BH_P50 BH_P99 _ < <(run baseline-half "http://127.0.0.1:$BASELINE_PORT/" "$HALF_CONNS" pace "$PID_baseline")
fi

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
added() { echo $(($1 - $2)); }

LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
echo
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1));" \
    "load average (1/5/15 min) $LOAD_BEFORE before, $LOAD_AFTER after"
echo "pinning: proxy (nginx $(nginx -v 2>&1 | sed 's/.*nginx\///'), $NGINX_WORKERS worker; onepoold, $WORKERS tokio worker) on core $PROXY_CPU;" \
    "backend and wrk on core $LOAD_CPU"
echo
echo "| target | max req/s | vs direct | vs nginx | proxy CPU µs/req | half-load req/s | p50 µs | p99 µs | added p50 µs | added p99 µs |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
echo "| direct | $D_RPS | 1.00 | $(ratio "$D_RPS" "$N_RPS") | - | $DH_RPS | $DH_P50 | $DH_P99 | 0 | 0 |"
echo "| nginx | $N_RPS | $(ratio "$N_RPS" "$D_RPS") | 1.00 | $N_CPU | $NH_RPS | $NH_P50 | $NH_P99 |" \
    "$(added "$NH_P50" "$DH_P50") | $(added "$NH_P99" "$DH_P99") |"
echo "| onepoold | $O_RPS | $(ratio "$O_RPS" "$D_RPS") | $(ratio "$O_RPS" "$N_RPS") | $O_CPU | $OH_RPS | $OH_P50 | $OH_P99 |" \
    "$(added "$OH_P50" "$DH_P50") | $(added "$OH_P99" "$DH_P99") |"
echo "| onepoold, prefix routing | $P_RPS | $(ratio "$P_RPS" "$D_RPS") | $(ratio "$P_RPS" "$N_RPS") | $P_CPU | $PH_RPS | $PH_P50 | $PH_P99 |" \
    "$(added "$PH_P50" "$DH_P50") | $(added "$PH_P99" "$DH_P99") |"
echo "| onepoold, TLS to the replica | $T_RPS | $(ratio "$T_RPS" "$D_RPS") | $(ratio "$T_RPS" "$N_RPS") | $T_CPU | $TH_RPS | $TH_P50 | $TH_P99 |" \
    "$(added "$TH_P50" "$DH_P50") | $(added "$TH_P99" "$DH_P99") |"
if [ -n "$BASELINE" ]; then
    echo "| onepoold baseline | $B_RPS | $(ratio "$B_RPS" "$D_RPS") | $(ratio "$B_RPS" "$N_RPS") | $B_CPU | $BH_RPS | $BH_P50 | $BH_P99 |" \
        "$(added "$BH_P50" "$DH_P50") | $(added "$BH_P99" "$DH_P99") |"
    echo "baseline: $BASELINE"
fi
if ((BODY_BYTES > 0)); then
    echo "request: POST of a chat completion with a ${BODY_BYTES}-byte system prompt"
else
    echo "request: GET /"
fi
echo
echo "max-load latency (wrk -c$CONNS): direct p50/p99 $D_P50/$D_P99 µs, nginx $N_P50/$N_P99 µs, onepoold $O_P50/$O_P99 µs"
echo "TLS hop (onepoold, TLS to the replica, against onepoold's clear hop in this run): time to first byte at half load" \
    "+$(added "$TH_P50" "$OH_P50") µs p50, +$(added "$TH_P99" "$OH_P99") µs p99; onepoold CPU" \
    "$(awk -v t="$TH_CPU" -v o="$OH_CPU" 'BEGIN { printf "%+.1f", t - o }') µs/req at half load ($OH_CPU -> $TH_CPU)," \
    "$(awk -v t="$T_CPU" -v o="$O_CPU" 'BEGIN { printf "%+.1f", t - o }') µs/req at maximum; maximum $(ratio "$T_RPS" "$O_RPS") of clear"
echo "goal (reported, not gated): onepoold throughput >= nginx: $(awk -v o="$O_RPS" -v n="$N_RPS" 'BEGIN { print (o >= n ? "met" : "not met") }');" \
    "added p99 at half load < 1000 µs: $(a=$(added "$OH_P99" "$DH_P99"); if ((a < 0)); then echo 'inconclusive (direct p99 above proxied: noise)'; elif ((a < 1000)); then echo met; else echo 'not met'; fi)"
busy=$(ps -eo pcpu=,comm= --sort=-pcpu | awk -v me="$$" '$1 > 20 && $2 !~ /^(wrk|nginx|onepoold|bench_backend)$/ { printf "%s %s%%; ", $2, $1 }')
[ -z "$busy" ] || echo "warning: other busy processes during the run: $busy(figures are noisy)"

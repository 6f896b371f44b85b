#!/usr/bin/env bash
# Prefix-aware routing benchmark (issue #28): the Mooncake FAST'25
# conversation trace (data/mooncake-fast25-conversation-3000.jsonl,
# attribution in data/NOTICE.md), its prompts rebuilt so that requests that
# share leading block hashes share leading text, replayed through onepoold's
# router to three real llama-server replicas (SmolLM2-135M, CPU), once with
# prefix-aware routing and once least-outstanding, side by side; each on
# freshly started servers. Prints time to first token p50/p90/p99, latency,
# throughput and how the router routed. No Slurm needed.
#
#   bash bench/prefix.sh [FROM] [SECONDS] [SPEED] [ROUNDS]
#
# FROM/SECONDS: the stretch of the trace (defaults: 420 s on, 90 s: within
# the stretch of the kept 987 s with the most prefix reuse); SPEED: trace seconds
# per wall second (0.25: what 3 one-thread replicas on 2 cores keep up with).
set -euo pipefail
cd "$(dirname "$0")/.."
from=${1:-420}
seconds=${2:-90}
speed=${3:-0.25}
rounds=${4:-1}
bash scripts/model-server.sh >/dev/null
cargo build --quiet -p onepool-bench --bin prefix_bench
echo "$(nproc) cores; $(git rev-parse --short HEAD)"
./target/debug/prefix_bench data/mooncake-fast25-conversation-3000.jsonl "$from" "$seconds" "$speed" "$rounds"

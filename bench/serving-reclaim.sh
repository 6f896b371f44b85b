#!/usr/bin/env bash
# Serving reclaim benchmark: a protected training job takes one of three
# llama-server replicas' GPUs while the Azure conversation trace is replayed
# against them as chat completions; onepool (router + launcher, Slurm's
# notice) against Slurm's native GraceTime with the same replicas behind an
# nginx round-robin upstream, side by side in one run. Reports the time to
# capacity beside the longest request then in flight, and the requests that
# failed among those in flight and among those that arrived during the wait.
# A real cluster of its own in target/serving-reclaim-cluster, stopped at
# the end. Slurm 22.05 (the host) only: nginx is installed on the host.
#
# The load is a share of the capacity the two replicas left after the
# reclaim have (measured first, one replica alone): LOAD 0.8 (the default)
# offers 80 % of it, on any machine; LOAD 3x replays the trace 3 times
# faster than recorded whatever the machine (the figure kept before #24).
#
#   bash bench/serving-reclaim.sh [ROUNDS] [LOAD]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
load=${2:-0.8}
bash scripts/install-deps.sh
bash scripts/model-server.sh >/dev/null
if ! command -v nginx >/dev/null; then
    echo "serving-reclaim: installing nginx-light (the native variant's front)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light >/dev/null
    # Debian starts its service on port 80; the benchmark runs its own.
    service nginx stop >/dev/null 2>&1 || pkill -x nginx || true
fi
cargo build --quiet --workspace --bins
dir=$PWD/target/serving-reclaim-cluster
trap './target/debug/onepool-devcluster --dir "$dir" down >/dev/null || true' EXIT
echo "Slurm $(dpkg-query -W -f '${Version}' slurm-client 2>/dev/null), nginx $(nginx -v 2>&1 | sed 's/.*nginx\///')"
./target/debug/serving_reclaim_bench "$dir" data/azure-llm-inference-2023-conv.csv "$rounds" "$load"

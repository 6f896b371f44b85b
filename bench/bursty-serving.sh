#!/usr/bin/env bash
# Bursty serving benchmark (issue #18): a bursty trace (onepool-tracegen
# bursts: quiet gaps of 30-140 s, bursts of 1.6-8 s at 36-62 requests/s,
# request sizes from the Azure conversation trace) replayed through onepoold
# on a real cluster of its own, four ways side by side: reactive (the
# autoscaler alone), warm headroom + trend, over-provisioned, and reactive
# with a latency target (queue p99 1 s, issue #28). Reports the
# queueing delay (p50/p99, all requests and those of burst seconds), failed
# requests, the GPU-minutes the endpoint held, the replica jobs submitted
# and a protected job's time to capacity with each variant in its way.
# The cluster lives in target/bursty-cluster and is stopped at the end.
# TRACE=conversation replays the first SECONDS of the Azure conversation
# trace instead (steady load, for comparison). ONEPOOL_BENCH_VARIANTS=
# reactive,latency runs only those variants (first word of their names).
#
#   bash bench/bursty-serving.sh [SECONDS] [SEED]
#   TRACE=conversation bash bench/bursty-serving.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-240}
seed=${2:-7}
bash scripts/install-deps.sh
cargo build --quiet --workspace --bins
dir=$PWD/target/bursty-cluster
trap './target/debug/onepool-devcluster --dir "$dir" down >/dev/null || true' EXIT
if [ "${TRACE:-bursts}" = conversation ]; then
    trace=$PWD/data/azure-llm-inference-2023-conv.csv
    what="the first $seconds s of the Azure conversation trace"
else
    trace=$PWD/target/bursty-$seconds-$seed.csv
    ./target/debug/onepool-tracegen bursts data/azure-llm-inference-2023-conv.csv "$seconds" "$seed" >"$trace"
    what="onepool-tracegen bursts data/azure-llm-inference-2023-conv.csv $seconds $seed"
fi
echo "Slurm $(dpkg-query -W -f '${Version}' slurm-client 2>/dev/null); $(nproc) cores; trace: $what"
./target/debug/bursty_bench "$dir" "$trace" "$seconds"

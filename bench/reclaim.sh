#!/usr/bin/env bash
# Reclaim benchmark: time to capacity (protected job submitted -> RUNNING)
# and the victim's requests lost, side by side in one run, for onepool's
# graceful and immediate reclaim and three ways Slurm's native GraceTime
# plays out; then the autoscaler's reaction to a load step. A real cluster
# of its own in target/reclaim-bench-cluster, stopped at the end.
#
#   bash bench/reclaim.sh [ROUNDS]
#   ONEPOOL_SLURM_RELEASE=26.05 bash bench/reclaim.sh [ROUNDS]   (bench/release.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
source bench/release.sh
bench_host bash scripts/install-deps.sh
bench_host cargo build --quiet --workspace --bins
bench_enter_release "$@"
dir=$target/reclaim-bench-cluster
trap '"$target/debug/onepool-devcluster" --dir "$dir" down >/dev/null || true' EXIT
bench_release_line
"$target/debug/reclaim_bench" "$dir" "$rounds"

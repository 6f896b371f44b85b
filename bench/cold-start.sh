#!/usr/bin/env bash
# Cold start from zero (issue #28): an endpoint with min = 0 whose replica
# is a real llama-server (SmolLM2-135M, CPU) in a Slurm job on the dev
# cluster, woken by one streamed chat request per round and left idle until
# onepoold has given the GPUs back. Prints, per round, where the request's
# time to first token went (wake, sbatch, Slurm's scheduling, the model's
# load and health check, the first token) and a warm request's beside it.
#
#   bash bench/cold-start.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
bash scripts/install-deps.sh
bash scripts/model-server.sh >/dev/null
cargo build --quiet --workspace --bins
dir=$PWD/target/cold-start-cluster
trap './target/debug/onepool-devcluster --dir "$dir" down >/dev/null || true' EXIT
echo "$(nproc) cores; Slurm $(dpkg-query -W -f '${Version}' slurm-client 2>/dev/null); $(git rev-parse --short HEAD)"
./target/debug/cold_start_bench "$dir" "$rounds"

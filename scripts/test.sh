#!/usr/bin/env bash
# The whole test suite: unit tests, then integration tests against a real
# Slurm cluster (munge, MariaDB, slurmdbd, slurmctld, 4 slurmd with fake
# GPUs) that this script brings up in target/test-cluster and stops again.
# Set ONEPOOL_KEEP_CLUSTER=1 to leave it running for the next run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

echo "== build"
cargo build --workspace --all-targets

echo "== unit tests"
cargo test --workspace --exclude onepool-tests

echo "== integration tests (real Slurm)"
export ONEPOOL_TEST_CLUSTER_DIR=${ONEPOOL_TEST_CLUSTER_DIR:-$PWD/target/test-cluster}
cleanup() {
    if [ "${ONEPOOL_KEEP_CLUSTER:-0}" != 1 ]; then
        ./target/debug/onepool-devcluster --dir "$ONEPOOL_TEST_CLUSTER_DIR" down || true
    fi
}
trap cleanup EXIT
# One test at a time: they share the cluster and each leaves it idle.
cargo test -p onepool-tests -- --test-threads=1

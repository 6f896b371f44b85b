#!/usr/bin/env bash
# The whole test suite: unit tests, then integration tests against a real
# Slurm cluster (munge, MariaDB, slurmdbd, slurmctld, 4 slurmd with fake
# GPUs) that this script brings up in target/test-cluster and stops again,
# then the README's main command (the demo) on a cluster of its own.
# Set ONEPOOL_KEEP_CLUSTER=1 to leave the test cluster running for the next
# run; ONEPOOL_SKIP_DEMO=1 to skip the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

echo "== build"
cargo build --workspace --all-targets

echo "== unit tests"
cargo test --workspace --exclude onepool-tests

echo "== integration tests (real Slurm)"
export ONEPOOL_TEST_CLUSTER_DIR=${ONEPOOL_TEST_CLUSTER_DIR:-$PWD/target/test-cluster}
demo_dir=$PWD/target/demo-cluster
cleanup() {
    if [ "${ONEPOOL_KEEP_CLUSTER:-0}" != 1 ]; then
        ./target/debug/onepool-devcluster --dir "$ONEPOOL_TEST_CLUSTER_DIR" down >/dev/null 2>&1 || true
    fi
    ./target/debug/onepool-devcluster --dir "$demo_dir" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
# One test at a time: they share the cluster and each leaves it idle.
cargo test -p onepool-tests -- --test-threads=1

if [ "${ONEPOOL_SKIP_DEMO:-0}" != 1 ]; then
    echo "== the demo (bash scripts/demo.sh), on its own cluster in $demo_dir"
    # Two clusters on a small machine would slow both: the test cluster goes first.
    if [ "${ONEPOOL_KEEP_CLUSTER:-0}" != 1 ]; then
        ./target/debug/onepool-devcluster --dir "$ONEPOOL_TEST_CLUSTER_DIR" down
    fi
    ONEPOOL_DEVCLUSTER_DIR=$demo_dir bash scripts/demo.sh
fi

#!/usr/bin/env bash
# Issue #37's first scenario: two onepoold instances (one configuration, the
# [ha] lock on the head's MariaDB over TLS) on the two service hosts of a
# hosts-mode dev cluster of its own, a steady load from the client host,
# and the acting instance's host killed (SIGKILL to every process of its
# network namespace). Measures what the clients lost, how long until the
# other instance acts, replica jobs submitted twice and replicas restarted,
# then brings the dead instance back and checks it follows with no flap
# (bench/src/bin/ha_takeover/, docs/ha.md). Detail lines first, then one
#   ha: failed=N takeover_s=X duplicates=N restarted=N
# and a non-zero exit when a goal is missed. Takes about a minute once the
# cluster is up (its first `up` adds a minute or two).
#
#   bash scripts/ha-test.sh        the host killed (ha: ...)
#   bash scripts/ha-test.sh cut    its link cut instead, then put back (ha-cut: ...)
#
# The cluster lives in target/ha-cluster (ONEPOOL_HA_CLUSTER_DIR) and is
# brought down at the end unless ONEPOOL_KEEP_CLUSTER=1. Needs root (network
# namespaces). The machine's dev clusters share it: run it under
#   flock -o /tmp/onepool-cluster.lock bash scripts/ha-test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --quiet -p onepool-priority-plugin -p onepool-spank-plugin
cargo build --quiet -p onepool-cli -p onepool-elastic-daemon -p onepool-dev-cluster -p onepool-bench --bins
bin=$PWD/target/debug
dir=${ONEPOOL_HA_CLUSTER_DIR:-$PWD/target/ha-cluster}
if [ "${ONEPOOL_KEEP_CLUSTER:-0}" != 1 ]; then
    trap '"$bin/onepool-devcluster" --dir "$dir" down >/dev/null 2>&1 || true' EXIT
fi
"$bin/ha_takeover" "$dir" "$@"

#!/usr/bin/env bash
# The main job: installs what is missing, builds onepool, brings up a real
# 4-node Slurm cluster with 16 (fake) GPUs and onepool's plugins loaded, and
# shows the shared pool at work through onepoold: it scales an inference
# endpoint's replicas (Slurm jobs, each a real llama-server with a small real
# model, made once by scripts/model-server.sh) with the load of a real LLM
# trace as chat completions, a
# protected training job takes a supplemental replica's GPUs (the replica
# drains first; no request is lost), and the replicas expand again after.
# Leaves the cluster running; stop it with
#   ./target/debug/onepool-devcluster --dir .devcluster down
set -euo pipefail
cd "$(dirname "$0")/.."
# ONEPOOL_BIN_DIR: onepool's programs, built already (scripts/test.sh sets
# it to run the demo inside another Slurm release's root).
bin=${ONEPOOL_BIN_DIR:-}
if [ -z "$bin" ]; then
    bash scripts/install-deps.sh
    bash scripts/model-server.sh >/dev/null
    cargo build --workspace --quiet
    bin=./target/debug
fi
dc=$bin/onepool-devcluster
# --hosts (or ONEPOOL_DEMO_HOSTS=1): the cluster's hosts in network
# namespaces of their own (docs/dev-cluster.md), onepoold on the service
# host, the load from the client host; in a folder of its own by default.
hosts=${ONEPOOL_DEMO_HOSTS:-0}
args=()
for a in "$@"; do
    if [ "$a" = --hosts ]; then hosts=1; else args+=("$a"); fi
done
up=()
if [ "$hosts" = 1 ]; then
    dir=${ONEPOOL_DEVCLUSTER_DIR:-$PWD/.devcluster-hosts}
    up=(--hosts)
else
    dir=${ONEPOOL_DEVCLUSTER_DIR:-$PWD/.devcluster}
fi
# The shipped policy, with borrowers reclaimable after 10 s instead of 2
# minutes so the demo does not wait.
mkdir -p "$dir"
sed 's/^min_runtime_before_reclaim = .*/min_runtime_before_reclaim = "10s"/' etc/onepool.toml > "$dir/demo-policy.toml"
"$dc" --dir "$dir" up --policy "$dir/demo-policy.toml" "${up[@]}"
# The scenario itself (onepool-demo --help): onepoold runs as its child with
# a generated config; on any failure or Ctrl-C it stops onepoold and cancels
# the demo's jobs, and exits non-zero.
# Arguments go to onepool-demo (e.g. --victim idle|busy). In the hosts
# mode it runs on the client host: its load crosses the bridge.
demo=("$bin/onepool-demo" --dir "$dir" --trace data/azure-llm-inference-2023-conv.csv "${args[@]}")
if [ "$hosts" = 1 ]; then
    # The demo captures the bridge, which is in this namespace, not the
    # client host's: handed over as an open file.
    exec 9</proc/self/ns/net
    export ONEPOOL_BRIDGE_NETNS=/proc/self/fd/9
    exec ip netns exec "$("$dc" --dir "$dir" netns client)" "${demo[@]}"
fi
exec "${demo[@]}"

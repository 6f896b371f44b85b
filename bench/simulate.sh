#!/usr/bin/env bash
# Benchmark of `onepool simulate` (issue 7): one simulation of DAYS days on
# 1,000 GPUs (125 nodes x 8) with about 10 M requests per 30 days, plus how
# the time grows with trace length. Reported, not gated.
#
#     bash bench/simulate.sh [DAYS...]        # default: 1 3 10 30
#
# Inputs come from onepool-tracegen (simulator/src/generate.rs): the
# one-hour Azure conversation trace (data/, CC-BY 4.0, see data/NOTICE.md)
# tiled hour after hour under a diurnal envelope to 333,333 requests a day,
# and a batch history of one training job about every 3 minutes (1-16
# GPUs, 30 min-12 h). Each size runs twice under /usr/bin/time -v:
#   shared: `--shared-only`, the one shared-pool simulation;
#   full:   `--no-search`: also sizes each separate island by bisection (its
#           own total time is printed by the command: "search: N runs in S s"),
#           but not the shared pool, which the default searches only for the
#           shorter inputs (simulator/README.md), so that every row measures
#           the same work, as in bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
days_list=("${@:-1 3 10 30}")
[ $# -eq 0 ] && days_list=(1 3 10 30)
cargo build --release -q -p onepool-simulator -p onepool-cli
bin=target/release
work=target/bench-simulate
mkdir -p "$work"
cp bench/simulate-policy.toml "$work/policy.toml"
printf '| days | requests | jobs | run | wall s | peak RSS MiB | simulated s (shared run) | search runs | search s |\n'
printf '| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n'
for d in "${days_list[@]}"; do
    reqs=$(( d * 10000000 / 30 ))
    "$bin/onepool-tracegen" trace data/azure-llm-inference-2023-conv.csv "$d" "$reqs" 1 > "$work/trace-$d.csv"
    "$bin/onepool-tracegen" jobs "$d" 180 training 2 > "$work/jobs-$d.csv"
    cat > "$work/scenario-$d.toml" <<TOML
policy = "policy.toml"
[fleet]
nodes = 125
gpus_per_node = 8
[targets]
max_p95_wait = "2h"
[[jobs]]
file = "jobs-$d.csv"
[[endpoints]]
name = "chat"
trace = "trace-$d.csv"
class = "inference"
gpus_per_replica = 8
max_concurrent = 8
prefill_tokens_per_s = 8000
decode_tokens_per_s = 20
startup = "1m"
slo_p99 = "1m"
min_replicas = 6
target_per_replica = 4
baseline_class = "inference-baseline"
baseline_replicas = 2
TOML
    n_req=$(( $(wc -l < "$work/trace-$d.csv") - 1 ))
    n_jobs=$(( $(wc -l < "$work/jobs-$d.csv") - 1 ))
    for mode in shared full; do
        flag=--shared-only
        [ "$mode" = full ] && flag=--no-search
        /usr/bin/time -v "$bin/onepool" simulate "$work/scenario-$d.toml" --json $flag \
            > "$work/out-$d-$mode.json" 2> "$work/time-$d-$mode.txt" \
            || { cat "$work/time-$d-$mode.txt" >&2; exit 1; }
        wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$work/time-$d-$mode.txt" \
            | awk -F: '{ if (NF==3) print $1*3600+$2*60+$3; else print $1*60+$2 }')
        rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2/1024}' "$work/time-$d-$mode.txt")
        read -r run sruns ssec < <(python3 -c "
import json,sys
c=json.load(open('$work/out-$d-$mode.json'))['comparison']
print('%.2f %d %.2f' % (c['shared_run_seconds'], c['search_runs'], c['search_seconds']))")
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$d" "$n_req" "$n_jobs" "$mode" "$wall" "$rss" "$run" "$sruns" "$ssec"
    done
done

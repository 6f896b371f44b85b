#!/usr/bin/env bash
# Which borrower (agents class: GraceTime 0) does Slurm 22.05's preempt/qos pick, and can anything
# steer it? Three borrowers (flexible, 4 GPUs each, started 3 s apart, the
# MIDDLE one given the lowest job priority with scontrol) and one protected
# job fill the 4 nodes; a protected job for 4 GPUs then needs one borrower's
# node. Repeated under SchedulerParameters variants; prints the victim each
# time (oldest / middle+lowest priority / youngest); then the same with
# mixed ranks (agents, agents, training youngest) to see whether the order
# still respects the classes' ranks. Its own cluster in
# target/victim-order-cluster, stopped at the end.
#
#   bash bench/victim-order.sh [ROUNDS]
#   ONEPOOL_SLURM_RELEASE=26.05 bash bench/victim-order.sh [ROUNDS]   (bench/release.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
source bench/release.sh
bench_host bash scripts/install-deps.sh
bench_host cargo build --quiet --workspace
bench_enter_release "$@"
dc=$target/debug/onepool-devcluster
dir=$target/victim-order-cluster
mkdir -p "$dir"
sed 's/^min_runtime_before_reclaim = .*/min_runtime_before_reclaim = "5s"/' etc/onepool.toml > "$dir/policy.toml"
trap '"$dc" --dir "$dir" down >/dev/null 2>&1 || true' EXIT
bench_release_line

state() { squeue -h -j "$1" -o %T 2>/dev/null; }
clear_queue() {
    scancel $(squeue -h -o %i) 2>/dev/null || true
    for _ in $(seq 1 100); do [ -z "$(squeue -h -o %i)" ] && break; sleep 0.2; done
    sleep 2
}
wait_running() { for _ in $(seq 1 300); do [ "$(state "$1")" = RUNNING ] && return 0; sleep 0.2; done; echo "job $1 never ran" >&2; exit 1; }

for variant in "default" "preempt_youngest_first" "preempt_strict_order" "preempt_strict_order,preempt_reorder_count=5"; do
    params="bf_interval=2"
    [ "$variant" != default ] && params="$params,$variant"
    echo "SchedulerParameters=$params" > "$dir/site.conf"
    "$dc" --dir "$dir" down >/dev/null 2>&1 || true
    "$dc" --dir "$dir" up --no-install --policy "$dir/policy.toml" --site-conf "$dir/site.conf" >/dev/null
    eval "$("$dc" --dir "$dir" env)"
    grep -q "SchedulerParameters *= *$params" <<<"$(scontrol show config)" || { echo "SchedulerParameters not applied" >&2; exit 1; }
    for r in $(seq 1 "$rounds"); do
        base=$(sbatch --parsable -o /dev/null --workload=inference-baseline --gpus=4 -N1 --wrap 'sleep 600')
        wait_running "$base"
        b=()
        for i in 1 2 3; do
            j=$(sbatch --parsable -o /dev/null --workload=agents --gpus=4 -N1 --wrap 'sleep 600')
            wait_running "$j"
            b+=("$j")
            sleep 3
        done
        scontrol update JobId="${b[1]}" Priority=1
        prios=$(for j in "${b[@]}"; do printf '%s ' "$(squeue -h -j "$j" -o %Q)"; done)
        sleep 6   # past the minimum run time (5 s)
        owner=$(sbatch --parsable -o /dev/null --workload=critical-training --time=10 --gpus=4 -N1 --wrap 'sleep 600')
        wait_running "$owner"
        victim=none
        for k in 0 1 2; do
            [ "$(state "${b[$k]}")" != RUNNING ] && victim=$k
        done
        case $victim in
            0) what="oldest (first started, lowest job id)" ;;
            1) what="middle (lowest job priority)" ;;
            2) what="youngest (last started)" ;;
            *) what="none" ;;
        esac
        node=$(sacct -n -X -P -j "${b[$victim]:-0}" -o NodeList 2>/dev/null | head -1)
        printf '%-48s round %s: victim %s on %s; borrowers\x27 priorities (oldest first) %s\n' "$variant" "$r" "$what" "$node" "$prios"
        clear_queue
        # Mixed ranks: does the order still put the lowest rank first?
        # Oldest: agents (rank 3); then agents; youngest: training (rank 1).
        base=$(sbatch --parsable -o /dev/null --workload=inference-baseline --gpus=4 -N1 --wrap 'sleep 600')
        wait_running "$base"
        b=()
        for w in agents agents training; do
            j=$(sbatch --parsable -o /dev/null --workload=$w --gpus=4 -N1 --requeue --wrap 'sleep 600')
            wait_running "$j"
            b+=("$j")
            sleep 3
        done
        sleep 6
        owner=$(sbatch --parsable -o /dev/null --workload=critical-training --time=10 --gpus=4 -N1 --wrap 'sleep 600')
        # training (requeue, GraceTime 2m) would make the protected job wait: look at who got the notice.
        for _ in $(seq 1 50); do
            hit=""
            for k in 0 1 2; do
                [ "$(state "${b[$k]}")" != RUNNING ] && hit=$k
            done
            [ -n "$hit" ] && break
            # preempt_time: a number in 22.05, {set, infinite, number} since 23.02.
            pt=$(squeue --json 2>/dev/null | python3 -c '
import json, sys
def n(v):
    return v.get("number", 0) if isinstance(v, dict) and v.get("set") else (v if isinstance(v, int) else 0)
print(" ".join(str(j["job_id"]) for j in json.load(sys.stdin)["jobs"] if n(j.get("preempt_time"))))')
            for k in 0 1 2; do case " $pt " in *" ${b[$k]} "*) hit=$k ;; esac; done
            [ -n "$hit" ] && break
            sleep 0.2
        done
        case $hit in
            0) what="oldest agents (rank 3)" ;;
            1) what="younger agents (rank 3)" ;;
            2) what="youngest, training (rank 1, should yield last)" ;;
            *) what="none within 10 s" ;;
        esac
        printf '%-48s round %s: mixed ranks: victim %s\n' "$variant" "$r" "$what"
        clear_queue
    done
done

#!/usr/bin/env bash
# Admission benchmark: slurmctld's own time per batch submission (sdiag's
# REQUEST_SUBMIT_BATCH_JOB average) and the submission throughput, side by
# side in one run, for: no job_submit plugin; job_submit/onepool; and
# job_submit/lua running bench/classify.lua, which does the same
# classification by hand. N held jobs per variant (default 2000), submitted
# through libslurm from one process as an ordinary user, then cancelled.
# Release builds; its own cluster in target/bench-cluster (target/slurm-RELEASE/ on another release).
#
# Three rounds, variants interleaved; the table shows each variant's median.
#
# The "none" variant submits jobs already in the place the plugins would
# put them (QOS op-inference, partition gpu-flex, 1 day), so every variant
# ends with the same job and the difference is the plugin's own work.
#
#   bash bench/admission.sh [N] [ROUNDS]
#   ONEPOOL_SLURM_RELEASE=26.05 bash bench/admission.sh [N] [ROUNDS]   (bench/release.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2000}
rounds=${2:-3}
source bench/release.sh
source bench/lib.sh
bench_build "$@"
bench_release_line
user=$bench_user

# Cancelled jobs leave slurmctld's table (MaxJobCount) after MinJobAge: keep
# that short, so rounds of thousands of jobs don't fill it.
printf 'MinJobAge=2\n' > "$target/bench-site.conf"
up() {
    "$dc" --dir "$dir" up --job-submit-plugins "$1" --job-submit-lua bench/classify.lua \
        --site-conf "$target/bench-site.conf" >/dev/null 2>&1
}
up onepool
eval "$("$dc" --dir "$dir" env)"
bench_user_account

run_variant() {
    local label=$1 plugins=$2
    shift 2
    up "$plugins"
    # slurmctld (all its threads) on core 1, the client on core 0.
    taskset -a -cp 1 "$(cut -d' ' -f1 "$dir/pids/slurmctld.pid")" >/dev/null
    drain_queue
    sdiag -r >/dev/null
    local flood
    flood=$(taskset -c 0 runuser -u "$user" -- env SLURM_CONF="$SLURM_CONF" "$target/release/submit_flood" "$n" --gpus 1 "$@" \
        SLURM_SPANK_ONEPOOL_WORKLOAD=inference 2>/tmp/onepool-bench-flood.err)
    [ ! -s /tmp/onepool-bench-flood.err ] && : || sed "s/^/  $label: /" /tmp/onepool-bench-flood.err >&2
    local line
    line=$(sdiag | grep -E '^\s*REQUEST_SUBMIT_BATCH_JOB')
    local count ave
    count=$(sed -E 's/.*count:([0-9]+).*/\1/' <<<"$line")
    ave=$(sed -E 's/.*ave_time:([0-9]+).*/\1/' <<<"$line")
    local rate
    rate=$(sed -E 's/.*\(([0-9]+) jobs\/s\).*/\1/' <<<"$flood")
    # The variants must do the same work: check where the last job landed.
    local last qos
    last=$(squeue -h -o %i | sort -n | tail -1)
    qos=$(scontrol -o show job "$last" | tr ' ' '\n' | sed -n 's/^QOS=//p')
    printf '%s %s %s %s %s %s\n' "$label" "$count" "$ave" "$rate" "$(sed -E 's/.*, ([0-9]+) refused.*/\1/' <<<"$flood")" "$qos"
    drain_queue
}

all=$(
    for _ in $(seq "$rounds"); do
        run_variant none "" --qos op-inference --partition gpu-flex --time 1440
        run_variant onepool onepool
        run_variant lua lua
    done
)
printf "%s\n" "$all" | sed "s/^/  round: /" >&2
median() { sort -n | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'; }
results=$(for v in none onepool lua; do
    rows=$(awk -v v="$v" '$1==v' <<<"$all")
    printf '%s %s %s %s %s %s\n' "$v" "$(awk '{print $2}' <<<"$rows" | median)" "$(awk '{print $3}' <<<"$rows" | median)" \
        "$(awk '{print $4}' <<<"$rows" | median)" "$(awk '{s+=$5} END{print s}' <<<"$rows")" "$(awk '{print $6}' <<<"$rows" | sort -u | tr '\n' ' ')"
done)
base=$(awk '$1=="none"{print $3}' <<<"$results")
base_rate=$(awk '$1=="none"{print $4}' <<<"$results")
echo "admission benchmark: $n held 1-GPU jobs per variant and round, $rounds rounds (medians), one libslurm client on core 0, slurmctld on core 1"
printf '%-10s %8s %22s %10s %10s %10s  %s\n' variant rpcs "slurmctld µs/submit" "vs none" "jobs/s" "vs none" "QOS given"
while read -r label count ave rate refused qos; do
    printf '%-10s %8s %22s %10s %10s %10s  %s\n' "$label" "$count" "$ave" \
        "$(awk -v a="$ave" -v b="$base" 'BEGIN{printf "%+.1f%%", (a-b)*100/b}')" "$rate" \
        "$(awk -v a="$rate" -v b="$base_rate" 'BEGIN{printf "%.2fx", a/b}')" "$qos"
    [ "$refused" = 0 ] || echo "  ($label refused $refused submissions)"
done <<<"$results"
"$dc" --dir "$dir" down >/dev/null 2>&1

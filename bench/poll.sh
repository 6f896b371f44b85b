#!/usr/bin/env bash
# What one onepoold replica controller's poll costs as the cluster's job
# table grows: `squeue --json` (every job slurmctld holds; 22.05 ignores
# -u/-j/-t with --json) against `squeue -u UID -O` (the daemon's own jobs),
# side by side in one run. For each size, N held 1-GPU jobs of another user
# are submitted (through libslurm, bench/src/bin/submit_flood.rs) beside 3
# replica-like jobs of the daemon's user; poll_cost times each read, and
# sdiag gives slurmctld's RPCs and its own time for them.
# Release builds; its own cluster in target/bench-cluster (target/slurm-RELEASE/ on another release).
#
#   bash bench/poll.sh [SIZES] [ROUNDS]      # default "0 1000 5000" 20
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=${1:-"0 1000 5000"}
rounds=${2:-20}
source bench/release.sh
source bench/lib.sh
bench_build "$@"
bench_release_line
user=$bench_user
# Room for the largest size; cancelled jobs leave the table quickly.
printf 'MinJobAge=2\nMaxJobCount=50000\n' > "$target/bench-poll-site.conf"
"$dc" --dir "$dir" up --site-conf "$target/bench-poll-site.conf" >/dev/null
eval "$("$dc" --dir "$dir" env)"
bench_user_account
# slurmctld's RPCs since the last `sdiag -r`: "NAME count ave_µs" for
# the job-reading ones.
rpcs() {
    sdiag | awk '$1 ~ /^REQUEST_JOB/ && /count:/ {c=a=""; for(i=1;i<=NF;i++){if($i ~ /^count:/){c=substr($i,7)} if($i ~ /^ave_time:/){a=substr($i,10)}} printf "%s:%s×%sµs ", $1, c, a}'
}
uid=$(id -u)
echo "poll cost: one controller's read of Slurm per poll, $rounds polls per way, medians; $(nproc) cores"
echo "(slurmctld: the job-reading RPCs each way caused, count × sdiag's average µs)"
printf '%8s %-5s %9s %9s %10s %7s %4s  %s\n' "jobs" way "ms/poll" "p90 ms" "bytes" listed own "slurmctld"
for n in $sizes; do
    drain_queue
    if [ "$n" -gt 0 ]; then
        runuser -u "$user" -- env SLURM_CONF="$SLURM_CONF" "$target/release/submit_flood" "$n" --gpus 1 \
            SLURM_SPANK_ONEPOOL_WORKLOAD=training >/dev/null
    fi
    for k in 1 2 3; do
        sbatch --hold -o /dev/null -J "onepool-llm-1850$k" --workload=inference --endpoint=llm --gpus=1 --wrap true >/dev/null
    done
    declare -A med=()
    for way in json user; do
        sdiag -r >/dev/null
        out=$("$target/release/poll_cost" "$rounds" "$uid" "$way")
        read -r _ m p90 bytes listed own <<<"$(head -1 <<<"$out")"
        med[$way]=$m
        printf '%8s %-5s %9s %9s %10s %7s %4s  %s\n' "$((n + 3))" "$way" "$m" "$p90" "$bytes" "$listed" "$own" "$(rpcs)"
        sed -n 's/^records /               the first poll also reads the 3 own jobs'"'"' records once: ms /p' <<<"$out"
    done
    awk -v n=$((n + 3)) -v j="${med[json]}" -v u="${med[user]}" 'BEGIN{printf "%8s json/user %.1fx\n", n, j/u}'
done
drain_queue
"$dc" --dir "$dir" down >/dev/null 2>&1

#!/usr/bin/env bash
# Validates the simulator's Slurm model (simulator/src/slurm.rs) against the
# real dev cluster (issue 7), on a 4-node x 4-GPU cluster of its own
# (target/validate-cluster), with the policy bench/validate/policy.toml.
#
# Batch part: the scenario bench/validate/jobs.csv is run for real and
# through `onepool simulate --job-log` (bench/validate/scenario.toml), and
# the two are set side by side: every run of every job (start and end,
# seconds after the first submission; a requeued job runs twice), the
# protected jobs' time to capacity, and the reclaim timing of the victims
# that get a notice (notice, release, restart). About 9 minutes.
#
# Inference part: onepoold runs one endpoint whose replicas are Slurm jobs
# (the stand-in model server), bench/validate/load.py replays
# bench/validate/chat-trace.csv against it, and the same trace goes through
# the simulator (bench/validate/inference.toml): the replica jobs (class,
# start, end), each replica's time from its GPUs to ready, and the requests'
# queueing delay (p50/p90/p99/max) side by side. About 5 minutes.
#
#     bash bench/validate-simulator.sh [all|batch|inference]   # as root, Debian 12
#
# The side-by-side reports are onepool-validate's (simulator/src/validate),
# from what each part leaves in target/validate-cluster/validate.
#
# Each jobs.csv row becomes, SUBMIT seconds after the first one, in file order,
#     sbatch --workload=CLASS --gpus-per-node=G -N1 bench/validate/job.sh DURATION ...
# (protected classes with --time=10:00, as root: entitled). job.sh sleeps its
# duration; for a class reclaimed with a notice (graceful or requeue in the
# policy) it is also given --signal=B:USR1@1 (and --requeue), and on the
# notice takes the scenario's [victims] release_after for that class, then
# exits (graceful) or requeues itself (requeue), keeping the work it had
# done. The scenario says cancelled = "drop": on the cluster nobody
# resubmits a cancelled job.
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:-all}
case $part in all|batch|inference) ;; *) echo "usage: $0 [all|batch|inference]" >&2; exit 2 ;; esac
cargo build --workspace --quiet
dc=./target/debug/onepool-devcluster
# The reports: the cluster's run beside the simulator's (simulator/src/validate).
validate=./target/debug/onepool-validate
dir=$PWD/target/validate-cluster
out=$dir/validate
job=$PWD/bench/validate/job.sh
rm -rf "$out"
mkdir -p "$out"
"$dc" --dir "$dir" down >/dev/null 2>&1 || true
"$dc" --dir "$dir" up --policy bench/validate/policy.toml
onepoold_pid=
cleanup() {
    if [ -n "$onepoold_pid" ]; then kill "$onepoold_pid" 2>/dev/null || true; fi
    "$dc" --dir "$dir" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
eval "$("$dc" --dir "$dir" env)"

batch() {

# Per class: reclaim mode (policy) and seconds from notice to release (scenario).
"$validate" classes bench/validate/scenario.toml > "$out/classes"

# --- the real run ---------------------------------------------------------
: > "$out/ids"
t0=
i=0
while IFS=, read -r submit duration gpus per_node class account; do
    case $submit in '#'*|submit|'') continue ;; esac
    read -r _ mode notice < <(grep "^$class " "$out/classes") || { echo "class $class: not in the policy" >&2; exit 1; }
    extra=()
    args=("$duration" "$out/state-$i" "$out/events-$i.log")
    case $class in critical-training|inference-baseline) extra=(--time=10:00) ;; esac
    case $mode in
        graceful|requeue)
            if [ "$notice" = - ]; then
                echo "class $class is reclaimed with a notice: give [victims.class.$class] release_after in the scenario" >&2
                exit 1
            fi
            extra+=(--signal=B:USR1@1)
            if [ "$mode" = requeue ]; then extra+=(--requeue); args+=("$notice" requeue); else args+=("$notice" exit); fi ;;
    esac
    if [ -z "$t0" ]; then t0=$(date +%s.%N); fi
    while [ "$(echo "$(date +%s.%N) < $t0 + $submit" | bc)" = 1 ]; do sleep 0.05; done
    id=$(sbatch --parsable --workload="$class" --gpus-per-node="$per_node" -N1 -J "v$i" \
        -o "$out/job-$i.out" --open-mode=append "${extra[@]}" "$job" "${args[@]}")
    echo "$i $id $class" >> "$out/ids"
    i=$((i + 1))
done < bench/validate/jobs.csv
echo "submitted $i jobs; waiting for them to finish"
deadline=$(( $(date +%s) + 600 ))
while [ -n "$(squeue -h -o %i)" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 1; done
if [ -n "$(squeue -h -o %i)" ]; then
    echo "still queued after 600 s (listed, then cancelled):"
    squeue -o "%.6i %.6j %.22q %.8T %r"
    scancel $(squeue -h -o %i)
    sleep 2
fi
sleep 2   # let slurmdbd catch up
SLURM_TIME_FORMAT=%s sacct -P -n -X -D --format=JobID,JobName,QOS,Submit,Eligible,Start,End,State,NodeList \
    -j "$(cut -d' ' -f2 "$out/ids" | paste -sd,)" > "$out/sacct.txt"

# --- the simulated run -------------------------------------------------------
./target/debug/onepool simulate bench/validate/scenario.toml --shared-only --job-log \
    > "$out/simulate.txt" 2> "$out/job-log.tsv"

# --- side by side --------------------------------------------------------------
"$validate" batch "$out" bench/validate/scenario.toml bench/validate/jobs.csv
echo
echo "raw: $out/sacct.txt (sacct -P -D, epoch seconds), $out/job-log.tsv (onepool simulate --job-log), $out/events-*.log (job.sh)"
}

inference() {
# onepoold's config from the scenario's endpoint (onepool-devcluster
# onepoold-config, dev-cluster/src/onepoold.rs); the stand-in server's
# model load (3 s) and onepoold's health checks (every 0.5 s, ready after
# one) are what the scenario's startup (4 s) stands for.
load_s=3
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$dc" onepoold-config bench/validate/inference.toml --listen "127.0.0.1:$port" --model-load-seconds "$load_s" \
    --server "$PWD/etc/dev-cluster/stand-in-model-server.py" --launcher "$PWD/target/debug/onepool" --out "$out" \
    > "$out/onepoold.toml"
started=$(date +%s)
ONEPOOLD_LOG=info NO_COLOR=1 ./target/debug/onepoold --config "$out/onepoold.toml" > "$out/onepoold.log" 2>&1 &
onepoold_pid=$!
echo "onepoold (pid $onepoold_pid) on 127.0.0.1:$port; waiting for the baseline replica to be ready"
for _ in $(seq 120); do
    grep -q 'replica health changed.*to=Ready' "$out/onepoold.log" && break
    kill -0 "$onepoold_pid" 2>/dev/null || { echo "onepoold exited:"; cat "$out/onepoold.log"; exit 1; }
    sleep 0.5
done
grep -q 'replica health changed.*to=Ready' "$out/onepoold.log" || { echo "no replica ready after 60 s:"; cat "$out/onepoold.log"; exit 1; }
python3 bench/validate/load.py "http://127.0.0.1:$port/v1/completions" bench/validate/chat-trace.csv "$out/requests.tsv"
# Let the scale-down happen (scale_down_delay, then the drain) before stopping.
for _ in $(seq 90); do
    [ "$(squeue -h -o %j | grep -c '^onepool-chat')" -le 1 ] && break
    sleep 1
done
kill "$onepoold_pid"; wait "$onepoold_pid" 2>/dev/null || true
onepoold_pid=
date +%s > "$out/stopped"
ids=$(squeue -h -o '%i %j' | awk '$2 ~ /^onepool-chat/ {print $1}')
[ -z "$ids" ] || scancel $ids
sleep 3
SLURM_TIME_FORMAT=%s sacct -P -n -X -D -S "$(date -d "@$started" +%Y-%m-%dT%H:%M:%S)" --format=JobID,JobName,QOS,Submit,Start,End,State,NodeList \
    | awk -F'|' '$2 ~ /^onepool-chat/' > "$out/replicas-sacct.txt"
./target/debug/onepool simulate bench/validate/inference.toml --shared-only --job-log --json \
    > "$out/inference.json" 2> "$out/inference-job-log.tsv"
"$validate" inference "$out" bench/validate/inference.toml
echo
echo "raw: $out/requests.tsv (load.py), $out/onepoold.log, $out/replicas-sacct.txt, $out/inference-job-log.tsv, $out/inference.json"
}

case $part in
    all) batch; inference ;;
    batch) batch ;;
    inference) inference ;;
esac

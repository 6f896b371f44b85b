#!/usr/bin/env bash
# The main job: installs what is missing, builds onepool, brings up a real
# 4-node Slurm cluster with 16 (fake) GPUs and onepool's plugins loaded, and
# shows the shared pool at work. Leaves the cluster running; stop it with
#   ./target/debug/onepool-devcluster --dir .devcluster down
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --workspace --quiet
dc=./target/debug/onepool-devcluster
dir=${ONEPOOL_DEVCLUSTER_DIR:-$PWD/.devcluster}
# The shipped policy, with borrowers reclaimable after 10 s instead of 2
# minutes so the demo does not wait.
mkdir -p "$dir"
sed 's/^min_runtime_before_reclaim = .*/min_runtime_before_reclaim = "10s"/' etc/onepool.toml > "$dir/demo-policy.toml"
"$dc" --dir "$dir" up --policy "$dir/demo-policy.toml"
eval "$("$dc" --dir "$dir" env)"
export PATH="$PWD/target/debug:$PATH"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
step "The pool: 4 nodes x 4 GPUs; flexible work runs in gpu-flex, capped below the 4 reserved GPUs"
sinfo -o "%P %D %t %G"
echo
onepool policy check "$dir/etc/onepool.toml"

step "Inside a job: the annotation and the GPUs it got"
srun --workload=inference --gpus=1 bash -c 'echo "ONEPOOL_WORKLOAD=$ONEPOOL_WORKLOAD CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES on $SLURMD_NODENAME"'

step "Supplemental inference fills every GPU flexible work may hold: 3 replicas x 4 GPUs, each run by 'onepool replica'"
server=$dir/stand-in-model-server.py
cp etc/dev-cluster/stand-in-model-server.py "$server"
ports=()
for i in 1 2 3; do
    port=$((19000 + 10 * i))
    ports+=("$port")
    sbatch --workload=inference --endpoint=llm --gpus=4 -N1 -J "replica-$i" --signal=B:USR1@60 -o "$dir/log/replica-$i.out" \
        --wrap "exec $PWD/target/debug/onepool replica --listen 127.0.0.1:$port --backend 127.0.0.1:$((port + 1)) --drain-timeout 30s -- python3 $server" >/dev/null
done
sbatch --workload=inference-baseline --gpus=4 -N1 -J baseline -o /dev/null --wrap 'sleep 300' >/dev/null
for port in "${ports[@]}"; do
    until curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1; do sleep 0.2; done
done
squeue -o "%.6i %.10j %.22q %.9P %.8T %N"
scontrol -o show job "$(squeue -h -n replica-1 -o %i)" | tr ' ' '\n' | grep -E '^AdminComment='

step "Requests in flight on every replica (3 s each); then critical training arrives (4 GPUs)"
sleep 10   # past the policy's minimum run time (10 s here) every replica may be reclaimed
results=$dir/demo-requests
rm -f "$results"
for port in "${ports[@]}"; do
    (curl -s -o /dev/null -w '%{http_code}\n' "http://127.0.0.1:$port/?sleep=3" >> "$results") &
done
sleep 0.3
t0=$(date +%s.%N)
job=$(sbatch --parsable --workload=critical-training --time=1:00:00 --gpus=4 -N1 -J training -o /dev/null --wrap 'sleep 30')
until [ "$(squeue -h -j "$job" -o %T)" = RUNNING ]; do sleep 0.1; done
t1=$(date +%s.%N)
wait
printf 'training job %s RUNNING %.1f s after submission: Slurm sent the notice, the victim drained and exited\n' "$job" "$(echo "$t1 - $t0" | bc)"
printf 'requests in flight: sent %s, served %s, failed %s\n' "$(wc -l < "$results")" "$(grep -c '^200$' "$results")" "$(grep -vc '^200$' "$results")"
squeue -o "%.6i %.10j %.22q %.9P %.8T %N"
grep -h "onepool replica:" "$dir"/log/replica-*.out || true

step "Cleaning up the demo's jobs (the cluster keeps running)"
scancel --quiet $(squeue -h -o %i) 2>/dev/null || true
echo "cluster: $dir   (eval \"\$($dc --dir $dir env)\" to use it; '$dc --dir $dir down' to stop it)"

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

step "Agents fill every GPU flexible work may hold (3 jobs x 4 GPUs); baseline serving holds the reserved 4"
for i in 1 2 3; do
    sbatch --workload=agents --gpus=4 -N1 -J "agents-$i" -o /dev/null --wrap 'sleep 300' >/dev/null
done
sbatch --workload=inference-baseline --gpus=4 -N1 -J baseline -o /dev/null --wrap 'sleep 300' >/dev/null
sleep 2
squeue -o "%.6i %.10j %.22q %.9P %.8T %N"
scontrol -o show job "$(squeue -h -n agents-1 -o %i)" | tr ' ' '\n' | grep -E '^AdminComment='

step "Critical training arrives (--workload=critical-training, 4 GPUs); borrowers are exempt for their first 10 s"
t0=$(date +%s.%N)
job=$(sbatch --parsable --workload=critical-training --time=1:00:00 --gpus=4 -N1 -J training -o /dev/null --wrap 'sleep 30')
until [ "$(squeue -h -j "$job" -o %T)" = RUNNING ]; do sleep 0.2; done
t1=$(date +%s.%N)
printf 'training job %s RUNNING %.1f s after submission: Slurm preempted one borrower through its QOS\n' "$job" "$(echo "$t1 - $t0" | bc)"
squeue -o "%.6i %.10j %.22q %.9P %.8T %N"
sacct -X -n -o JobID,JobName,QOS,State -j "$(sacct -X -n -P -o JobID,State | awk -F'|' '$2=="PREEMPTED"{print $1}' | tail -1)" 2>/dev/null || true

step "Cleaning up the demo's jobs (the cluster keeps running)"
scancel --quiet $(squeue -h -o %i) 2>/dev/null || true
echo "cluster: $dir   (eval \"\$($dc --dir $dir env)\" to use it; '$dc --dir $dir down' to stop it)"

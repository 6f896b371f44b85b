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
"$dc" --dir "$dir" up
eval "$("$dc" --dir "$dir" env)"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
step "The pool: 4 nodes x 4 GPUs, one partition"
sinfo -N -o "%N %P %t %G"

step "Inside a job: the annotation and the GPUs it got"
srun --workload=inference --gpus=1 bash -c 'echo "ONEPOOL_WORKLOAD=$ONEPOOL_WORKLOAD CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES on $SLURMD_NODENAME"'

step "Opportunistic work fills every GPU (4 jobs x 4 GPUs, --workload=agents)"
for i in 1 2 3 4; do
    sbatch -q opportunistic --workload=agents --gpus=4 -N1 -J "agents-$i" -o /dev/null --wrap 'sleep 300' >/dev/null
done
sleep 2
squeue -o "%.6i %.10j %.14q %.8T %N"

step "Guaranteed training arrives (--workload=training, 4 GPUs)"
t0=$(date +%s.%N)
job=$(sbatch --parsable -q guaranteed --workload=training --gpus=4 -N1 -J training -o /dev/null --wrap 'sleep 30')
until [ "$(squeue -h -j "$job" -o %T)" = RUNNING ]; do sleep 0.1; done
t1=$(date +%s.%N)
printf 'training job %s RUNNING %.1f s after submission: Slurm preempted one borrower\n' "$job" "$(echo "$t1 - $t0" | bc)"
squeue -o "%.6i %.10j %.14q %.8T %N"

step "Cleaning up the demo's jobs (the cluster keeps running)"
scancel --quiet $(squeue -h -o %i) 2>/dev/null || true
echo "cluster: $dir   (eval \"\$($dc --dir $dir env)\" to use it; '$dc --dir $dir down' to stop it)"

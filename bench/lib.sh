# Shared by the benchmarks that flood a cluster of their own with jobs
# (admission.sh, poll.sh); sourced, not run.

# Release builds of the plugins, the dev cluster and the flood tools; the
# cluster's launcher ($dc) and folder ($dir); and the ordinary user that
# submits the flood ($bench_user, op-bench, in account research once the
# cluster is up: bench_user_account).
# On another Slurm release (bench/release.sh, sourced first), the script
# continues inside that release's root from here.
bench_build() {
    bench_host bash scripts/install-deps.sh
    bench_host cargo build --release --quiet -p onepool-priority-plugin -p onepool-spank-plugin
    bench_host cargo build --release --quiet -p onepool-dev-cluster -p onepool-tests -p onepool-bench --bins
    bench_enter_release "$@"
    dc=$target/release/onepool-devcluster
    dir=$target/bench-cluster
    bench_user=op-bench
    id -u "$bench_user" >/dev/null 2>&1 || useradd --no-create-home --shell /bin/sh "$bench_user"
}

bench_user_account() {
    grep -qx research <<<"$(sacctmgr -n -P show account format=account)" ||
        sacctmgr -i add account research Description=bench Organization=bench >/dev/null
    grep -qx "research|$bench_user" <<<"$(sacctmgr -n -P show assoc format=account,user)" ||
        sacctmgr -i add user "$bench_user" Account=research >/dev/null
}

# Cancels every job and waits until slurmctld's table is empty (MinJobAge
# short in the site config, so that it does not take minutes).
drain_queue() {
    scancel --quiet $(squeue -h -o %i) 2>/dev/null || true
    for _ in $(seq 600); do
        [ -z "$(squeue -h -t all -o %i)" ] && return 0
        sleep 0.2
    done
    echo "jobs did not leave slurmctld's table" >&2
    return 1
}

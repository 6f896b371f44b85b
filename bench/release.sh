# Which Slurm release a cluster benchmark runs on; sourced by bench scripts
# right after `cd` to the work tree, not run.
#
#   ONEPOOL_SLURM_RELEASE=26.05 bash bench/reclaim.sh 3
#
# 22.05 (the default) is the host's Slurm. 24.11 and 26.05 work as in
# scripts/test.sh: the script's builds run on the host against the release
# root's headers into target/slurm-RELEASE, then `bench_enter_release`
# starts the script again inside the root (scripts/in-release.sh), where the
# builds are skipped and everything else runs with that release's daemons
# and commands.
#
# After sourcing: $release, and $target, the cargo output folder to take
# binaries from and to put the benchmark's cluster in.

release=${ONEPOOL_SLURM_RELEASE:-22.05}
case $release in
    22.05) target=target ;;
    24.11 | 26.05) target=target/slurm-$release ;;
    *) echo "unknown Slurm release $release (22.05, 24.11 or 26.05)" >&2; exit 2 ;;
esac
target=$PWD/$target
if [ "$release" != 22.05 ] && [ -z "${ONEPOOL_IN_RELEASE_ROOT:-}" ]; then
    release_root=$(bash scripts/release-root.sh "$release" | tail -n 1)
    export SLURM_INCLUDE_DIR=$release_root/usr/include CARGO_TARGET_DIR=$target
fi

# `bench_host CMD...`: a build step (cargo, install-deps), run on the host only.
bench_host() {
    [ -n "${ONEPOOL_IN_RELEASE_ROOT:-}" ] || "$@"
}

# Starts this script again inside the release's root, once the builds are
# done; returns at once for the host's release and inside the root.
bench_enter_release() {
    [ "$release" != 22.05 ] && [ -z "${ONEPOOL_IN_RELEASE_ROOT:-}" ] || return 0
    exec env ONEPOOL_IN_RELEASE_ROOT=1 bash scripts/in-release.sh "$release_root" bash "$0" "$@"
}

# The header line of a benchmark's output: which Slurm it measured.
bench_release_line() {
    # From the package: `sinfo -V` of 26.05 wants a cluster configuration.
    echo "Slurm $(dpkg-query -W -f '${Version}' slurm-client 2>/dev/null || echo "$release")"
}

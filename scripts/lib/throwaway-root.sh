# shellcheck shell=bash
# Sourced by scripts/package-test.sh, deploy-test.sh and upgrade-test.sh: a
# throwaway copy of a system to install packages into. An overlay whose
# upper layer is on a tmpfs, over a read-only lower layer (a release root of
# scripts/release-root.sh, or the host's /), mounted in the caller's private
# mount namespace (`unshare --mount --propagation private`), so that it
# vanishes with the caller and the lower layer is never changed. Entered
# with scripts/in-release.sh like the release roots.

# throwaway_root LOWER WORK: mounts the copy at WORK/root and sets $root.
throwaway_root() {
    local lower=$1 work=$2
    mkdir -p "$work"
    mount -t tmpfs -o size=2g onepool-throwaway "$work"
    mkdir -p "$work"/{upper,work,root}
    mount -t overlay overlay -o "lowerdir=$lower,upperdir=$work/upper,workdir=$work/work" "$work/root"
    root=$work/root
    # in-release.sh's mark of a finished root (the host's / has none).
    [ -f "$root/.onepool-root-stamp" ] || echo "throwaway overlay of $lower" >"$root/.onepool-root-stamp"
}

# Kills whatever still runs inside $root (what a cluster left behind).
kill_in_root() {
    local p r
    for p in /proc/[0-9]*; do
        r=$(readlink "$p/root" 2>/dev/null) || continue
        if [ "$r" = "$root" ]; then kill -9 "${p#/proc/}" 2>/dev/null || true; fi
    done
}

# The cached roots and the host already have a user `onepool` (the tests and
# the demo make it): removed in the copy, so that the package's postinst
# must make it.
forget_onepool_user() {
    # shellcheck disable=SC2016 # expanded inside the root
    bash "${here:?}/scripts/in-release.sh" "$root" sh -c 'if getent passwd onepool >/dev/null; then userdel onepool; fi; if getent group onepool >/dev/null; then groupdel onepool; fi'
    # Nor its state folder: a replica key left there by a run as root on
    # the host would be root's, and onepoold refuses a key it does not own.
    bash "${here:?}/scripts/in-release.sh" "$root" rm -rf /var/lib/onepool
}

# The onepool-devcluster to run: $ONEPOOL_DEVCLUSTER, else the newer of
# cargo's release and debug builds (it does not depend on Slurm's headers;
# an older build may lack an option the tests use).
find_devcluster() {
    if [ -n "${ONEPOOL_DEVCLUSTER:-}" ]; then
        echo "$ONEPOOL_DEVCLUSTER"
        return
    fi
    local d
    d=$(ls -t target/release/onepool-devcluster target/debug/onepool-devcluster 2>/dev/null | head -n 1 || true)
    [ -n "$d" ] || { echo "no onepool-devcluster (cargo build -p onepool-dev-cluster)" >&2; return 1; }
    echo "${here:?}/$d"
}

#!/usr/bin/env bash
# in-release.sh ROOT COMMAND [ARG...]
#
# Runs COMMAND inside a release root made by scripts/release-root.sh, in the
# caller's folder, with this work tree at the same path as on the host (the
# caller's folder must be in it), so that paths compiled into
# the test binaries (the workspace, cargo's target folder) and written into
# the dev cluster's configs hold inside the root too. The binaries are built
# on the host (glibc 2.36) against the root's Slurm headers; they run on the
# root's newer glibc.
#
# Mechanism: chroot inside `unshare --mount --propagation private`, as
# release-root.sh installs packages: proc, /dev, /dev/pts, /dev/shm and /sys
# are mounted in a private mount namespace, which vanishes with the command
# (even on SIGKILL), so nothing stays mounted on the host or under the cache
# folder. The network namespace is the host's: the dev cluster listens on
# loopback only. The root's own /tmp is used (the tests' scratch files and
# the munge socket live in the work tree or the cluster folder).
#
# The command runs as root with a clean environment: PATH, HOME, LANG, TERM,
# CI, and every ONEPOOL_* and RUST_* variable of the caller.
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: in-release.sh ROOT COMMAND [ARG...]" >&2; exit 2; }
root=$(cd "$1" && pwd)
shift
[ "$(id -u)" = 0 ] || { echo "in-release: needs root (chroot, mount)" >&2; exit 1; }
[ -f "$root/.onepool-root-stamp" ] || { echo "in-release: $root is no finished release root (run scripts/release-root.sh)" >&2; exit 1; }
tree=$(cd "$(dirname "$0")/.." && pwd)
cwd=$PWD
case $cwd/ in "$tree"/*) ;; *) echo "in-release: run it from inside $tree" >&2; exit 2 ;; esac

env_args=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}")
[ -n "${CI:-}" ] && env_args+=(CI="$CI")
while IFS='=' read -r k v; do
    case $k in ONEPOOL_* | RUST_*) env_args+=("$k=$v") ;; esac
done < <(env)

# shellcheck disable=SC2016 # expanded by the inner shell
inner='
    set -eu
    root=$1 tree=$2 models=$3; shift 3
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount --rbind /sys "$root/sys"
    # The host'"'"'s name must resolve inside too (slurmctld 24.11 looks it up).
    mount --bind /etc/hosts "$root/etc/hosts"
    mkdir -p "$root/$tree"
    mount --bind "$tree" "$root/$tree"
    # The model server and model (scripts/model-server.sh), where the host
    # has them.
    if [ -n "$models" ] && [ -d "$models" ]; then
        mkdir -p "$root/$models"
        mount --bind "$models" "$root/$models"
        # Read-only: nothing run as root inside may change the host'"'"'s copy.
        mount -o remount,bind,ro "$root/$models"
    fi
    cd "$tree"
    exec chroot "$root" /usr/bin/env -i "$@"
'
models=${ONEPOOL_MODEL_SERVER_DIR:-/var/cache/onepool/model-server}
exec unshare --mount --propagation private bash -c "$inner" inner "$root" "$tree" "$models" \
    "${env_args[@]}" bash -c 'cd "$0" && exec "$@"' "$cwd" "$@"

#!/usr/bin/env bash
# release-root.sh RELEASE [--rebuild]
#
# Creates, or reuses, a Debian root file system that carries one Slurm
# release's packages, so onepool can be built against that release's headers
# and its plugins checked against that release's binaries (issue #14).
#
#   22.05  the host itself (Debian 12): nothing to build, prints /
#   24.11  Debian 13 "trixie"
#   26.05  Debian unstable "sid"
#
# The root lives in $ONEPOOL_ROOTS_DIR/<suite> (default
# /var/cache/onepool/roots/<suite>) and is made with
#   debootstrap --variant=minbase SUITE DIR MIRROR
# then, inside it,
#   apt-get install --no-install-recommends <etc/release-roots/packages.txt>
# MIRROR is the `URIs:` line of the host's /etc/apt/sources.list.d/*.sources
# that serves Debian itself (not -security); ONEPOOL_DEBIAN_MIRROR overrides.
#
# Reuse and staleness: a finished root carries .onepool-root-stamp with the
# recipe's digest (suite, mirror, package list, RECIPE_VERSION below) and its
# creation time. The root is rebuilt when the digest differs, when it is older
# than ONEPOOL_ROOT_MAX_AGE_DAYS (default 7), when the stamp is missing (an
# interrupted build), or with --rebuild. A rebuild happens in a fresh folder
# next to the old root and replaces it only once it is complete, so an
# interrupted run never leaves a half-made root under the final name (an
# unfinished build is deleted on exit, INT and TERM; what a SIGKILL leaves is
# deleted by the next run, which holds the lock). If a
# rebuild that is due only to age fails (no network, say), the old root is
# kept and used, with a warning. Concurrent runs for one suite are serialised
# with flock. Safe to re-run at any time.
#
# How apt runs inside the root, and why: a plain chroot with proc mounted and
# /dev and /sys bind-mounted, as the Debian maintainer scripts of mariadb-server
# and munge expect. systemd-nspawn is not assumed (it is not installed on
# these machines and needs systemd as the host's init). When `unshare --mount`
# works (util-linux, checked at run time) the mounts are made inside a private
# mount namespace: they are invisible to the host and vanish with the
# namespace even if this script is killed with SIGKILL, so nothing can stay
# mounted under the cache folder. Without unshare the same mounts are made in
# the host's namespace and an EXIT trap unmounts them (lazily if busy). Before
# any folder is deleted, this script checks /proc/self/mountinfo and refuses
# to delete a tree that still has anything mounted in it (`rm` would
# otherwise descend into a bound /dev). Services are kept from starting inside
# the root by a policy-rc.d that answers 101.
#
# Needs root. Prints the root's path as the last line on stdout; messages go
# to stderr.
set -euo pipefail

# Bump when the way a root is made changes, to force a rebuild everywhere.
RECIPE_VERSION=1

here=$(cd "$(dirname "$0")/.." && pwd)
packages_file="$here/etc/release-roots/packages.txt"
# Python packages (PyPI), installed with the root's own python3 and pip.
requirements_file="$here/etc/python-requirements.txt"
roots_dir=${ONEPOOL_ROOTS_DIR:-/var/cache/onepool/roots}
max_age_days=${ONEPOOL_ROOT_MAX_AGE_DAYS:-7}

say() { echo "release-root: $*" >&2; }
die() { say "error: $*"; exit 1; }

usage() {
    echo "usage: $0 RELEASE [--rebuild]   (RELEASE: 22.05 | 24.11 | 26.05)" >&2
    exit 2
}

release=${1:-}
rebuild=0
[ $# -ge 1 ] || usage
shift
for a in "$@"; do
    case $a in
        --rebuild) rebuild=1 ;;
        *) usage ;;
    esac
done

case $release in
    22.05)
        say "Slurm 22.05 is the host's own release (Debian 12): no root to make"
        echo /
        exit 0
        ;;
    24.11) suite=trixie ;;
    26.05) suite=sid ;;
    *) usage ;;
esac

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot and mount do)"
[ -f "$packages_file" ] || die "missing package list $packages_file"
case $max_age_days in '' | *[!0-9]*) die "ONEPOOL_ROOT_MAX_AGE_DAYS must be a whole number of days" ;; esac

mapfile -t packages < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$packages_file")
[ ${#packages[@]} -gt 0 ] || die "no packages listed in $packages_file"

find_mirror() {
    if [ -n "${ONEPOOL_DEBIAN_MIRROR:-}" ]; then
        echo "$ONEPOOL_DEBIAN_MIRROR"
        return
    fi
    local f uri
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # The first URIs: line whose suites are not the security ones.
        uri=$(awk '
            /^[[:space:]]*$/ { if (u != "" && !sec) { print u; exit } u = ""; sec = 0; next }
            /^URIs:/ { u = $2 }
            /^Suites:/ { if ($0 ~ /-security/) sec = 1 }
            END { if (u != "" && !sec) print u }' "$f" | head -n1)
        if [ -n "$uri" ]; then
            echo "$uri"
            return
        fi
    done
    if [ -f /etc/apt/sources.list ]; then
        uri=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' /etc/apt/sources.list)
        [ -n "$uri" ] && { echo "$uri"; return; }
    fi
    echo http://deb.debian.org/debian
}
mirror=$(find_mirror)

recipe_digest=$( (printf '%s\n' "recipe=$RECIPE_VERSION" "suite=$suite" "mirror=$mirror" "${packages[@]}"; cat "$requirements_file") | sha256sum | cut -d' ' -f1)
root="$roots_dir/$suite"
stamp_name=.onepool-root-stamp

mkdir -p "$roots_dir"
exec 9>"$roots_dir/.$suite.lock"
if ! flock -n 9; then
    say "another run is making the $suite root; waiting for it"
    flock 9
fi

# Mount points at or under $1, deepest first (fields 5 of mountinfo).
mounts_under() {
    local dir
    dir=$(realpath -m "$1")
    awk -v d="$dir" '{ m = $5; gsub(/\\040/, " ", m); if (m == d || index(m, d "/") == 1) print m }' /proc/self/mountinfo |
        sort -r
}

# Deletes a folder tree made by this script, never crossing into a mount.
remove_tree() {
    local dir=$1 m left
    [ -e "$dir" ] || return 0
    while read -r m; do
        [ -n "$m" ] || continue
        say "unmounting leftover $m"
        umount "$m" 2>/dev/null || umount -l "$m" || true
    done < <(mounts_under "$dir")
    left=$(mounts_under "$dir")
    [ -z "$left" ] || die "refusing to delete $dir: still mounted: $left"
    rm -rf --one-file-system -- "$dir"
}

stamp_field() { sed -n "s/^$2=//p" "$1/$stamp_name" 2>/dev/null | head -n1; }

# Why the existing root cannot be reused ("" when it can).
stale_reason() {
    [ -d "$root" ] || { echo "no root yet"; return; }
    [ -f "$root/$stamp_name" ] || { echo "no stamp (an interrupted or foreign build)"; return; }
    [ "$(stamp_field "$root" digest)" = "$recipe_digest" ] || { echo "package list, mirror or recipe changed"; return; }
    local created now
    created=$(stamp_field "$root" created)
    now=$(date +%s)
    case $created in '' | *[!0-9]*) echo "unreadable stamp"; return ;; esac
    if [ $((now - created)) -gt $((max_age_days * 86400)) ]; then
        echo "older than $max_age_days days"
        return
    fi
    [ "$rebuild" = 0 ] || { echo "--rebuild given"; return; }
    echo ""
}

# Holding the lock, nothing else is building: what older, interrupted runs
# left (a build folder, its logs, a replaced root) can go.
for old in "$roots_dir/.$suite.build."* "$roots_dir/.$suite.old."*; do
    [ -e "$old" ] || continue
    say "removing the leftover $old"
    if [ -d "$old" ]; then remove_tree "$old"; else rm -f -- "$old"; fi
done

# Processes chrooted into the root (a test cluster's daemons, a test run
# of scripts/in-release.sh): replacing the root under them would delete the
# files they run from.
in_use() {
    local p r
    for p in /proc/[0-9]*; do
        r=$(readlink "$p/root" 2>/dev/null) || continue
        case $r/ in "$1"/*) return 0 ;; esac
    done
    return 1
}

reason=$(stale_reason)
if [ -n "$reason" ] && [ -f "$root/.onepool-root-stamp" ] && in_use "$root"; then
    say "warning: the $suite root is in use (processes run inside it): not rebuilt now ($reason); stop them and run again"
    reason=""
fi
if [ -z "$reason" ]; then
    say "reusing the $suite root for Slurm $(stamp_field "$root" slurm) (made $(date -d "@$(stamp_field "$root" created)" '+%F %T'))"
    echo "$root"
    exit 0
fi

command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install debootstrap"
[ -e "/usr/share/debootstrap/scripts/$suite" ] ||
    die "this debootstrap does not know $suite: update it (apt-get install debootstrap)"

build="$roots_dir/.$suite.build.$$"
# Deleting the unfinished build on any exit; the stamp is written last, so
# an unfinished tree is never mistaken for a root.
trap 'remove_tree "$build" || true; rm -f "$build.debootstrap.log" "$build.apt.log"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "making the $suite root for Slurm $release ($reason) in $build"
say "mirror $mirror; packages: ${packages[*]}"
t0=$(date +%s)

build_root() {
    debootstrap --variant=minbase "$suite" "$build" "$mirror" >"$build.debootstrap.log" 2>&1 || {
        tail -n 20 "$build.debootstrap.log" >&2
        return 1
    }
    say "debootstrap done in $(($(date +%s) - t0)) s"

    mkdir -p "$build/var/log/onepool-root" &&
        mv "$build.debootstrap.log" "$build/var/log/onepool-root/debootstrap.log" || return 1
    # Keep services from starting inside the root while packages install.
    printf '#!/bin/sh\nexit 101\n' >"$build/usr/sbin/policy-rc.d"
    chmod 755 "$build/usr/sbin/policy-rc.d" || return 1
    # sid's Release file is often past its Valid-Until on snapshot mirrors.
    if [ "$suite" = sid ]; then
        echo 'Acquire::Check-Valid-Until "false";' >"$build/etc/apt/apt.conf.d/99onepool-no-valid-until"
    fi
    cp -L /etc/resolv.conf "$build/etc/resolv.conf" 2>/dev/null || true
    cp -L "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}" "$build/tmp/onepool-host-ca.crt" || return 1
    # The host's own certificate authorities (a site's TLS proxy, say), so
    # that the root trusts what the host trusts: the ca-certificates
    # package below adds them to the root's store (pip may use that store
    # rather than PIP_CERT).
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        mkdir -p "$build/usr/local/share/ca-certificates"
        cp -L /usr/local/share/ca-certificates/*.crt "$build/usr/local/share/ca-certificates/" || return 1
    fi
    cp "$requirements_file" "$build/tmp/onepool-requirements.txt" || return 1

    local inner
    # shellcheck disable=SC2016 # expanded by the inner shell
    inner='
        set -eu
        r=$1; shift
        mounted=""
        cleanup() { for m in $mounted; do umount "$m" 2>/dev/null || umount -l "$m" || true; done; }
        trap cleanup EXIT
        mount -t proc proc "$r/proc"; mounted="$r/proc $mounted"
        mount --bind /dev "$r/dev";   mounted="$r/dev $mounted"
        mount --bind /sys "$r/sys";   mounted="$r/sys $mounted"
        export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8
        chroot "$r" apt-get update -qq
        chroot "$r" apt-get install -y -qq --no-install-recommends "$@"
        chroot "$r" apt-get clean
        # PyPI through the host'"'"'s certificate bundle (it may hold a site CA
        # the root lacks); the host'"'"'s local wheel folder is not there.
        chroot "$r" env -u PIP_FIND_LINKS PIP_CERT=/tmp/onepool-host-ca.crt \
            python3 -m pip install --quiet --break-system-packages --no-cache-dir -r /tmp/onepool-requirements.txt
        rm -f "$r/tmp/onepool-host-ca.crt" "$r/tmp/onepool-requirements.txt"
    '
    if unshare --mount --propagation private true 2>/dev/null; then
        say "installing packages (chroot inside a private mount namespace, unshare)"
        unshare --mount --propagation private bash -c "$inner" inner "$build" "${packages[@]}" >"$build.apt.log" 2>&1
    else
        say "installing packages (chroot; unshare unavailable, mounts undone by a trap)"
        bash -c "$inner" inner "$build" "${packages[@]}" >"$build.apt.log" 2>&1
    fi || {
        tail -n 30 "$build.apt.log" >&2
        return 1
    }
    rm -f "$build/usr/sbin/policy-rc.d"
    # Both logs stay inside the root, for whoever wonders what went in.
    mv "$build.apt.log" "$build/var/log/onepool-root/apt.log" || return 1

    local v hex
    # slurm_version.h has only the number (0x160508 = 22.05.8), no string.
    hex=$(sed -n 's/^#define SLURM_VERSION_NUMBER[[:space:]]*0x\([0-9a-fA-F]*\).*/\1/p' \
        "$build/usr/include/slurm/slurm_version.h" 2>/dev/null)
    [ -n "$hex" ] || { say "no SLURM_VERSION_NUMBER in the new root's slurm_version.h"; return 1; }
    v=$(printf '%d.%02d.%d' $((0x$hex >> 16)) $(((0x$hex >> 8) & 0xff)) $((0x$hex & 0xff)))
    case $v in "$release".*) ;; *) say "warning: $suite now ships Slurm $v, not $release.x" ;; esac
    printf 'digest=%s\ncreated=%s\nsuite=%s\nmirror=%s\nslurm=%s\n' \
        "$recipe_digest" "$(date +%s)" "$suite" "$mirror" "$v" >"$build/$stamp_name" || return 1
}

if ! build_root; then
    rm -f "$build.debootstrap.log" "$build.apt.log"
    if [ "$reason" = "older than $max_age_days days" ] && [ -f "$root/$stamp_name" ]; then
        say "warning: could not rebuild the $suite root; using the existing one, $reason"
        echo "$root"
        exit 0
    fi
    die "could not make the $suite root (see the messages above)"
fi
rm -f "$build.debootstrap.log" "$build.apt.log"

# Swap the finished root in; the old one (if any) goes only afterwards.
if [ -e "$root" ]; then
    old="$roots_dir/.$suite.old.$$"
    mv -- "$root" "$old"
    mv -- "$build" "$root"
    remove_tree "$old"
else
    mv -- "$build" "$root"
fi
trap - EXIT
say "the $suite root (Slurm $(stamp_field "$root" slurm)) is ready in $(($(date +%s) - t0)) s"
echo "$root"

#!/usr/bin/env bash
# package-test.sh RELEASE   (22.05 | 24.11 | 26.05)
#
# Installs onepool's .deb for RELEASE (scripts/package.sh) with `dpkg -i` into
# a throwaway copy of a system that carries that Slurm release, and checks it:
#   1. another release's .deb is refused by dpkg (its Pre-Depends pin), and
#      leaves nothing behind;
#   2. this release's .deb installs: every file where it belongs and matching
#      md5sums (dpkg --verify), the conffiles, the service user `onepool`
#      with a regular uid created by the postinst, nothing enabled;
#   3. the installed /usr/bin/onepool checks the installed policy;
#   4. a dev cluster (onepool-devcluster) runs on the INSTALLED files: its
#      plugin folder is fed from the installed PluginDir (not cargo's output),
#      slurmctld's PluginDir lists the system PluginDir first, so slurmctld
#      maps job_submit_onepool.so from there; its policy is the installed
#      /etc/slurm/onepool.toml. Checked: slurmctld logs the plugin's load
#      line, an sbatch --workload=inference job gets its class's QOS, an
#      unknown class is refused with onepool's sentence, and an srun step
#      (the SPANK plugin in srun and slurmstepd) runs;
#   5. `dpkg -r` keeps an edited conffile and the user, `dpkg --purge` drops
#      the conffiles;
#   6. the .rpm's files and Slurm pin are listed (rpm -qpl, -qpR); it is not
#      installed anywhere (no RHEL-family system here).
# Every step prints its time. Everything is torn down at the end.
#
# The throwaway copy: an overlay (upper layer on a tmpfs) over
#   24.11, 26.05  the release root of scripts/release-root.sh (read-only lower
#                 layer: the cached root is never changed)
#   22.05         the host's own root file system (Debian 12 with Slurm 22.05
#                 is the host; release-root.sh makes no bookworm root, and a
#                 debootstrap of one would cost minutes and a download per
#                 run). The host itself is never installed into: a package in
#                 the host's PluginDir would shadow the dev builds that every
#                 other dev cluster on this machine loads.
# mounted in a private mount namespace, so it vanishes with this script, and
# entered with scripts/in-release.sh like the release roots. The cluster lives
# in target/package-cluster/RELEASE (made afresh each run: the copy's users
# are new every time).
#
# Needs root. The packages are built first when missing (scripts/package.sh);
# ONEPOOL_PACKAGE_WRONG overrides the release whose package must be refused
# (default 24.11 for 22.05, else 22.05); ONEPOOL_DEVCLUSTER names the
# onepool-devcluster binary to use (default: the newer of target/release's
# and target/debug's).
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD

rel=${1:-}
case $rel in
    22.05 | 24.11 | 26.05) ;;
    *) echo "usage: package-test.sh 22.05|24.11|26.05" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "package-test: needs root (mount, chroot)" >&2; exit 1; }

# shellcheck source=scripts/lib/steps.sh
source scripts/lib/steps.sh
# shellcheck source=scripts/lib/throwaway-root.sh
source scripts/lib/throwaway-root.sh
steps_begin "package-test $rel" "${ONEPOOL_PACKAGE_TEST_START:-}"

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
wrong=${ONEPOOL_PACKAGE_WRONG:-$([ "$rel" = 22.05 ] && echo 24.11 || echo 22.05)}
deb=target/packages/onepool_${version}+slurm${rel}_amd64.deb
wrong_deb=target/packages/onepool_${version}+slurm${wrong}_amd64.deb
# 22.05's own test must not need a release root just to build the package to
# refuse: without 24.11's .deb (and ONEPOOL_PACKAGE_WRONG), 26.05's will do,
# else a copy of 22.05's with only its control's release pin changed to 24.11
# (the field under test; the real packages' comes from the same template).
stand_in=0
if [ "$rel" = 22.05 ] && [ -z "${ONEPOOL_PACKAGE_WRONG:-}" ] && [ ! -f "$wrong_deb" ]; then
    if [ -f "target/packages/onepool_${version}+slurm26.05_amd64.deb" ]; then
        wrong=26.05 wrong_deb=target/packages/onepool_${version}+slurm26.05_amd64.deb
    else
        stand_in=1 wrong_deb=target/package-test/onepool_${version}+slurm24.11-stand-in_amd64.deb
    fi
fi
work=$here/target/package-test/$rel
cluster_dir=$here/target/package-cluster/$rel

# Outside the namespace: build what is missing, then enter it.
if [ -z "${ONEPOOL_PACKAGE_TEST_INNER:-}" ]; then
    [ -f "$deb" ] || bash scripts/package.sh "$rel"
    if [ $stand_in = 1 ]; then
        t=$(mktemp -d)
        dpkg-deb -R "$deb" "$t/d"
        sed -i -e 's/(>= 22.05~)/(>= 24.11~)/' -e 's/(<< 22.06~)/(<< 24.12~)/' -e 's/^Version: .*/&-stand-in/' "$t/d/DEBIAN/control"
        mkdir -p target/package-test
        dpkg-deb --root-owner-group -Zxz -z0 --build "$t/d" "$wrong_deb" >/dev/null
        rm -rf "$t"
        echo "package-test $rel: no other release's .deb here: refusing a copy of $(basename "$deb") pinned to 24.11"
    else
        [ -f "$wrong_deb" ] || bash scripts/package.sh "$wrong"
    fi
    if [ "$rel" = 22.05 ]; then lower=/; else lower=$(bash scripts/release-root.sh "$rel" | tail -n 1); fi
    say "packages ready ($(basename "$deb"), refused: $(basename "$wrong_deb"))"
    mkdir -p "$work"
    exec env ONEPOOL_PACKAGE_TEST_INNER="$lower" ONEPOOL_PACKAGE_TEST_START="$t_start" \
        unshare --mount --propagation private bash "$0" "$rel"
fi

lower=$ONEPOOL_PACKAGE_TEST_INNER
dc=$(find_devcluster) || exit 1

# The throwaway copy.
throwaway_root "$lower" "$work"
in_root() { bash "$here/scripts/in-release.sh" "$root" "$@"; }

teardown() {
    in_root "$dc" --dir "$cluster_dir" down >/dev/null 2>&1 || true
    kill_in_root
}
trap teardown EXIT
say "throwaway copy of $lower mounted"

pkgs=$(in_root sh -c "dpkg-query -W -f='\${Package} \${Version}\n' 'slurm*' 'libslurm*' 2>/dev/null | grep -v ' $' || true")
indent <<<"$pkgs"
forget_onepool_user

# 1. The wrong release's package is refused before anything is unpacked.
set +e
refusal=$(in_root dpkg -i "$here/$wrong_deb" 2>&1)
rc=$?
set -e
indent <<<"$refusal"
[ $rc -ne 0 ] || fail "dpkg -i $(basename "$wrong_deb") succeeded on Slurm $rel"
grep -q "pre-dependency problem" <<<"$refusal" || fail "the refusal is no dependency error"
# (dpkg remembers the name it selected: `unknown ok not-installed`.)
# shellcheck disable=SC2016 # expanded inside the root
in_root sh -c 'dpkg-query -W -f="\${Status}\n" onepool 2>/dev/null | grep -qv "not-installed\$" && exit 1
    [ ! -e /usr/lib/x86_64-linux-gnu/slurm-wlm/job_submit_onepool.so ]' ||
    fail "the refused package left something behind"
say "dpkg -i $(basename "$wrong_deb") refused (exit $rc)"

# 2. This release's package installs.
in_root dpkg -i "$here/$deb" 2>&1 | sed 's/^/    /'
[ "${PIPESTATUS[0]}" = 0 ] || fail "dpkg -i $(basename "$deb")"
# shellcheck disable=SC2016 # expanded inside the root
in_root sh -euc '
    dpkg-query -W -f="\${Status} \${Version}\n" onepool | grep -q "^install ok installed"
    dpkg --verify onepool
    plugindir=/usr/lib/x86_64-linux-gnu/slurm-wlm
    for f in $plugindir/job_submit_onepool.so $plugindir/spank_onepool.so /usr/bin/onepool /usr/bin/onepoold \
        /lib/systemd/system/onepoold.service /lib/systemd/system/onepoold.socket \
        /etc/slurm/onepool.toml /etc/slurm/onepoold.toml \
        /usr/share/doc/onepool/README.md /usr/share/doc/onepool/LICENSE \
        /usr/share/doc/onepool/docs/deploy.md /usr/share/doc/onepool/docs/report.md \
        /usr/share/man/man1/onepool.1.gz /usr/share/man/man1/onepool-report.1.gz /usr/share/man/man8/onepoold.8.gz \
        /usr/share/man/man5/onepool.toml.5.gz /usr/share/man/man5/onepoold.toml.5.gz; do
        [ -s "$f" ] || { echo "missing: $f"; exit 1; }
    done
    dpkg-query -W -f="\${Conffiles}\n" onepool | grep -q "/etc/slurm/onepool.toml"
    dpkg-query -W -f="\${Conffiles}\n" onepool | grep -q "/etc/slurm/onepoold.toml"
    # The pages are roff with a title line; man finds them where it is installed.
    for p in /usr/share/man/man1/onepool.1.gz /usr/share/man/man8/onepoold.8.gz /usr/share/man/man5/onepool.toml.5.gz; do
        zcat "$p" | grep -q "^\.TH " || { echo "not a manual page: $p"; exit 1; }
    done
    if command -v man >/dev/null; then man -w onepool >/dev/null && man -w 8 onepoold >/dev/null; fi
    uid=$(id -u onepool)
    uid_min=$(awk "/^UID_MIN/ {print \$2}" /etc/login.defs)
    [ "$uid" -ge "${uid_min:-1000}" ] || { echo "onepool has a system uid ($uid)"; exit 1; }
    id -gn onepool | grep -qx onepool
    # Nothing enabled.
    ! ls /etc/systemd/system/*.wants/onepoold.* 2>/dev/null | grep -q .
    echo "    installed: $(dpkg-query -W -f="\${Package} \${Version}" onepool), user onepool uid $uid"
' || fail "the installed files"
say "dpkg -i $(basename "$deb") installed and checked"

# 3. The installed CLI checks the installed policy.
in_root /usr/bin/onepool policy check /etc/slurm/onepool.toml 2>&1 | sed 's/^/    /'
[ "${PIPESTATUS[0]}" = 0 ] || fail "onepool policy check /etc/slurm/onepool.toml"
say "onepool policy check /etc/slurm/onepool.toml"

# 4. A dev cluster on the installed plugins and policy. onepool-devcluster
# copies the plugins from a folder of cargo's file names: that folder holds
# only links to the installed files.
rm -rf "$cluster_dir"
mkdir -p "$cluster_dir/installed-plugins"
ln -s /usr/lib/x86_64-linux-gnu/slurm-wlm/job_submit_onepool.so "$cluster_dir/installed-plugins/libjob_submit_onepool.so"
ln -s /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_onepool.so "$cluster_dir/installed-plugins/libspank_onepool.so"
cdir=$cluster_dir/cluster
in_root "$dc" --dir "$cdir" up --nodes 1 --no-install \
    --plugins "$cluster_dir/installed-plugins" --policy /etc/slurm/onepool.toml 2>&1 | sed 's/^/    /'
[ "${PIPESTATUS[0]}" = 0 ] || fail "onepool-devcluster up"
say "dev cluster up on the installed plugins"

# shellcheck disable=SC2016 # expanded inside the root
in_root env CDIR="$cdir" sh -euc '
    export SLURM_CONF=$CDIR/etc/slurm.conf
    plugindir=/usr/lib/x86_64-linux-gnu/slurm-wlm
    grep -m1 "job_submit/onepool: loaded" $CDIR/log/slurmctld.log | sed "s/^/    slurmctld.log: /"
    pid=$(cat $CDIR/run/slurmctld.pid)
    # (maps names the file as seen from outside the chroot: $root$plugindir/...)
    grep -q "$plugindir/job_submit_onepool.so$" /proc/$pid/maps ||
        { echo "slurmctld did not map $plugindir/job_submit_onepool.so"; grep onepool /proc/$pid/maps; exit 1; }
    echo "    slurmctld (pid $pid) maps $(grep -m1 -o "/[^ ]*$plugindir/job_submit_onepool.so$" /proc/$pid/maps)"
    # plugstack.conf names the cluster folder'"'"'s copy: the installed bytes.
    cmp $plugindir/spank_onepool.so $CDIR/plugins/spank_onepool.so
    grep -m1 -o "spank/onepool: loaded in slurmd (built for Slurm [0-9.]*)" $CDIR/log/slurmd-node1.log | sed "s/^/    slurmd-node1.log: /"
    cmp $plugindir/job_submit_onepool.so $CDIR/plugins/job_submit_onepool.so
    id op-pkg >/dev/null 2>&1 || useradd --no-create-home --shell /bin/sh op-pkg
    sacctmgr -i add account research Description=test Organization=test >/dev/null
    sacctmgr -i add user op-pkg Account=research >/dev/null
    as_user() { runuser -u op-pkg -- env SLURM_CONF=$SLURM_CONF "$@"; }
    cd /tmp
    j=$(as_user sbatch --parsable -o /dev/null --hold --workload=inference --gpus=1 --wrap true)
    qos=$(scontrol -o show job $j | tr " " "\n" | sed -n "s/^QOS=//p")
    echo "    sbatch --workload=inference: job $j, QOS $qos"
    [ "$qos" = op-inference ]
    scancel $j
    if as_user sbatch -o /dev/null --workload=gaming --wrap true 2>/tmp/refused; then
        echo "an unknown class was accepted"; exit 1
    fi
    grep "onepool: --workload=gaming is not a workload class" /tmp/refused | sed "s/^/    /"
    timeout 60 runuser -u op-pkg -- env SLURM_CONF=$SLURM_CONF srun --workload=agents -N1 -n1 true
    echo "    srun --workload=agents: step ran"
' || fail "the plugins in the cluster"
say "plugins loaded and enforcing"

in_root "$dc" --dir "$cdir" down 2>&1 | sed 's/^/    /'
teardown
trap - EXIT
say "cluster torn down"

# 5. Removal keeps the edited conffiles and the user; purge drops the conffiles.
# shellcheck disable=SC2016 # expanded inside the root
in_root sh -euc '
    echo "# edited" >>/etc/slurm/onepool.toml
    dpkg -r onepool >/dev/null
    [ ! -e /usr/lib/x86_64-linux-gnu/slurm-wlm/job_submit_onepool.so ] && [ ! -e /usr/bin/onepool ]
    grep -q "^# edited" /etc/slurm/onepool.toml
    getent passwd onepool >/dev/null
    dpkg --purge onepool >/dev/null
    [ ! -e /etc/slurm/onepool.toml ] && [ ! -e /etc/slurm/onepoold.toml ]
    echo "    dpkg -r kept the edited /etc/slurm/onepool.toml and the user; dpkg --purge removed the conffiles"
' || fail "removal"
say "removed and purged"

# 6. The .rpm, inspected only (no RHEL-family system here to install it on).
rpmf=target/packages/onepool-${version}-1.slurm${rel}.x86_64.rpm
if command -v rpm >/dev/null && [ -f "$rpmf" ]; then
    next=$(printf '%s.%02d' "${rel%.*}" $((10#${rel#*.} + 1)))
    # Read whole before matching: `rpm -qpl | grep -q` under pipefail fails
    # whenever grep exits before rpm's last write (SIGPIPE, 1 run in ~200).
    files=$(rpm -qpl "$rpmf") || fail "rpm -qpl $rpmf"
    requires=$(rpm -qpR "$rpmf") || fail "rpm -qpR $rpmf"
    grep -qx /usr/lib64/slurm/job_submit_onepool.so <<<"$files" || fail "$rpmf: no /usr/lib64/slurm/job_submit_onepool.so"
    grep -qx /usr/lib64/slurm/spank_onepool.so <<<"$files" || fail "$rpmf: no spank_onepool.so"
    grep -qx "slurm >= $rel" <<<"$requires" || fail "$rpmf: no slurm >= $rel"
    grep -qx "slurm < $next" <<<"$requires" || fail "$rpmf: no slurm < $next"
    say "$(basename "$rpmf"): files and the slurm >= $rel, < $next pin listed (not installed: no RHEL here)"
else
    say "no rpm or no $(basename "$rpmf"): the .rpm is not inspected"
fi

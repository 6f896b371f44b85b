#!/usr/bin/env bash
# upgrade-test.sh   (Slurm 22.05 -> 24.11)
#
# docs/deploy.md step 7, upgrading Slurm under onepool, on a Slurm 24.11
# system: the state a site is in right after Slurm's packages went from
# 22.05 to 24.11 while onepool's stayed behind, then the runbook's command
# that fixes it.
#   1. The 24.11 root (scripts/release-root.sh) gets onepool's 22.05 package
#      with its Slurm pin forced (`dpkg -i --force-depends`: exactly what the
#      pin is there to stop), and the site's edit of /etc/slurm/onepool.toml.
#   2. slurmctld 24.11 meets the 22.05 plugin: slurmctld.log carries the
#      plugin's sentence (built for 22.05, Slurm will refuse it, what to do)
#      and the controller does not come up with it.
#   3. The command of docs/deploy.md step 7, as written there (checked), run
#      in the folder holding the 24.11 package: apt-get replaces onepool in
#      place; the edited policy (a conffile) is kept.
#   4. The cluster comes up on the installed 24.11 plugins, and `onepool
#      doctor` passes both plugin lines.
# Not covered: Slurm's own packages going from 22.05 to 24.11 (a Debian 12
# system cannot take Debian 13's Slurm, and nothing is downloaded here);
# apt-get finds them at the newest version already.
#
# Needs root; the packages are built first when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD
old=22.05 new=24.11
[ "$(id -u)" = 0 ] || { echo "upgrade-test: needs root (mount, chroot)" >&2; exit 1; }

# shellcheck source=scripts/lib/steps.sh
source scripts/lib/steps.sh
# shellcheck source=scripts/lib/throwaway-root.sh
source scripts/lib/throwaway-root.sh
steps_begin upgrade-test "${ONEPOOL_UPGRADE_TEST_START:-}"

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
old_deb=target/packages/onepool_${version}+slurm${old}_amd64.deb
new_deb=target/packages/onepool_${version}+slurm${new}_amd64.deb
work=$here/target/upgrade-test
cdir=$here/target/upgrade-cluster

# The runbook's step 7 command, as docs/deploy.md writes it.
cmd="apt-get install slurmctld slurmd slurm-client ./$(basename "$new_deb")"
awk '/^## 7\./ {on=1} /^## 8\./ {on=0} on' docs/deploy.md |
    awk '/^```sh$/ {on=1; next} /^```/ {on=0} on && NF' | grep -Fxq -- "$cmd" ||
    fail "docs/deploy.md step 7 does not give the command this test runs: $cmd"

if [ -z "${ONEPOOL_UPGRADE_TEST_INNER:-}" ]; then
    [ -f "$old_deb" ] || bash scripts/package.sh "$old"
    [ -f "$new_deb" ] || bash scripts/package.sh "$new"
    lower=$(bash scripts/release-root.sh "$new" | tail -n 1)
    exec env ONEPOOL_UPGRADE_TEST_INNER="$lower" ONEPOOL_UPGRADE_TEST_START="$t_start" \
        unshare --mount --propagation private bash "$0"
fi
lower=$ONEPOOL_UPGRADE_TEST_INNER

dc=$(find_devcluster) || exit 1
throwaway_root "$lower" "$work"
in_root() { bash "$here/scripts/in-release.sh" "$root" env SLURM_CONF="$cdir/etc/slurm.conf" "$@"; }
teardown() {
    in_root "$dc" --dir "$cdir" down >/dev/null 2>&1 || true
    kill_in_root
}
trap teardown EXIT
forget_onepool_user
cp "$old_deb" "$new_deb" "$root/tmp/"
plugindir=/usr/lib/x86_64-linux-gnu/slurm-wlm
say "throwaway copy of the Slurm $new root mounted"

# 1. onepool for 22.05 on a Slurm that is now 24.11.
in_root sh -c "cd /tmp && dpkg -i --force-depends $(basename "$old_deb")" 2>&1 | indent
[ "${PIPESTATUS[0]}" = 0 ] || fail "dpkg -i --force-depends $(basename "$old_deb")"
in_root sh -c 'echo "# edited by the site" >>/etc/slurm/onepool.toml'
say "1. onepool $version+slurm$old installed on Slurm $new (its pin forced), the policy edited"

# 2. slurmctld meets the old plugin. The cluster's plugin folder holds only
# links to the installed files (as in scripts/package-test.sh).
up() {
    rm -rf "$cdir"
    mkdir -p "$cdir/installed-plugins"
    ln -s $plugindir/job_submit_onepool.so "$cdir/installed-plugins/libjob_submit_onepool.so"
    ln -s $plugindir/spank_onepool.so "$cdir/installed-plugins/libspank_onepool.so"
    in_root "$dc" --dir "$cdir" up --nodes 1 --no-install \
        --plugins "$cdir/installed-plugins" --policy /etc/slurm/onepool.toml >"$work/up.log" 2>&1
}
if up; then
    indent <"$work/up.log"
    fail "slurmctld $new came up with the $old plugin"
fi
teardown
sentence="job_submit/onepool: this onepool plugin was built for Slurm $old"
grep -F "$sentence" "$cdir/log/slurmctld.log" | sort -u | indent
grep -E "fatal|job_submit" "$cdir/log/slurmctld.log" | grep -vF "$sentence" | tail -n 3 | indent
tail -n 2 "$work/up.log" | indent
grep -qF "$sentence" "$cdir/log/slurmctld.log" || { tail -20 "$cdir/log/slurmctld.log"; fail "slurmctld.log does not say the plugin is for $old"; }
grep -q "rebuild it" "$cdir/log/slurmctld.log" || fail "the plugin's sentence does not say what to do"
say "2. slurmctld $new refuses the $old plugin, and slurmctld.log says why and what to do"

# 3. The runbook's command.
echo "    \$ $cmd"
# apt-get asks before it upgrades: the admin says yes.
in_root env DEBIAN_FRONTEND=noninteractive sh -c "cd /tmp && echo y | $cmd" 2>&1 | indent
[ "${PIPESTATUS[0]}" = 0 ] || fail "$cmd"
installed=$(in_root dpkg-query -W -f='${Version} ${Status}' onepool)
[ "$installed" = "$version+slurm$new install ok installed" ] || fail "after the upgrade: onepool $installed"
in_root grep -q "^# edited by the site" /etc/slurm/onepool.toml || fail "the upgrade lost the site's edit of /etc/slurm/onepool.toml"
say "3. $cmd: onepool $version+slurm$new, the edited policy kept"

# 4. The cluster on the upgraded plugins; the doctor's plugin lines.
up || { cat "$work/up.log"; fail "the cluster on the $new plugins"; }
grep -m1 "job_submit/onepool: loaded" "$cdir/log/slurmctld.log" | indent
in_root onepool doctor /etc/slurm/onepool.toml >"$work/doctor.txt" 2>&1 || true
grep "plugin" "$work/doctor.txt" | indent
grep -q "^PASS  plugin job_submit_onepool.so: .*built for Slurm $new" "$work/doctor.txt" || fail "doctor: job_submit_onepool.so"
grep -q "^PASS  plugin spank_onepool.so: .*built for Slurm $new" "$work/doctor.txt" || fail "doctor: spank_onepool.so"
in_root "$dc" --dir "$cdir" down 2>&1 | indent
teardown
trap - EXIT
say "4. slurmctld $new loads the upgraded plugin; doctor passes both plugin lines"

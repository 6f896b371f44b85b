#!/usr/bin/env bash
# deploy-test.sh   (Slurm 22.05, the host's release)
#
# Follows docs/deploy.md on a cluster that starts without onepool, running
# the runbook's own commands in the runbook's order, so the document cannot
# rot: every fenced ```sh block of docs/deploy.md is a command this script
# runs (or, where this machine cannot, says why and does the equivalent),
# and the script fails when the document and the script disagree on the
# next command or when a command is left over.
#
# Where: a throwaway overlay of the host's root (as scripts/package-test.sh
# makes it), so `dpkg -i` installs the real package at Debian's paths and
# /etc/slurm/onepool.toml is the file slurmctld's plugin reads. The cluster
# is `onepool-devcluster up --before-onepool`: slurm.conf with an empty
# Include, an empty plugstack.conf, no class QOS.
#
# What stands in for what the chroot lacks (said again where it happens):
#   - "put the slurm.conf lines in slurm.conf": they go into the cluster's
#     Include file; "restart slurmctld": onepool-devcluster restart-slurmctld;
#   - `systemctl enable --now onepoold...`: the unit's ExecStart, run as its
#     User with its RuntimeDirectory made (no systemd in a chroot);
#   - step 7 (upgrading Slurm) needs a newer Slurm: scripts/upgrade-test.sh
#     runs its command on a Slurm 24.11 system left with onepool's 22.05
#     package.
# Needs root; the packages are built first when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD
rel=22.05
[ "$(id -u)" = 0 ] || { echo "deploy-test: needs root (mount, chroot)" >&2; exit 1; }

# shellcheck source=scripts/lib/steps.sh
source scripts/lib/steps.sh
# shellcheck source=scripts/lib/throwaway-root.sh
source scripts/lib/throwaway-root.sh
steps_begin deploy-test "${ONEPOOL_DEPLOY_TEST_START:-}"

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
deb=target/packages/onepool_${version}+slurm${rel}_amd64.deb
work=$here/target/deploy-test
if [ -z "${ONEPOOL_DEPLOY_TEST_INNER:-}" ]; then
    [ -f "$deb" ] || bash scripts/package.sh "$rel"
    mkdir -p "$work"
    exec env ONEPOOL_DEPLOY_TEST_INNER=1 ONEPOOL_DEPLOY_TEST_START="$t_start" \
        unshare --mount --propagation private bash "$0"
fi

dc=$(find_devcluster) || exit 1

# The runbook's commands, in order.
mapfile -t doc_cmds < <(awk '/^```(sh|conf)$/ {on=1; next} /^```/ {on=0} on && NF' docs/deploy.md)
next_cmd=0
# doc CMD: CMD must be the runbook's next command.
doc() {
    local want=${doc_cmds[$next_cmd]:-<end of docs/deploy.md>}
    [ "$1" = "$want" ] || fail "the next command of docs/deploy.md is
    $want
but this test runs
    $1
(update the test and the runbook together)"
    next_cmd=$((next_cmd + 1))
    echo "    \$ $1"
}

throwaway_root / "$work"
cdir=$here/target/deploy-cluster
# Inside the root: a shell with the cluster's SLURM_CONF, in /tmp.
in_root() { bash "$here/scripts/in-release.sh" "$root" env SLURM_CONF="$cdir/etc/slurm.conf" "$@"; }
sh_root() { in_root bash -euo pipefail -c "cd /tmp; $1"; }
as_user() { in_root runuser -u op-deploy -- bash -euo pipefail -c "cd /tmp; $1"; }
teardown() {
    in_root "$dc" --dir "$cdir" down >/dev/null 2>&1 || true
    kill_in_root
}
trap teardown EXIT

# slurm.conf, its Include and plugstack.conf load nothing of onepool (the
# Include's file name and the comments do not count).
no_onepool="! grep -Eq '^[^#]*(_onepool\\.so|JobSubmitPlugins=.*onepool)' $cdir/etc/slurm.conf $cdir/etc/onepool-slurm.conf $cdir/etc/plugstack.conf"

# The site before onepool: a cluster, its users, no onepool anywhere.
forget_onepool_user
rm -rf "$cdir"
# A site as docs/deploy.md's prerequisites ask: processes tracked and GPU
# devices constrained by cgroup (the doctor fails without).
in_root "$dc" --dir "$cdir" up --nodes 2 --no-install --before-onepool --cgroup 2>&1 | indent
[ "${PIPESTATUS[0]}" = 0 ] || fail "onepool-devcluster up --before-onepool --cgroup"
sh_root 'id op-deploy >/dev/null 2>&1 || useradd --no-create-home --shell /bin/sh op-deploy
    sacctmgr -i add account research Description=site Organization=site >/dev/null
    sacctmgr -i add user op-deploy Account=research >/dev/null
    '"$no_onepool"'' || fail "the cluster before onepool names onepool"
as_user 'sbatch --parsable -o /dev/null --gpus=1 --wrap true' >/dev/null || fail "the site before onepool runs no job"
say "the site before onepool: 2 nodes x 4 GPUs, a user's GPU job accepted"

# 2. Install.
cp "$deb" "$root/tmp/"
doc "dpkg -i $(basename "$deb")"
sh_root "dpkg -i $(basename "$deb")" 2>&1 | indent
[ "${PIPESTATUS[0]}" = 0 ] || fail "dpkg -i"
sh_root "$no_onepool" || fail "the package changed slurm.conf or plugstack.conf"
say "2. installed; nothing changed in Slurm"

# 3. The policy, the render, applied.
# "Set audit = true in [pool] for the trial."
sh_root 'sed -i "s/^audit = false/audit = true/" /etc/slurm/onepool.toml; grep -q "^audit = true" /etc/slurm/onepool.toml'
# The plugin reads the policy beside slurm.conf: that is this file.
ln -sf /etc/slurm/onepool.toml "$cdir/etc/onepool.toml"
doc "onepool policy check /etc/slurm/onepool.toml"
sh_root "onepool policy check /etc/slurm/onepool.toml" 2>&1 | indent
doc "onepool policy render --against-live /etc/slurm/onepool.toml"
sh_root "onepool policy render --against-live /etc/slurm/onepool.toml" >"$work/render.txt" || fail "render --against-live"
indent <"$work/render.txt"
grep -q 'AllowQos=op-critical' "$work/render.txt" && fail "in audit mode the render gives an AllowQos for the pool's partitions"
# "Run the sacctmgr commands; put the slurm.conf lines in slurm.conf"
grep '^sacctmgr ' "$work/render.txt" >"$work/sacctmgr.sh"
sh_root "$(cat "$work/sacctmgr.sh")" >/dev/null || fail "the printed sacctmgr commands"
grep -v '^#' "$work/render.txt" | grep -v '^sacctmgr ' | grep . >>"$cdir/etc/onepool-slurm.conf"
doc "required /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_onepool.so"
echo "required /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_onepool.so" >>"$cdir/etc/plugstack.conf"
restart_slurmctld() {
    doc "systemctl restart slurmctld"
    echo "    (no systemd here: onepool-devcluster restart-slurmctld, on the files as edited)"
    in_root "$dc" --dir "$cdir" restart-slurmctld 2>&1 | indent
    doc "scontrol reconfigure"
    sh_root 'scontrol reconfigure'
    sleep 2
}
restart_slurmctld
say "3. $(wc -l <"$work/sacctmgr.sh") sacctmgr commands and $(grep -vc '^#' "$cdir/etc/onepool-slurm.conf") slurm.conf lines applied, slurmctld restarted"

doc "onepool doctor /etc/slurm/onepool.toml"
sh_root "onepool doctor /etc/slurm/onepool.toml" 2>&1 | indent
[ "${PIPESTATUS[0]}" = 0 ] || fail "onepool doctor after step 3"
sh_root 'grep -m1 "job_submit/onepool: loaded" '"$cdir"'/log/slurmctld.log' | indent
doc "onepool doctor /etc/slurm/onepool.toml --local"
sh_root "onepool doctor /etc/slurm/onepool.toml --local" 2>&1 | indent
[ "${PIPESTATUS[0]}" = 0 ] || fail "onepool doctor --local after step 3"
say "3. doctor passes, on the controller and --local"

# 4. Trial in audit mode: the site's usual work, and what the plugin would do.
placed=$(as_user 'sbatch --parsable -o /dev/null --gpus=1 --wrap "sleep 1"')
refused=$(as_user 'sbatch --parsable -o /dev/null --workload=gaming --gpus=1 --wrap "sleep 1"') ||
    fail "in audit mode a job of an unknown class was refused"
# The report counts the plugin's record on each job (its AdminComment),
# which slurmdbd has once the job started: "a few days" of the runbook
# are a few seconds here.
for _ in $(seq 60); do
    recorded=$(sh_root "sacct -j $placed,$refused -X -n -P --format=AdminComment" | grep -c onepool-audit || true)
    [ "$recorded" = 2 ] && break
    sleep 0.5
done
[ "$recorded" = 2 ] || fail "accounting has the plugin's audit record of $recorded of the 2 jobs after 30 s"
sh_root 'grep "job_submit/onepool: audit: " '"$cdir"'/log/slurmctld.log' >"$work/audit.txt" || true
indent <"$work/audit.txt"
grep -q "would place: class" "$work/audit.txt" || fail "no 'would place' audit line in slurmctld.log"
grep -q "would refuse: .*gaming" "$work/audit.txt" || fail "no 'would refuse' audit line for --workload=gaming"
doc "onepool report /etc/slurm/onepool.toml --from now-7days --svg trial.svg"
sh_root "onepool report /etc/slurm/onepool.toml --from now-7days --svg trial.svg" >"$work/trial.txt" 2>&1 ||
    { cat "$work/trial.txt"; fail "onepool report in audit mode"; }
indent <"$work/trial.txt"
grep -qi "refuse" "$work/trial.txt" || fail "the trial report does not count the refusal"
[ -s "$root/tmp/trial.svg" ] || fail "no trial.svg"
say "4. audit lines in slurmctld.log and the trial report read"

# 5. Enforcement.
sh_root 'sed -i "s/^audit = true/audit = false/" /etc/slurm/onepool.toml'
sleep 3
doc "scontrol update PartitionName=gpu AllowQos=op-critical-training,op-inference-baseline"
sh_root "scontrol update PartitionName=gpu AllowQos=op-critical-training,op-inference-baseline"
sed -i 's/^\(PartitionName=gpu .*\)$/\1 AllowQos=op-critical-training,op-inference-baseline/' "$cdir/etc/slurm.conf"
sh_root "onepool doctor /etc/slurm/onepool.toml" 2>&1 | indent
[ "${PIPESTATUS[0]}" = 0 ] || fail "onepool doctor after step 5"
doc "sbatch --workload=training --gpus=1 --wrap 'sleep 60'"
job=$(as_user "sbatch --workload=training --gpus=1 --wrap 'sleep 60'" | awk '{print $NF}')
doc "squeue -o '%i %q %P'"
as_user "squeue -o '%i %q %P'" | indent
as_user "squeue -h -j $job -o '%q %P'" | grep -qx "op-training gpu-flex" || fail "job $job did not get class training in gpu-flex"
if as_user 'sbatch -o /dev/null --workload=gaming --wrap true' 2>"$work/refused.txt"; then
    fail "enforcing: an unknown class was accepted"
fi
indent <"$work/refused.txt"
doc "onepool report /etc/slurm/onepool.toml --from now-1days"
sh_root "onepool report /etc/slurm/onepool.toml --from now-1days" >"$work/report.txt" 2>&1 ||
    { cat "$work/report.txt"; fail "onepool report --from now-1days"; }
indent <"$work/report.txt"
grep -q "training" "$work/report.txt" || fail "the report has no training GPU-hours"
say "5. enforcing: job $job runs as op-training in gpu-flex, an unknown class is refused, doctor passes"

# 6. onepoold as a service.
doc "onepoold --check --config /etc/slurm/onepoold.toml"
sh_root "onepoold --check --config /etc/slurm/onepoold.toml" 2>&1 | indent
[ "${PIPESTATUS[0]}" = 0 ] || fail "onepoold --check"
# The admin's edit: the sample's model server (vLLM) is not on this
# cluster; the dev cluster's stand-in server is.
sh_root "sed -i 's|^command = .*|command = \"python3 $here/etc/dev-cluster/stand-in-model-server.py\"|' /etc/slurm/onepoold.toml"
doc "runuser -u onepool -- onepoold --config /etc/slurm/onepoold.toml --preflight chat"
sh_root "runuser -u onepool -- env SLURM_CONF=$cdir/etc/slurm.conf onepoold --config /etc/slurm/onepoold.toml --preflight chat" >"$work/preflight.txt" 2>&1 ||
    { cat "$work/preflight.txt"; fail "the serving preflight"; }
indent <"$work/preflight.txt"
grep -q "first chat completion answered" "$work/preflight.txt" || fail "the preflight's replica did not answer"
doc "systemctl enable --now onepoold.socket onepoold.service"
# No systemd in a chroot: the unit's ExecStart, as its User, with its RuntimeDirectory.
exec_start=$(sed -n 's/^ExecStart=//p' "$root/lib/systemd/system/onepoold.service")
user=$(sed -n 's/^User=//p' "$root/lib/systemd/system/onepoold.service")
echo "    (no systemd here: running '$exec_start' as $user)"
sh_root "mkdir -p /run/onepool && chown $user /run/onepool"
in_root runuser -u "$user" -- env SLURM_CONF="$cdir/etc/slurm.conf" $exec_start >"$work/onepoold.log" 2>&1 &
for _ in $(seq 50); do
    [ -S "$root/run/onepool/onepoold.sock" ] && break
    sleep 0.2
done
doc "onepool doctor /etc/slurm/onepool.toml --daemon-config /etc/slurm/onepoold.toml"
sh_root "onepool doctor /etc/slurm/onepool.toml --daemon-config /etc/slurm/onepoold.toml" 2>&1 | indent
[ "${PIPESTATUS[0]}" = 0 ] || fail "onepool doctor with the daemon config"
doc "onepool status"
sh_root "onepool status" >"$work/status.txt" 2>&1 || { cat "$work/status.txt" "$work/onepoold.log"; fail "onepool status"; }
indent <"$work/status.txt"
grep -q chat "$work/status.txt" || fail "onepool status does not list the endpoint chat"
say "6. onepoold runs as $user; doctor and status read it"

# 7. Not run: see the header.
doc "apt-get install slurmctld slurmd slurm-client ./onepool_0.1.0+slurm24.11_amd64.deb"
echo "    (run by scripts/upgrade-test.sh, on Slurm 24.11)"

# 8. Rollback.
doc "systemctl disable --now onepoold.service onepoold.socket"
echo "    (no systemd here: SIGTERM to onepoold)"
pkill -TERM -f "^/usr/bin/onepoold" || true
for _ in $(seq 50); do pgrep -f "^/usr/bin/onepoold" >/dev/null || break; sleep 0.2; done
pgrep -f "^/usr/bin/onepoold" >/dev/null && fail "onepoold did not stop on SIGTERM"
doc "scancel -u onepool"
sh_root "scancel -u onepool"
# The training job of step 5 ends too: the QOS are deleted below only once no job has them.
sh_root "scancel -u op-deploy"
# The edits of step 3 and 5, taken back.
echo "# Empty: the site before onepool." >"$cdir/etc/onepool-slurm.conf"
sed -i '/spank_onepool.so/d' "$cdir/etc/plugstack.conf"
sed -i 's/ AllowQos=op-critical-training,op-inference-baseline$//' "$cdir/etc/slurm.conf"
doc "scontrol update PartitionName=gpu AllowQos=ALL"
sh_root "scontrol update PartitionName=gpu AllowQos=ALL"
restart_slurmctld
for _ in $(seq 50); do [ -z "$(sh_root 'squeue -h -q op-agents,op-inference,op-training,op-critical-training,op-inference-baseline')" ] && break; sleep 0.2; done
doc "sacctmgr -i delete qos op-agents,op-inference,op-training,op-critical-training,op-inference-baseline,onepool-flexible-cap"
sh_root "sacctmgr -i delete qos op-agents,op-inference,op-training,op-critical-training,op-inference-baseline,onepool-flexible-cap" | indent
doc "sacctmgr -i delete user onepool"
sh_root "sacctmgr -i delete user onepool" | indent
doc "sacctmgr -i delete account onepool"
sh_root "sacctmgr -i delete account onepool" | indent
doc "dpkg -r onepool"
sh_root "dpkg -r onepool" 2>&1 | indent
doc "scontrol show config | grep -E 'JobSubmitPlugins|PlugStack'"
sh_root "scontrol show config | grep -E 'JobSubmitPlugins|PlugStack'" >"$work/config.txt"
indent <"$work/config.txt"
grep -q onepool "$work/config.txt" && fail "slurm.conf still names onepool"
doc "sbatch --workload=training --wrap true"
if as_user "sbatch --workload=training --wrap true" 2>"$work/unknown.txt"; then
    fail "--workload is still an option after the rollback"
fi
indent <"$work/unknown.txt"
grep -q "unrecognized option" "$work/unknown.txt" || fail "sbatch did not call --workload an unknown option"
# As it was: the site's QOS only, the associations' lists without the class QOS, and its job runs.
sh_root "sacctmgr -n -P show qos format=name" | grep -q "^op-" && fail "a class QOS is left"
sh_root "sacctmgr -n -P show assoc format=qos" | grep -q "op-" && fail "an association still lists a class QOS"
[ ! -e "$root/usr/lib/x86_64-linux-gnu/slurm-wlm/job_submit_onepool.so" ] && [ ! -e "$root/usr/lib/x86_64-linux-gnu/slurm-wlm/spank_onepool.so" ] ||
    fail "a plugin is left in PluginDir"
as_user 'sbatch --parsable -o /dev/null --gpus=1 --wrap true' >/dev/null || fail "the site after the rollback runs no job"
say "8. rolled back: no onepool in slurm.conf, plugstack.conf, the QOS, the associations or PluginDir; the site's GPU job accepted"

[ "$next_cmd" = "${#doc_cmds[@]}" ] || fail "docs/deploy.md has commands this test does not run: ${doc_cmds[*]:$next_cmd}"
in_root "$dc" --dir "$cdir" down 2>&1 | indent
teardown
trap - EXIT
say "every command of docs/deploy.md ($next_cmd) followed in order"

//! The dev cluster configures itself from the policy, exactly as an admin
//! would from `onepool policy render --against-live`: the slurm.conf
//! settings the policy needs are merged with the site's own (the launcher's
//! template stands for the site), and the QOS are brought to the policy
//! through the same diff against what sacctmgr reports.

use std::collections::{BTreeMap, HashSet};

use onepool_decisions::policy::Policy;
use onepool_decisions::render::live::{self, LiveConfig, LivePartition};
use onepool_decisions::render::render;

use crate::error::{Error, Result};
use crate::Cluster;

/// The Include file's text when the cluster starts as the site before onepool.
pub(crate) const BEFORE_ONEPOOL: &str =
    "# Empty: the site before onepool (`onepool-devcluster up --before-onepool`).\n\
     # `onepool policy render --against-live` prints the lines to put here.\n";

/// The `Key=Value` settings and partitions of a slurm.conf text.
fn read_site(conf: &str) -> (LiveConfig, Vec<LivePartition>) {
    let mut values = BTreeMap::new();
    let mut partitions = Vec::new();
    for line in conf.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
        let Some((key, value)) = line.split_once('=') else { continue };
        match key {
            "PartitionName" => {
                let field = |name: &str| {
                    line.split_whitespace().find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')).map(str::to_string)
                };
                partitions.push(LivePartition {
                    name: value.split_whitespace().next().unwrap_or_default().to_string(),
                    nodes: field("Nodes"),
                    qos: field("QOS"),
                    allow_qos: field("AllowQos").and_then(|v| live::allow_list(&v)),
                });
            }
            "NodeName" => {}
            _ => {
                values.insert(key.to_string(), value.to_string());
            }
        }
    }
    (LiveConfig { values }, partitions)
}

/// (slurm.conf without the keys the policy sets, the policy's settings
/// merged with the site's values) — so no key is set twice.
pub(crate) fn merge(site_conf: &str, policy: &Policy, job_submit_plugins: Option<&str>) -> Result<(String, String)> {
    let rendered = render(policy);
    let (site, partitions) = read_site(site_conf);
    let changes = live::diff(&rendered, &[], &site, &partitions);
    let problems: Vec<String> = changes.problems.iter().filter(|d| d.is_error()).map(ToString::to_string).collect();
    if !problems.is_empty() {
        return Err(Error::Setup(format!("the policy does not fit the dev cluster: {}", problems.join("; "))));
    }
    let mut overridden: HashSet<&str> = changes.slurm_conf.iter().map(|c| c.key).collect();
    let mut include = changes.slurm_conf_text();
    if let Some(list) = job_submit_plugins {
        overridden.insert("JobSubmitPlugins");
        include = replace_setting(&include, "JobSubmitPlugins", list);
    }
    // The admin's edit of the site's own partition lines: AllowQos as
    // rendered (see `onepool policy render`), replacing any they had.
    let kept: Vec<String> = site_conf
        .lines()
        .filter(|l| l.split_once('=').is_none_or(|(k, _)| !overridden.contains(k.trim())))
        .map(|l| match changes.access.iter().find(|a| partition_name(l) == Some(a.want.name.as_str())) {
            Some(a) => {
                // slurm.conf keys are case-insensitive: drop AllowQOS= too.
                let rest: Vec<&str> =
                    l.split_whitespace().filter(|w| !w.to_ascii_lowercase().starts_with("allowqos=")).collect();
                format!("{} AllowQos={}", rest.join(" "), a.want.allow_qos.join(","))
            }
            None => l.to_string(),
        })
        .collect();
    let header = "# Written by onepool-devcluster from `onepool policy render` of the cluster's\n\
                  # onepool.toml, merged with the site settings in slurm.conf.\n";
    Ok((kept.join("\n") + "\n", format!("{header}{include}")))
}

fn partition_name(line: &str) -> Option<&str> {
    line.trim().strip_prefix("PartitionName=")?.split_whitespace().next()
}

/// The site text with `extra`'s `Key=Value` lines replacing its own
/// settings of those keys, placed before the final `Include`.
pub(crate) fn override_settings(site: &str, extra: &str) -> String {
    let key = |l: &str| l.split_once('=').map(|(k, _)| k.trim().to_string());
    let extra_lines: Vec<&str> = extra.lines().filter(|l| !l.trim().is_empty()).collect();
    let keys: HashSet<String> = extra_lines.iter().filter_map(|l| key(l)).collect();
    let mut out: Vec<&str> = site.lines().filter(|l| key(l).is_none_or(|k| !keys.contains(&k))).collect();
    let at = out.iter().rposition(|l| l.starts_with("Include ")).unwrap_or(out.len());
    out.splice(at..at, extra_lines);
    out.join("\n") + "\n"
}

/// Sets `key` to `value` in a slurm.conf text (or drops it when `value` is
/// empty, which is how Slurm spells "no plugins").
fn replace_setting(text: &str, key: &str, value: &str) -> String {
    let mut out: Vec<String> =
        text.lines().filter(|l| l.split_once('=').is_none_or(|(k, _)| k != key)).map(str::to_string).collect();
    if !value.is_empty() {
        out.push(format!("# set by `onepool-devcluster up --job-submit-plugins`\n{key}={value}"));
    }
    out.join("\n") + "\n"
}

/// Brings the QOS to the policy (adding or modifying only what differs,
/// from what sacctmgr reports) and lets the site's accounts use them: with
/// AccountingStorageEnforce=qos a job's QOS must be in its association's
/// list, and accounts made under root inherit root's. Needs only slurmdbd,
/// so it runs before slurmctld reads a partition that names one of them.
pub(crate) fn apply_qos(cl: &Cluster, policy: &Policy, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let rendered = render(policy);
    let live_qos = live::parse_sacctmgr_qos(&cl.run(live::SHOW_QOS[0], &live::SHOW_QOS[1..])?)
        .map_err(|e| Error::Setup(format!("reading `{}`: {e}", live::SHOW_QOS.join(" "))))?;
    let changes = live::diff(&rendered, &live_qos, &LiveConfig::default(), &[]);
    for argv in changes.sacctmgr_commands() {
        let args: Vec<&str> = argv.iter().skip(1).map(String::as_str).collect();
        cl.run("sacctmgr", &args)?;
    }
    if !changes.qos.is_empty() {
        progress(&format!("applied {} QOS change(s) from the policy", changes.qos.len()));
    }
    let grant = rendered.root_grant().command();
    let args: Vec<&str> = grant.iter().skip(1).map(String::as_str).collect();
    cl.run("sacctmgr", &args)?;
    service_user(cl, &rendered.service, progress)
}

/// onepoold's service user, as etc/systemd/onepoold.service expects it,
/// and the Slurm account and association `onepool policy render` prints
/// for it. A regular uid, not a system one: the GPU hand-off check never
/// kills system users' processes, and a replica's leftovers must be
/// cleanable.
fn service_user(
    cl: &Cluster,
    s: &onepool_decisions::render::ServiceAccount,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let exists = std::process::Command::new("id").arg("-u").arg(&s.user).output().is_ok_and(|o| o.status.success());
    if !exists {
        let out = std::process::Command::new("useradd")
            .args(["--no-create-home", "--shell", "/usr/sbin/nologin", &s.user])
            .output()
            .map_err(|e| Error::Setup(format!("useradd {}: {e}", s.user)))?;
        // 9: another process created it meanwhile.
        if !out.status.success() && out.status.code() != Some(9) {
            return Err(Error::Setup(format!("useradd {}: {}", s.user, String::from_utf8_lossy(&out.stderr).trim())));
        }
        progress(&format!("created the service user {}", s.user));
    }
    let assocs = cl.run("sacctmgr", &["-n", "-P", "show", "assoc", "format=account,user"])?;
    if !assocs.lines().any(|l| l.trim() == format!("{}|{}", s.account, s.user)) {
        for argv in s.commands() {
            let args: Vec<&str> = argv.iter().skip(1).map(String::as_str).collect();
            // `add account` of an account that exists fails: the user's line decides.
            let _ = cl.run("sacctmgr", &args);
        }
        let assocs = cl.run("sacctmgr", &["-n", "-P", "show", "assoc", "format=account,user"])?;
        if !assocs.lines().any(|l| l.trim() == format!("{}|{}", s.account, s.user)) {
            return Err(Error::Setup(format!(
                "sacctmgr did not create the association of {} in account {}",
                s.user, s.account
            )));
        }
        progress(&format!("added the Slurm association {}/{}", s.account, s.user));
    }
    Ok(())
}

/// QOS limits on GPUs can only be created once slurmdbd knows the gres/gpu
/// TRES, which slurmctld registers the first time it starts.
pub(crate) fn gpu_tres_known(cl: &Cluster) -> Result<bool> {
    let out = cl.run("sacctmgr", &["-n", "-P", "show", "tres", "format=type,name"])?;
    Ok(out.lines().any(|l| l.trim() == "gres|gpu"))
}

/// slurm.conf's partitions without `AllowQos`, for slurmctld's very first
/// start: the class QOS it names cannot exist yet, and 26.05's slurmctld
/// stops at an unknown one ("Partition gpu has an invalid AllowQOS",
/// measured; 22.05 and 24.11 go on).
pub(crate) fn without_allow_qos(conf: &str) -> String {
    conf.lines()
        .map(|l| {
            if partition_name(l).is_some() {
                let words: Vec<&str> =
                    l.split_whitespace().filter(|w| !w.to_ascii_lowercase().starts_with("allowqos=")).collect();
                words.join(" ") + "\n"
            } else {
                format!("{l}\n")
            }
        })
        .collect()
}

/// The policy's slurm.conf settings without the flexible partition, for
/// slurmctld's very first start (its partition QOS cannot exist yet).
pub(crate) fn without_flexible_partition(include: &str) -> String {
    include.lines().filter(|l| !l.starts_with("PartitionName=")).map(|l| format!("{l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: &str = "ClusterName=x\nJobSubmitPlugins=lua\nPrologFlags=Contain\nNodeName=n1 CPUs=1\nPartitionName=gpu Nodes=ALL Default=YES\nInclude /x/onepool-slurm.conf\n";

    #[test]
    fn policy_settings_are_merged_and_never_set_twice() {
        let policy = onepool_decisions::policy::load(include_str!("../../etc/onepool.toml")).policy.unwrap();
        let (conf, include) = merge(SITE, &policy, None).unwrap();
        assert!(!conf.contains("JobSubmitPlugins"), "{conf}");
        // Contain already implies Alloc: the site's value stays as it is.
        assert!(conf.contains("PrologFlags=Contain") && !include.contains("PrologFlags"), "{conf}{include}");
        assert!(conf.contains("ClusterName=x") && conf.contains("Include /x/onepool-slurm.conf"));
        assert!(include.contains("\nJobSubmitPlugins=lua,onepool\n"), "{include}");
        assert!(include.contains("PartitionName=gpu-flex Nodes=ALL QOS=onepool-flexible-cap"), "{include}");
        // The site's pool partition admits only the protected classes' QOS.
        assert!(
            conf.contains(
                "PartitionName=gpu Nodes=ALL Default=YES AllowQos=op-critical-training,op-inference-baseline\n"
            ),
            "{conf}"
        );
        assert!(include.contains("PreemptType=preempt/qos"), "{include}");
        let (conf, include) = merge(SITE, &policy, Some("")).unwrap();
        assert!(!conf.contains("JobSubmitPlugins") && !include.contains("JobSubmitPlugins"), "{include}");
        let (_, include) = merge(SITE, &policy, Some("lua")).unwrap();
        let site = override_settings(SITE, "ClusterName=y\nMinJobAge=5\n");
        assert!(site.contains("ClusterName=y\n") && !site.contains("ClusterName=x"), "{site}");
        assert!(site.ends_with("MinJobAge=5\nInclude /x/onepool-slurm.conf\n"), "{site}");
        assert!(include.contains("\nJobSubmitPlugins=lua\n"), "{include}");
    }

    #[test]
    fn the_first_start_drops_allow_qos_from_partition_lines_only() {
        let conf = "ClusterName=x\nPartitionName=gpu Nodes=ALL AllowQOS=a,b Default=YES\nAllowQosNote=1\n";
        assert_eq!(without_allow_qos(conf), "ClusterName=x\nPartitionName=gpu Nodes=ALL Default=YES\nAllowQosNote=1\n");
    }
}

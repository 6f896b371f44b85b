//! The rendered configuration against the live cluster: what to add or
//! change, never what to delete. QOS the policy does not name, the site's
//! other plugins, flags and parameters are left as they are.

use super::{LiveConfig, LivePartition, LiveQos};
use crate::policy::Diagnostic;
use crate::render::grant::{self, Grant, LiveAssociation};
use crate::render::qos::{modify_command, same_name, same_names, shell_line, QosPreemptMode, QosSetting, QosSpec};
use crate::render::{FlexiblePartition, PartitionAccess, Rendered, ServiceAccount};

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Changes {
    /// Additions first (in creation order), then modifications, so that
    /// every QOS a `Preempt=` list names exists when the list is set.
    pub qos: Vec<QosChange>,
    pub slurm_conf: Vec<ConfChange>,
    pub partition: Option<PartitionChange>,
    /// The pool's partitions whose `AllowQos` lets other QOS run there.
    pub access: Vec<AccessChange>,
    /// Associations that must list the class QOS (see
    /// [`crate::render::grant`]); filled from `sacctmgr show assoc` by
    /// [`Changes::with_associations`].
    pub grants: Vec<Grant>,
    /// onepoold's service account, when its association is missing.
    pub service: Option<ServiceAccount>,
    /// What the changes cannot fix: a QOS the site must create, a partition
    /// the pool names that does not exist.
    pub problems: Vec<Diagnostic>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QosChange {
    Add(QosSpec),
    Modify {
        /// As the cluster spells it.
        name: String,
        why: String,
        settings: Vec<QosSetting>,
    },
}

/// A slurm.conf key whose live value does not do what onepool needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfChange {
    pub key: &'static str,
    /// `None`: not set (or not shown by `scontrol show config`).
    pub live: Option<String>,
    /// The value to set, the site's own list items kept.
    pub value: String,
    pub why: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionChange {
    /// The flexible partition does not exist: `line` creates it.
    Missing { line: String, why: String },
    /// It exists but flexible jobs there are not capped.
    WrongQos { name: String, live_qos: Option<String>, qos: String },
}

/// A partition of the pool whose live `AllowQos` is not the rendered one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessChange {
    /// `None`: every QOS (`AllowQos=ALL`).
    pub live: Option<Vec<String>>,
    pub want: PartitionAccess,
}

impl QosChange {
    pub fn name(&self) -> &str {
        match self {
            QosChange::Add(spec) => &spec.name,
            QosChange::Modify { name, .. } => name,
        }
    }
    pub fn why(&self) -> &str {
        match self {
            QosChange::Add(spec) => &spec.why,
            QosChange::Modify { why, .. } => why,
        }
    }
    pub fn command(&self) -> Vec<String> {
        match self {
            QosChange::Add(spec) => spec.add_command(),
            QosChange::Modify { name, settings, .. } => modify_command(name, settings),
        }
    }
}

impl Changes {
    /// True when the cluster already matches (problems aside).
    pub fn is_empty(&self) -> bool {
        self.qos.is_empty()
            && self.slurm_conf.is_empty()
            && self.partition.is_none()
            && self.access.is_empty()
            && self.grants.is_empty()
            && self.service.is_none()
    }

    /// Adds what the associations lack: the class QOS in their lists, and
    /// onepoold's service account.
    pub fn with_associations(mut self, rendered: &Rendered, live: &[LiveAssociation]) -> Changes {
        self.grants = grant::grants(&grant::job_qos(rendered.all_qos()), live);
        let s = &rendered.service;
        let has_service = live.iter().any(|a| a.assoc.account == s.account && a.assoc.user.as_ref() == Some(&s.user));
        self.service = (!has_service).then(|| s.clone());
        self
    }
    pub fn has_errors(&self) -> bool {
        self.problems.iter().any(Diagnostic::is_error)
    }
    /// The QOS changes, then the grants, then the service account: in an
    /// order that works (a grant names QOS that must exist).
    pub fn sacctmgr_commands(&self) -> Vec<Vec<String>> {
        let qos = self.qos.iter().map(QosChange::command);
        let grants = self.grants.iter().map(Grant::command);
        qos.chain(grants).chain(self.service.iter().flat_map(ServiceAccount::commands)).collect()
    }
    /// One command a line, each under a comment saying why.
    pub fn sacctmgr_text(&self) -> String {
        let mut out = String::new();
        for change in &self.qos {
            out.push_str(&format!("# {}\n{}\n", change.why(), shell_line(&change.command())));
        }
        for g in &self.grants {
            out.push_str(&g.text());
        }
        if let Some(s) = &self.service {
            out.push_str(&s.text());
        }
        out
    }
    /// The slurm.conf lines to set, each with why and what is there now.
    pub fn slurm_conf_text(&self) -> String {
        let mut out = String::new();
        for c in &self.slurm_conf {
            let now = c.live.as_deref().unwrap_or("not set");
            out.push_str(&format!("# {} (now: {now})\n{}={}\n", c.why, c.key, c.value));
        }
        match &self.partition {
            Some(PartitionChange::Missing { line, why }) => {
                out.push_str(&format!("# {why}\n{line}\n"));
            }
            Some(PartitionChange::WrongQos { name, live_qos, qos }) => {
                out.push_str(&format!(
                    "# partition {name} has QOS={}: add QOS={qos} to its PartitionName line (`scontrol update PartitionName={name} QOS={qos}` applies it until slurmctld restarts)\n",
                    live_qos.as_deref().unwrap_or("N/A")
                ));
            }
            None => {}
        }
        for a in &self.access {
            let now = a.live.as_ref().map_or("ALL".to_string(), |l| l.join(","));
            out.push_str(&format!("# (now: AllowQos={now})\n{}", a.want.instruction()));
        }
        out
    }
}

/// The QOS the site manages (`manage_qos = false`) that the cluster lacks.
fn missing_site_qos(rendered: &Rendered, live_qos: &[LiveQos]) -> Vec<Diagnostic> {
    let mut problems = Vec::new();
    for site in &rendered.site_qos {
        if !live_qos.iter().any(|q| same_name(&q.name, &site.qos)) {
            problems.push(
                Diagnostic::error(
                    None,
                    format!(
                        "class {} maps to QOS {:?}, which does not exist on the cluster (the policy says the site manages it: manage_qos = false)",
                        site.class, site.qos
                    ),
                )
                .help(format!(
                    "create it (sacctmgr -i add qos {}) or set manage_qos = true in [classes.{}] so that onepool creates it",
                    site.qos, site.class
                )),
            );
        }
    }
    problems
}

/// The QOS to create and those to modify, additions first (see
/// [`Changes::qos`]).
fn qos_changes(rendered: &Rendered, live_qos: &[LiveQos]) -> Vec<QosChange> {
    let find_qos = |name: &str| live_qos.iter().find(|q| same_name(&q.name, name));
    let mut added = Vec::new();
    let mut modified = Vec::new();
    for spec in rendered.all_qos() {
        match find_qos(&spec.name) {
            None => added.push(QosChange::Add(spec.clone())),
            Some(live) => {
                let settings = spec.settings_from(live);
                if !settings.is_empty() {
                    modified.push(QosChange::Modify { name: live.name.clone(), why: spec.why.clone(), settings });
                }
            }
        }
    }
    added.extend(modified);
    added
}

/// A class reclaims by requeue on a cluster with `JobRequeue=0`: Slurm
/// cancels its jobs instead, unless they were submitted with `--requeue`.
fn requeue_disabled(rendered: &Rendered, live_config: &LiveConfig) -> Option<Diagnostic> {
    let requeued: Vec<&str> = rendered
        .all_qos()
        .filter(|q| q.preempt_mode == Some(QosPreemptMode::Requeue))
        .filter_map(|q| q.class.as_deref())
        .collect();
    if requeued.is_empty() || live_config.get("JobRequeue").map(str::trim) != Some("0") {
        return None;
    }
    Some(
        Diagnostic::warning(
            None,
            format!(
                "JobRequeue=0: reclaimed jobs of class {} are cancelled, not requeued, unless submitted with --requeue",
                requeued.join(", ")
            ),
        )
        .help("set JobRequeue=1 in slurm.conf (Slurm's default), or submit those jobs with sbatch --requeue"),
    )
}

/// Only the changes that bring the live cluster to `rendered`.
pub fn diff(
    rendered: &Rendered,
    live_qos: &[LiveQos],
    live_config: &LiveConfig,
    live_partitions: &[LivePartition],
) -> Changes {
    let mut changes = Changes { qos: qos_changes(rendered, live_qos), ..Changes::default() };
    changes.problems.extend(missing_site_qos(rendered, live_qos));

    for line in &rendered.slurm_conf {
        let live = live_config.get(line.key);
        if let Some(value) = line.needed_change(live) {
            changes.slurm_conf.push(ConfChange {
                key: line.key,
                live: live.map(str::to_string),
                value,
                why: line.why.clone(),
            });
        }
    }
    changes.problems.extend(requeue_disabled(rendered, live_config));

    let find_partition = |name: &str| live_partitions.iter().find(|p| p.name == name);
    if let Some(fp) = &rendered.flexible_partition {
        match find_partition(&fp.name) {
            None => changes.partition = Some(PartitionChange::Missing { line: fp.line(), why: fp.why.clone() }),
            Some(live) if !live.qos.as_deref().is_some_and(|q| same_name(q, &fp.qos.name)) => {
                changes.partition = Some(PartitionChange::WrongQos {
                    name: fp.name.clone(),
                    live_qos: live.qos.clone(),
                    qos: fp.qos.name.clone(),
                })
            }
            Some(_) => {}
        }
    }
    let flexible_access = rendered.flexible_partition.as_ref().and_then(FlexiblePartition::access);
    for want in rendered.partition_access.iter().chain(flexible_access.as_ref()) {
        // A missing partition is reported below (or created whole above).
        let Some(live) = find_partition(&want.name) else { continue };
        if !live.allow_qos.as_ref().is_some_and(|l| same_names(&want.allow_qos, l)) {
            changes.access.push(AccessChange { live: live.allow_qos.clone(), want: want.clone() });
        }
    }
    changes.problems.extend(partitions_sharing_the_pool(rendered, live_partitions));
    for p in &rendered.pool_partitions {
        if find_partition(p).is_none() {
            changes.problems.push(
                Diagnostic::error(None, format!("the pool's partition {p:?} does not exist on the cluster"))
                    .help("define it in slurm.conf, or correct pool.partitions in the policy"),
            );
        }
    }
    changes
}

/// Partitions outside the pool on the pool's nodes: their jobs are left
/// alone by the plugin (no class, no cap, no preemption by the pool's QOS)
/// yet hold the pool's GPUs, so protected capacity can be taken there.
fn partitions_sharing_the_pool(rendered: &Rendered, live: &[LivePartition]) -> Vec<Diagnostic> {
    let in_pool = |name: &str| {
        rendered.partition_access.iter().any(|a| a.name == name)
            || rendered.pool_partitions.iter().any(|p| p == name)
            || rendered.flexible_partition.as_ref().is_some_and(|f| f.name == name)
    };
    // `ALL` (or a list that does not expand) stands for every node; a
    // partition without nodes shares none.
    let nodes = |p: &LivePartition| -> Option<Vec<String>> {
        let Some(n) = p.nodes.as_deref() else { return Some(Vec::new()) };
        if n.eq_ignore_ascii_case("ALL") {
            return None;
        }
        crate::hostlist::expand(n).ok()
    };
    // The site's pool partitions say where the pool's GPUs are; the
    // flexible partition is onepool's own and spans `pool.nodes` (by
    // default ALL, which would count every node).
    let site_pool = |name: &str| in_pool(name) && rendered.flexible_partition.as_ref().is_none_or(|f| f.name != name);
    let pool: Vec<Option<Vec<String>>> = live.iter().filter(|p| site_pool(&p.name)).map(nodes).collect();
    let mut out = Vec::new();
    for p in live.iter().filter(|p| !in_pool(&p.name)) {
        let mine = nodes(p);
        let shared: Vec<String> = match (&mine, pool.iter().any(Option::is_none)) {
            (None, _) => vec!["all nodes".into()],
            (Some(m), true) => m.clone(),
            (Some(m), false) => m.iter().filter(|n| pool.iter().flatten().any(|ps| ps.contains(n))).cloned().collect(),
        };
        if shared.is_empty() {
            continue;
        }
        out.push(
            Diagnostic::warning(
                None,
                format!(
                    "partition {} is not in the pool but shares its nodes ({}): jobs there reach the pool's GPUs outside onepool's classes, limits and preemption",
                    p.name,
                    shared.join(",")
                ),
            )
            .help("take the GPU nodes out of that partition, or add it to pool.partitions"),
        );
    }
    out
}

//! onepoold's replica settings against the policy Slurm enforces. The
//! policy decides what happens to a replica job (its class's QOS, GraceTime
//! and limits); onepoold only submits into it, so a mismatch would fail at
//! the worst moment: a drain timeout longer than the class's GraceTime gets
//! the replica killed mid-drain, a class that does not exist or has the
//! wrong tier gets every submission refused or unprotected. These are
//! checked at start-up, all at once.

use std::collections::BTreeMap;
use std::path::PathBuf;

use onepool_decisions::annotation::ReclaimMode;
use onepool_decisions::duration;
use onepool_decisions::policy::{self, Policy, Tier};

use onepool_router::classes::{Rank, RequestClasses};
use onepool_router::headroom::Headroom;

use crate::config::{Config, HeadroomConfig, PoolScope, ReplicaSettings};

/// Where the policy is: the configured path, else `$ONEPOOL_POLICY`, else
/// `onepool.toml` beside `slurm_conf`, else the default path.
pub fn policy_path(config: &Config) -> PathBuf {
    if let Some(p) = &config.policy {
        return p.clone();
    }
    let conf = config.slurm_conf.clone().or_else(|| std::env::var_os("SLURM_CONF").map(PathBuf::from));
    policy::locate(std::env::var_os(policy::PATH_ENV), conf.as_deref())
}

/// What is wrong (errors) and what deserves a look (warnings).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Findings {
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
}

pub fn check_endpoint(endpoint: &str, s: &ReplicaSettings, policy: &Policy) -> Findings {
    let mut f = Findings::default();
    let at = format!("endpoint {endpoint:?} [endpoint.replicas]");
    match policy.class(&s.baseline_workload) {
        None => f.errors.push(format!(
            "{at}: baseline_workload = {:?} is not a class of the policy (classes: {})",
            s.baseline_workload,
            policy.class_names().join(", ")
        )),
        Some(c) => {
            if let Tier::Protected { capacity } = c.tier {
                let room = u64::from(capacity.total());
                let need = (u64::from(s.min) + 1) * u64::from(s.gpus);
                if room < need {
                    f.warnings.push(format!(
                        "{at}: class {} protects {room} GPUs; renewing one of {} baseline replicas of {} GPUs before its time limit needs {need} at once, so the successor waits until the old one ends and the endpoint runs one baseline replica short meanwhile; to renew without that gap, reserve {need} GPUs for the class in the policy ([classes.{}] capacity = {{ reserved = {need}, ... }}), or lower gpus or min here",
                        c.name, s.min, s.gpus, c.name
                    ));
                }
            } else {
                f.errors.push(format!(
                    "{at}: baseline_workload = {:?} is a flexible class; baseline replicas need a protected one, or Slurm may preempt them",
                    c.name
                ));
            }
            check_size(&mut f, &at, "baseline", c.max_gpus_per_job, s, &c.name);
        }
    }
    match policy.class(&s.supplemental_workload) {
        None => f.errors.push(format!(
            "{at}: supplemental_workload = {:?} is not a class of the policy (classes: {})",
            s.supplemental_workload,
            policy.class_names().join(", ")
        )),
        Some(c) => {
            match c.tier {
                Tier::Protected { .. } => f.errors.push(format!(
                    "{at}: supplemental_workload = {:?} is a protected class; supplemental replicas borrow spare GPUs and must be in a flexible one",
                    c.name
                )),
                Tier::Flexible { reclaim: ReclaimMode::Immediate, .. } => f.warnings.push(format!(
                    "{at}: class {} is reclaimed immediately (GraceTime 0): requests in flight on a preempted replica fail; reclaim = \"graceful\" drains them",
                    c.name
                )),
                Tier::Flexible { grace_time, .. } if grace_time < s.drain_timeout => f.errors.push(format!(
                    "{at}: drain_timeout = {} is longer than class {}'s GraceTime ({}, its drain_timeout in the policy): Slurm would kill a preempted replica before its drain ends; lower drain_timeout here or raise the class's",
                    duration::format(s.drain_timeout),
                    c.name,
                    duration::format(grace_time)
                )),
                Tier::Flexible { .. } => {}
            }
            check_size(&mut f, &at, "supplemental", c.max_gpus_per_job, s, &c.name);
        }
    }
    if let Some(w) = &s.warm {
        check_warm(&mut f, &at, &w.workload, s, policy);
    }
    f
}

/// The warm class: what [`Policy::warm_class`] requires, and what depends
/// on the endpoint's own settings (its other classes, its drain timeout,
/// its replica size).
fn check_warm(f: &mut Findings, at: &str, workload: &str, s: &ReplicaSettings, policy: &Policy) {
    let c = match policy.warm_class(workload) {
        Ok(c) => c,
        Err(e) => {
            // A class that exists but is ranked wrong is still checked below.
            f.errors.push(format!("{at}: warm.workload = {e}"));
            match policy.class(workload) {
                Some(c) if !c.is_protected() => c,
                _ => return,
            }
        }
    };
    if workload == s.supplemental_workload || workload == s.baseline_workload {
        f.errors.push(format!("{at}: warm.workload = {workload:?} is also the baseline or supplemental class; give warm replicas a class of their own"));
    }
    match c.tier {
        Tier::Flexible { grace_time, reclaim, .. } if reclaim != ReclaimMode::Immediate && grace_time < s.drain_timeout => {
            f.errors.push(format!(
                "{at}: drain_timeout = {} is longer than warm class {}'s GraceTime ({}): Slurm would kill a warm replica carrying a burst before its drain ends; lower drain_timeout here or raise the class's",
                duration::format(s.drain_timeout),
                c.name,
                duration::format(grace_time)
            ))
        }
        _ => {}
    }
    check_size(f, at, "warm", c.max_gpus_per_job, s, &c.name);
}

/// Where a waiting job wants the pool's GPUs, and which waiting jobs are
/// warm replicas themselves (of any endpoint): for warm headroom.
pub fn pool_scope(config: &Config, policy: &Policy) -> PoolScope {
    let mut partitions = policy.pool.partitions.clone();
    partitions.extend(policy.pool.flexible_partition.clone());
    let mut warm_qos: Vec<String> = config
        .endpoints
        .iter()
        .filter_map(|e| e.replicas.as_ref()?.warm.as_ref())
        .filter_map(|w| Some(policy.class(&w.workload)?.qos.clone()))
        .collect();
    warm_qos.sort();
    warm_qos.dedup();
    PoolScope { partitions, warm_qos }
}

/// What onepoold takes from the policy at start, before anything is
/// submitted: each endpoint's immediate classes (whose replicas cut at
/// Slurm's SIGTERM, see [`ReplicaSettings::immediate_classes`]) and, for
/// warm headroom, the pool's scope. Without a readable, valid policy the
/// replicas drain at every SIGTERM (what `check` warns of), but warm
/// headroom cannot start.
pub fn resolve_from_policy(config: &mut Config) -> Result<(), String> {
    resolve_from_policy_as(config, onepool_os::getuid())
}

/// [`resolve_from_policy`] for onepoold running as `uid` (`--check` may
/// check for another user than the one running it).
pub fn resolve_from_policy_as(config: &mut Config, uid: u32) -> Result<(), String> {
    for e in &mut config.endpoints {
        let classes = wants_classes(e);
        let Some(r) = e.replicas.as_mut() else { continue };
        match r.lower_workload.as_deref() {
            Some("off") if !classes => r.lower_workload = None,
            Some(w) if !classes => {
                return Err(format!(
                    "endpoint {:?} [endpoint.replicas]: lower_workload = {w:?} is for request classes below the endpoint's own, and its requests have none (no API key names a class, no request_class)",
                    e.name
                ))
            }
            _ => {}
        }
    }
    let classes = config.endpoints.iter().any(wants_classes);
    if !config.endpoints.iter().any(|e| e.replicas.is_some()) && !classes {
        return Ok(());
    }
    let warm = config.endpoints.iter().any(|e| e.replicas.as_ref().is_some_and(|r| r.warm.is_some()));
    let path = policy_path(config);
    let policy = match std::fs::read_to_string(&path) {
        Ok(text) => policy::load(&text)
            .policy
            .ok_or_else(|| format!("{} has errors (run `onepool policy check {}`)", path.display(), path.display())),
        Err(e) => Err(format!("cannot read {}: {e}; set `policy` in onepoold's config", path.display())),
    };
    let policy = match (policy, warm, classes) {
        (Ok(p), _, _) => p,
        (Err(why), true, _) => {
            return Err(format!(
                "warm headroom needs the policy (the pool's partitions and the warm class's QOS): {why}"
            ))
        }
        (Err(why), false, true) => {
            return Err(format!("request classes (API keys that name a class, request_class) need the policy: {why}"))
        }
        (Err(_), false, false) => return Ok(()),
    };
    resolve_classes(config, &policy, &path, uid)?;
    let immediate: Vec<String> = policy
        .classes
        .iter()
        .filter(|c| matches!(c.tier, Tier::Flexible { reclaim: ReclaimMode::Immediate, .. }))
        .map(|c| c.name.clone())
        .collect();
    let scope = pool_scope(config, &policy);
    for r in config.endpoints.iter_mut().filter_map(|e| e.replicas.as_mut()) {
        r.immediate_classes = immediate.clone();
        if let Some(w) = r.warm.as_mut() {
            w.scope = scope.clone();
        }
    }
    Ok(())
}

/// Whether an endpoint serves requests by class (issue #44): its keys name
/// classes, or it names its own.
fn wants_classes(e: &crate::config::EndpointConfig) -> bool {
    !e.keyed_classes.is_empty() || e.request_class.is_some()
}

/// Each endpoint's request classes from the policy: protected classes
/// first (rank 0), then flexible ones by rank. A class a key names that the
/// policy lacks is an error at the key's line.
fn resolve_classes(
    config: &mut Config,
    policy: &onepool_decisions::policy::Policy,
    path: &std::path::Path,
    uid: u32,
) -> Result<(), String> {
    // Protected classes rank 0: ahead of every flexible one.
    let ranks: Vec<(String, u32)> = policy.classes.iter().map(|c| (c.name.clone(), c.rank().unwrap_or(0))).collect();
    let names = || ranks.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ");
    for e in config.endpoints.iter().filter(|e| !wants_classes(e)) {
        crate::engine_priority::resolve(e, None)?;
    }
    for e in config.endpoints.iter_mut().filter(|e| wants_classes(e)) {
        for (class, at) in &e.keyed_classes {
            let Some(c) = policy.class(class) else {
                return Err(format!(
                    "{at}: request class {class:?} is not a class of the policy {} (its classes: {})",
                    path.display(),
                    names()
                ));
            };
            entitled(c, uid, &format!("{at}: request class {class:?}"))?;
        }
        let own = e.request_class.clone().or_else(|| e.replicas.as_ref().map(|r| r.supplemental_workload.clone()));
        let Some(own) = own else {
            return Err(format!(
                "endpoint {:?}: its API keys name request classes; say the class of requests whose key names none (request_class = \"...\")",
                e.name
            ));
        };
        let Some(classes) = onepool_router::classes::RequestClasses::new(&own, ranks.clone()) else {
            return Err(format!(
                "endpoint {:?}: request_class {own:?} is not a class of the policy {} (its classes: {})",
                e.name,
                path.display(),
                names()
            ));
        };
        if let Some(c) = policy.class(&own) {
            entitled(c, uid, &format!("endpoint {:?}: its own request class {own:?}", e.name))?;
        }
        let own_rank = classes.rank(&own).unwrap_or_default().0;
        let headroom = headroom(&e.headroom, &classes, policy)?;
        let mut classes = classes.with_headroom(headroom);
        if let Some(p) = crate::engine_priority::resolve(e, Some(&classes))? {
            classes = classes.with_engine_priority(p);
        }
        e.proxy.classes = Some(std::sync::Arc::new(classes));
        if let Some(r) = e.replicas.as_mut() {
            r.lower_workload = lower_workload(&e.name, r, policy, own_rank, uid)?;
        }
    }
    Ok(())
}

/// An endpoint's ceilings by rank (issue #51): `share` for each class
/// below its own, a class's own where one is written. A protected class
/// has none (no class ranks above it), nor one outside the policy.
fn headroom(h: &HeadroomConfig, classes: &RequestClasses, policy: &Policy) -> Result<Headroom, String> {
    let mut ceilings: BTreeMap<Rank, f64> =
        classes.all().filter(|(_, rank)| classes.lower(*rank)).map(|(_, rank)| (rank, h.share)).collect();
    for (class, share, at) in &h.classes {
        let Some(rank) = classes.rank(class) else {
            return Err(format!(
                "{at}: {class:?} is not a class of the policy (classes: {})",
                policy.class_names().join(", ")
            ));
        };
        if policy.class(class).is_some_and(|c| c.is_protected()) {
            return Err(format!(
                "{at}: {class:?} is a protected class; nothing ranks above it, so it has no ceiling to leave headroom under"
            ));
        }
        ceilings.insert(rank, *share);
    }
    Ok(Headroom::new(ceilings, h.quiet))
}

/// An endpoint's ceilings, in a line for `onepoold --check`.
pub fn headroom_summary(endpoint: &str, classes: &RequestClasses) -> String {
    let Some(h) = classes.headroom() else {
        return format!("endpoint {endpoint:?}: none (every class may hold every slot)");
    };
    let name = |rank: Rank| classes.all().filter(|(_, r)| *r == rank).map(|(n, _)| n).collect::<Vec<_>>().join("/");
    let each: Vec<String> = h
        .ceilings()
        .iter()
        .map(|(rank, share)| format!("{} and below hold at most {:.0}%", name(*rank), share * 100.0))
        .collect();
    format!(
        "endpoint {endpoint:?}: of its own replicas' slots, while a class above has had requests within {:?}: {}",
        h.quiet(),
        each.join("; ")
    )
}

/// The class of the replicas for demand only request classes below the
/// endpoint's own bring (issue #44): the one named, else the flexible class
/// ranked next below the endpoint's own (its warm class aside). It must
/// rank below the endpoint's own, be one onepoold's user may submit in,
/// and let a replica drain within its GraceTime.
fn lower_workload(
    endpoint: &str,
    r: &ReplicaSettings,
    policy: &Policy,
    own: u32,
    uid: u32,
) -> Result<Option<String>, String> {
    let at = format!("endpoint {endpoint:?} [endpoint.replicas]");
    let warm = r.warm.as_ref().map(|w| w.workload.as_str());
    let class = match r.lower_workload.as_deref() {
        Some("off") => return Ok(None),
        Some(name) => {
            let Some(c) = policy.class(name) else {
                return Err(format!(
                    "{at}: lower_workload = {name:?} is not a class of the policy (classes: {})",
                    policy.class_names().join(", ")
                ));
            };
            if c.rank().is_none_or(|rank| rank <= own) {
                return Err(format!(
                    "{at}: lower_workload = {name:?} does not rank below the endpoint's own request class: replicas for the lower classes' demand must be reclaimed before the endpoint's own"
                ));
            }
            c
        }
        None => {
            let below = policy.classes.iter().filter(|c| c.rank().is_some_and(|rank| rank > own));
            match below.filter(|c| Some(c.name.as_str()) != warm).min_by_key(|c| c.rank()) {
                Some(c) => c,
                None => return Ok(None),
            }
        }
    };
    entitled(class, uid, &format!("{at}: lower_workload {:?}", class.name))?;
    if let Tier::Flexible { grace_time, reclaim, .. } = class.tier {
        if reclaim != ReclaimMode::Immediate && grace_time < r.drain_timeout {
            return Err(format!(
                "{at}: drain_timeout = {} is longer than lower_workload class {}'s GraceTime ({}): Slurm would kill a preempted replica before its drain ends",
                duration::format(r.drain_timeout),
                class.name,
                duration::format(grace_time)
            ));
        }
    }
    Ok(Some(class.name.clone()))
}

/// onepoold's own user, as job_submit/onepool's entitlement rule reads
/// users and groups (by NSS here: onepoold is no Slurm daemon).
struct OwnUser {
    uid: u32,
    name: String,
}

impl onepool_decisions::classify::Directory for OwnUser {
    fn user_name(&self, uid: u32) -> Option<&str> {
        (uid == self.uid).then_some(self.name.as_str())
    }

    fn in_group(&self, _uid: u32, gid: u32, group: &str) -> bool {
        onepool_os::group(group).is_some_and(|g| g.gid == gid || g.members.contains(&self.name))
    }
}

/// Whether onepoold's user (`uid`) may have work in `class`, by
/// job_submit/onepool's own rule ([`onepool_decisions::classify::entitled`]).
/// An entitlement by account alone cannot be told here (the account is
/// the job's, in Slurm's records): said in the log.
fn entitled(class: &onepool_decisions::policy::Class, uid: u32, what: &str) -> Result<(), String> {
    use onepool_decisions::classify::{self, Submitter};
    let Some(e) = &class.entitled else { return Ok(()) };
    let (user, gid) = onepool_os::user(uid).unwrap_or_else(|| (format!("uid {uid}"), u32::MAX));
    let own = OwnUser { uid, name: user.clone() };
    if classify::entitled(e, &own, Submitter { uid, gid }, None) {
        return Ok(());
    }
    if !e.accounts.is_empty() {
        tracing::warn!(
            "{what}: class {} entitles onepoold's user {user} only through its accounts ({}): onepoold's jobs must run under one of them",
            class.name,
            e.accounts.join(", ")
        );
        return Ok(());
    }
    Err(format!(
        "{what}: class {} does not entitle onepoold's user {user} (entitled: {}); entitle it in the policy or name another class",
        class.name,
        e.describe()
    ))
}

fn check_size(f: &mut Findings, at: &str, kind: &str, max: Option<u32>, s: &ReplicaSettings, class: &str) {
    let Some(max) = max else { return };
    let gpus = s.gpus;
    if max < gpus {
        f.errors.push(format!(
            "{at}: gpus = {gpus} is above class {class}'s max_gpus_per_job ({max}): every {kind} replica would be refused"
        ));
    } else if u64::from(max) < u64::from(gpus) * u64::from(s.replicas_per_job) {
        f.errors.push(format!(
            "{at}: replicas_per_job = {} of gpus = {gpus} asks for up to {} GPUs in one job, above class {class}'s max_gpus_per_job ({max}): {kind} jobs of more than {} replicas would be refused",
            s.replicas_per_job,
            gpus * s.replicas_per_job,
            max / gpus
        ));
    }
}

/// Checks every endpoint with replicas against the policy file. A missing
/// or unreadable policy is a warning (onepoold may run where the policy is
/// not installed); a policy with errors, or a mismatch, is an error.
pub fn check(config: &Config) -> Findings {
    let mut all = Findings::default();
    all.warnings.extend(crate::leader::warnings(config));
    for e in &config.endpoints {
        all.warnings.extend(crate::engine_priority::warnings(e));
    }
    let with_replicas: Vec<_> =
        config.endpoints.iter().filter_map(|e| e.replicas.as_ref().map(|r| (e.name.as_str(), r))).collect();
    if with_replicas.is_empty() {
        return all;
    }
    for (name, r) in &with_replicas {
        if r.transport == crate::config::ReplicaTransport::Plain {
            all.warnings.push(format!(
                "endpoint {name:?} [endpoint.replicas]: transport = \"plain\": onepoold's replica key and every prompt and answer cross the network between the router and the replicas in clear, readable to anyone on that network, who can then call the replicas with the key; remove the setting (TLS pinned to each launcher's certificate is the default)"
            ));
        }
    }
    let path = policy_path(config);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            all.warnings.push(format!(
                "cannot read the policy {} ({e}): replica settings not checked against it (set `policy` in onepoold's config)",
                path.display()
            ));
            return all;
        }
    };
    let loaded = policy::load(&text);
    let Some(p) = loaded.policy else {
        all.errors.push(format!(
            "the policy {} has errors (run `onepool policy check {}`)",
            path.display(),
            path.display()
        ));
        return all;
    };
    if p.pool.audit {
        all.errors.push(format!(
            "the policy {} is in audit mode (pool.audit = true): job_submit/onepool then records nothing on jobs, so onepoold could not recognise its own replica jobs; replica control needs audit = false",
            path.display()
        ));
    }
    for (name, s) in with_replicas {
        let f = check_endpoint(name, s, &p);
        all.errors.extend(f.errors.into_iter().map(|e| format!("{e} (policy {})", path.display())));
        all.warnings.extend(f.warnings);
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(extra: &str) -> ReplicaSettings {
        let c = crate::config::parse(
            "t.toml",
            &format!(
                "control_socket = \"/tmp/x.sock\"\n[[endpoint]]\nname = \"llm\"\nlisten = \"127.0.0.1:0\"\n[endpoint.replicas]\ncommand = \"x\"\n{extra}"
            ),
        )
        .unwrap();
        c.endpoints[0].replicas.clone().unwrap()
    }

    /// Issue #44: the classes an endpoint's keys name come from the policy,
    /// protected first, then flexible by rank; one the policy lacks is an
    /// error at its key's line.
    #[test]
    fn request_classes_resolve_from_the_policy_and_an_unknown_one_is_refused_at_its_line() {
        let policy = std::env::current_dir().unwrap().join("../etc/onepool.toml");
        let mut c = crate::config::parse(
            "t.toml",
            &format!(
                "control_socket = \"/tmp/x.sock\"\npolicy = \"{}\"\n[[endpoint]]\nname = \"llm\"\nlisten = \"127.0.0.1:0\"\nrequest_class = \"inference\"\n",
                policy.display()
            ),
        )
        .unwrap();
        c.endpoints[0].keyed_classes = vec![("agents".into(), "keys:3".into())];
        resolve_from_policy(&mut c).unwrap();
        let classes = c.endpoints[0].proxy.classes.clone().unwrap();
        assert_eq!(classes.own(), "inference");
        let ranks = ["inference-baseline", "training", "inference", "agents"].map(|n| classes.rank(n).unwrap().0);
        assert_eq!(ranks, [0, 1, 2, 3]);
        c.endpoints[0].keyed_classes.push(("gold".into(), "keys:7".into()));
        let e = resolve_from_policy(&mut c).unwrap_err();
        assert!(
            e.starts_with("keys:7: request class \"gold\" is not a class of the policy") && e.contains("agents"),
            "{e}"
        );
        c.endpoints[0].keyed_classes.pop();
        c.endpoints[0].request_class = None;
        let e = resolve_from_policy(&mut c).unwrap_err();
        assert!(e.contains("say the class of requests whose key names none"), "{e}");
    }

    /// Issue #51: each class below the endpoint's own gets the headroom
    /// share, a class named gets its own; a share outside 0 to 1 is an
    /// error at its value, a class the policy lacks or a protected one is
    /// refused.
    #[test]
    fn headroom_ceilings_resolve_by_rank_and_bad_ones_are_refused_where_written() {
        use onepool_router::classes::Rank;
        let policy = std::env::current_dir().unwrap().join("../etc/onepool.toml");
        let config = |headroom: &str| {
            crate::config::parse(
                "t.toml",
                &format!(
                    "control_socket = \"/tmp/x.sock\"\npolicy = \"{}\"\n[[endpoint]]\nname = \"llm\"\nlisten = \"127.0.0.1:0\"\nrequest_class = \"inference\"\n{headroom}",
                    policy.display()
                ),
            )
        };
        let ceilings = |c: &Config| {
            let h = c.endpoints[0].proxy.classes.as_ref().unwrap().headroom().cloned();
            h.map(|h| (h.ceilings().to_vec(), h.quiet()))
        };
        let mut c = config("").unwrap();
        resolve_from_policy(&mut c).unwrap();
        let ten = std::time::Duration::from_secs(10);
        assert_eq!(ceilings(&c), Some((vec![(Rank(3), 0.5)], ten)), "agents, below inference, at the default");
        let mut c =
            config("[endpoint.headroom]\nshare = 0.25\nquiet = \"30s\"\nclasses = { training = 0.75, agents = 1.0 }\n")
                .unwrap();
        resolve_from_policy(&mut c).unwrap();
        let want = (vec![(Rank(1), 0.75)], std::time::Duration::from_secs(30));
        assert_eq!(ceilings(&c), Some(want), "agents' 1.0 is no ceiling; training's own");
        let mut c = config("[endpoint.headroom]\nshare = 1\n").unwrap();
        resolve_from_policy(&mut c).unwrap();
        assert_eq!(ceilings(&c), None, "1 everywhere: no headroom kept");
        let e = config("[endpoint.headroom]\nshare = 1.5\n").unwrap_err().to_string();
        assert!(e.contains("t.toml:8:9: error: headroom.share = 1.5 is not a share of the slots"), "{e}");
        let e = config("[endpoint.headroom]\nclasses = { agents = -0.5 }\n").unwrap_err().to_string();
        assert!(e.contains("headroom.classes.agents = -0.5 is not a share"), "{e}");
        let mut c = config("[endpoint.headroom]\nclasses = { gold = 0.5 }\n").unwrap();
        let e = resolve_from_policy(&mut c).unwrap_err();
        assert!(e.contains("endpoint \"llm\" headroom.classes.gold: \"gold\" is not a class of the policy"), "{e}");
        let mut c = config("[endpoint.headroom]\nclasses = { inference-baseline = 0.5 }\n").unwrap();
        let e = resolve_from_policy(&mut c).unwrap_err();
        assert!(e.contains("is a protected class; nothing ranks above it"), "{e}");
    }

    /// Issue #44: replicas for the lower classes' demand go in the class
    /// ranked next below the endpoint's own, or the one named; a class
    /// that does not rank below, or one onepoold's user is not entitled
    /// to, is refused at start and by --check.
    #[test]
    fn the_lower_classes_replicas_class_resolves_and_entitlements_are_checked() {
        let policy = std::env::current_dir().unwrap().join("../etc/onepool.toml");
        let config = |replicas: &str| {
            let mut c = crate::config::parse(
                "t.toml",
                &format!(
                    "control_socket = \"/tmp/x.sock\"\npolicy = \"{}\"\n[[endpoint]]\nname = \"llm\"\nlisten = \"127.0.0.1:0\"\n[endpoint.replicas]\ncommand = \"x\"\n{replicas}",
                    policy.display()
                ),
            )
            .unwrap();
            c.endpoints[0].keyed_classes = vec![("agents".into(), "keys:3".into())];
            c
        };
        let lower = |c: &Config| c.endpoints[0].replicas.as_ref().unwrap().lower_workload.clone();
        let mut c = config("");
        resolve_from_policy_as(&mut c, 0).unwrap();
        assert_eq!(lower(&c).as_deref(), Some("agents"), "next below inference");
        let mut c = config("lower_workload = \"off\"");
        resolve_from_policy_as(&mut c, 0).unwrap();
        assert_eq!(lower(&c), None);
        let mut c = config("lower_workload = \"training\"");
        let e = resolve_from_policy_as(&mut c, 0).unwrap_err();
        assert!(e.contains("lower_workload = \"training\" does not rank below"), "{e}");
        let mut c = config("lower_workload = \"gold\"");
        let e = resolve_from_policy_as(&mut c, 0).unwrap_err();
        assert!(e.contains("lower_workload = \"gold\" is not a class of the policy"), "{e}");
        // Without request classes there is no lower class to serve.
        let mut c = config("lower_workload = \"agents\"");
        c.endpoints[0].keyed_classes.clear();
        let e = resolve_from_policy_as(&mut c, 0).unwrap_err();
        assert!(e.contains("its requests have none"), "{e}");
        // A key naming a class entitled to another user: refused for an
        // ordinary user (nobody), accepted for root.
        let mut c = config("");
        c.endpoints[0].keyed_classes.push(("inference-baseline".into(), "keys:9".into()));
        resolve_from_policy_as(&mut c, 0).unwrap();
        let nobody = onepool_os::user_id("nobody").unwrap_or(65534);
        let e = resolve_from_policy_as(&mut c, nobody).unwrap_err();
        assert!(
            e.starts_with("keys:9: request class \"inference-baseline\": class inference-baseline does not entitle onepoold's user")
                && e.contains("users onepool"),
            "{e}"
        );
    }

    fn shipped() -> Policy {
        policy::load(include_str!("../../etc/onepool.toml")).policy.unwrap()
    }

    /// The commented block starting at `header` in a shipped file, uncommented.
    fn commented(text: &str, header: &str) -> String {
        let start = text.find(&format!("# {header}")).unwrap_or_else(|| panic!("{header} in the sample"));
        text[start..].lines().map_while(|l| l.strip_prefix("# ")).map(|l| format!("{l}\n")).collect()
    }

    /// The shipped samples with their commented warm headroom taken in.
    fn shipped_with_warm() -> (Policy, ReplicaSettings) {
        let policy_text = include_str!("../../etc/onepool.toml");
        let text = format!("{policy_text}\n{}", commented(policy_text, "[classes.inference-warm]"));
        let p = policy::load(&text).policy.unwrap();
        let daemon = include_str!("../../etc/onepoold.toml");
        let warm = commented(daemon, "[endpoint.replicas.warm]");
        let at = daemon.find("\n[[listener]]").unwrap();
        let c =
            crate::config::parse("etc/onepoold.toml", &format!("{}\n{warm}{}", &daemon[..at], &daemon[at..])).unwrap();
        (p, c.endpoints[0].replicas.clone().unwrap())
    }

    /// Clear HTTP to the replicas is allowed, and warned about (onepoold
    /// logs it at start; `onepool doctor` shows `onepoold --check`'s
    /// warnings).
    #[test]
    fn a_plain_replica_transport_is_warned_about() {
        let warned = |extra: &str| {
            let c = crate::config::parse(
                "t.toml",
                &format!(
                    "control_socket = \"/tmp/x.sock\"\npolicy = \"/nonexistent/onepool.toml\"\n[[endpoint]]\nname = \"llm\"\nlisten = \"127.0.0.1:0\"\n[endpoint.replicas]\ncommand = \"x\"\n{extra}"
                ),
            )
            .unwrap();
            check(&c).warnings.iter().any(|w| w.contains("transport = \"plain\"") && w.contains("in clear"))
        };
        assert!(warned("transport = \"plain\"\n"));
        assert!(!warned(""));
        assert!(!warned("transport = \"tls\"\n"));
    }

    /// onepoold learns the immediate classes from the policy at start; a
    /// policy it cannot read leaves every replica draining at SIGTERM.
    #[test]
    fn the_policy_s_immediate_classes_reach_every_endpoint() {
        let dir = std::env::temp_dir().join(format!("onepool-resolve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("onepool.toml");
        std::fs::write(&path, include_str!("../../etc/onepool.toml")).unwrap();
        let text = |policy: &std::path::Path| {
            format!(
                "control_socket = \"/tmp/x.sock\"\npolicy = {:?}\n[[endpoint]]\nname = \"llm\"\nlisten = \"127.0.0.1:0\"\n[endpoint.replicas]\ncommand = \"x\"\n",
                policy.display().to_string()
            )
        };
        let mut c = crate::config::parse("t.toml", &text(&path)).unwrap();
        resolve_from_policy(&mut c).unwrap();
        assert_eq!(c.endpoints[0].replicas.as_ref().unwrap().immediate_classes, ["agents"]);
        let mut c = crate::config::parse("t.toml", &text(&dir.join("missing.toml"))).unwrap();
        resolve_from_policy(&mut c).unwrap();
        assert!(c.endpoints[0].replicas.as_ref().unwrap().immediate_classes.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_shipped_configs_agree() {
        let text = include_str!("../../etc/onepoold.toml");
        let c = crate::config::parse("etc/onepoold.toml", text).unwrap();
        let s = c.endpoints[0].replicas.as_ref().unwrap();
        let f = check_endpoint("chat", s, &shipped());
        assert_eq!(f, Findings::default());
    }

    #[test]
    fn a_drain_longer_than_the_grace_time_is_an_error() {
        let f = check_endpoint("llm", &settings("drain_timeout = \"90s\""), &shipped());
        assert_eq!(f.errors.len(), 1, "{f:?}");
        assert!(
            f.errors[0].starts_with("endpoint \"llm\" [endpoint.replicas]: drain_timeout = 1m30s is longer than class inference's GraceTime (1m,"),
            "{}",
            f.errors[0]
        );
    }

    #[test]
    fn unknown_classes_wrong_tiers_and_oversized_replicas_are_named() {
        let f = check_endpoint(
            "llm",
            &settings("baseline_workload = \"training\"\nsupplemental_workload = \"nope\"\ngpus = 8"),
            &shipped(),
        );
        assert_eq!(f.errors.len(), 2, "{f:?}");
        assert!(f.errors[0].contains("baseline_workload = \"training\" is a flexible class"), "{f:?}");
        assert!(f.errors[1].contains("supplemental_workload = \"nope\" is not a class of the policy (classes: critical-training, inference-baseline, training, inference, agents)"), "{f:?}");
        let f = check_endpoint("llm", &settings("gpus = 2\nreplicas_per_job = 3"), &shipped());
        assert!(
            f.errors.iter().any(|e| e.contains("replicas_per_job = 3 of gpus = 2 asks for up to 6 GPUs in one job")),
            "{:?}",
            f.errors
        );
        let f = check_endpoint("llm", &settings("gpus = 8"), &shipped());
        assert!(
            f.errors.iter().any(|e| e.contains("gpus = 8 is above class inference-baseline's max_gpus_per_job (4)")),
            "{f:?}"
        );
        let f = check_endpoint("llm", &settings("supplemental_workload = \"critical-training\""), &shipped());
        assert!(f.errors.iter().any(|e| e.contains("is a protected class; supplemental replicas")), "{f:?}");
    }

    #[test]
    fn immediate_reclaim_and_no_room_to_renew_are_warnings() {
        let f = check_endpoint("llm", &settings("supplemental_workload = \"agents\"\ngpus = 4"), &shipped());
        assert!(f.errors.is_empty(), "{f:?}");
        assert_eq!(f.warnings.len(), 2, "{f:?}");
        assert!(
            f.warnings[0]
                .contains("class inference-baseline protects 4 GPUs; renewing one of 1 baseline replicas of 4 GPUs"),
            "{f:?}"
        );
        assert!(
            f.warnings[0].contains("[classes.inference-baseline] capacity = { reserved = 8, ... }"),
            "the warning says what to change: {f:?}"
        );
        assert!(f.warnings[1].contains("class agents is reclaimed immediately (GraceTime 0)"), "{f:?}");
    }

    #[test]
    fn the_warm_class_must_be_flexible_and_outranked_by_every_other() {
        let warm =
            |w: &str| settings(&format!("max = 4\n[endpoint.replicas.warm]\nworkload = \"{w}\"\nreplicas = 1\n"));
        let s = settings("max = 4");
        assert!(s.warm.is_none());
        let (with_warm, s) = shipped_with_warm();
        assert_eq!(s.warm.as_ref().map(|w| (w.spec.replicas, w.spec.fraction)), Some((1, 0.5)));
        assert_eq!(check_endpoint("chat", &s, &with_warm), Findings::default(), "the samples' commented blocks agree");
        let f = check_endpoint("llm", &warm("inference-warm"), &shipped());
        assert!(f.errors[0].contains("warm.workload = \"inference-warm\" is not a class of the policy"), "{f:?}");
        let f = check_endpoint("llm", &warm("agents"), &with_warm);
        assert_eq!(f.errors.len(), 1, "{f:?}");
        assert!(
            f.errors[0]
                .contains("warm.workload = \"agents\" (rank 3) is not ranked below flexible class(es) inference-warm"),
            "{f:?}"
        );
        let f = check_endpoint("llm", &warm("inference-baseline"), &with_warm);
        assert!(f.errors[0].contains("is a protected class; warm replicas must be the first work"), "{f:?}");
        let f = check_endpoint(
            "llm",
            &settings("max = 4\ndrain_timeout = \"45s\"\n[endpoint.replicas.warm]\nreplicas = 1\n"),
            &with_warm,
        );
        assert_eq!(f.errors.len(), 1, "{f:?}");
        assert!(
            f.errors[0].contains("drain_timeout = 45s is longer than warm class inference-warm's GraceTime (30s)"),
            "{f:?}"
        );
    }

    #[test]
    fn the_pool_scope_names_the_pool_s_partitions_and_the_warm_qos() {
        let (p, s) = shipped_with_warm();
        let mut c = crate::config::parse("etc/onepoold.toml", include_str!("../../etc/onepoold.toml")).unwrap();
        c.endpoints[0].replicas = Some(s);
        let scope = pool_scope(&c, &p);
        assert_eq!(scope.partitions, ["gpu", "gpu-flex"]);
        assert_eq!(scope.warm_qos, ["op-inference-warm"]);
    }

    #[test]
    fn the_policy_is_found_beside_slurm_conf_unless_configured() {
        let mut c = crate::config::parse(
            "t.toml",
            "control_socket = \"/tmp/x.sock\"\nslurm_conf = \"/etc/slurm-x/slurm.conf\"\n[[endpoint]]\nname = \"e\"\nlisten = \"127.0.0.1:0\"\n",
        )
        .unwrap();
        if std::env::var_os(policy::PATH_ENV).is_none() {
            assert_eq!(policy_path(&c), PathBuf::from("/etc/slurm-x/onepool.toml"));
        }
        c.policy = Some("/srv/p.toml".into());
        assert_eq!(policy_path(&c), PathBuf::from("/srv/p.toml"));
    }

    /// Audit mode records nothing on jobs: replica control cannot run.
    #[test]
    fn a_policy_in_audit_mode_stops_replica_control_at_start() {
        let dir = std::env::temp_dir().join(format!("onepool-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("onepool.toml");
        let text = include_str!("../../etc/onepool.toml").replace("audit = false", "audit = true");
        std::fs::write(&path, text).unwrap();
        let mut c = crate::config::parse(
            "t.toml",
            "control_socket = \"/tmp/x.sock\"\n[[endpoint]]\nname = \"e\"\nlisten = \"127.0.0.1:0\"\n[endpoint.replicas]\ncommand = \"x\"\n",
        )
        .unwrap();
        c.policy = Some(path.clone());
        let f = check(&c);
        assert_eq!(f.errors.len(), 1, "{f:?}");
        assert!(f.errors[0].contains("is in audit mode (pool.audit = true)"), "{f:?}");
        std::fs::write(&path, include_str!("../../etc/onepool.toml")).unwrap();
        assert!(check(&c).errors.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! TOML text → [`Policy`], with every problem reported at once, each with
//! its place in the file and how to fix it.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::diag::Diagnostic;
use super::model::{Capacity, Class, Entitlement, Policy, Pool, Tier, TimeLimitRule};
use crate::annotation::ReclaimMode;
use crate::{duration, names};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    pool: Spanned<RawPool>,
    #[serde(default)]
    classes: BTreeMap<String, Spanned<RawClass>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    partitions: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    gpu_types: Vec<Spanned<String>>,
    total_gpus: Spanned<u32>,
    gpus_per_node: Option<Spanned<u32>>,
    default_class: Spanned<String>,
    min_runtime_before_reclaim: Option<Spanned<String>>,
    flexible_partition: Option<Spanned<String>>,
    nodes: Option<Spanned<String>>,
    #[serde(default)]
    audit: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClass {
    tier: Spanned<String>,
    rank: Option<Spanned<u32>>,
    qos: Spanned<String>,
    manage_qos: Option<bool>,
    #[serde(default)]
    partitions: Vec<Spanned<String>>,
    #[serde(default)]
    description: String,
    entitled: Option<Spanned<RawEntitled>>,
    max_gpus_per_job: Option<Spanned<u32>>,
    time_limit: Option<Spanned<RawTimeLimit>>,
    reclaim: Option<Spanned<String>>,
    drain_timeout: Option<Spanned<String>>,
    grace_time: Option<Spanned<String>>,
    capacity: Option<Spanned<RawCapacity>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawEntitled {
    #[serde(default)]
    accounts: Vec<String>,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTimeLimit {
    #[serde(default)]
    required: bool,
    default: Option<Spanned<String>>,
    max: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCapacity {
    #[serde(default)]
    lendable: u32,
    #[serde(default)]
    reserved: u32,
}

/// The outcome of loading: the policy if there were no errors, and every
/// diagnostic (warnings come with a policy too).
#[derive(Debug)]
pub struct Loaded {
    pub policy: Option<Policy>,
    pub diagnostics: Vec<Diagnostic>,
}

impl Loaded {
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| d.is_error())
    }
    /// All diagnostics as `file:line:col: severity: message` lines.
    pub fn render(&self, file: &str, source: &str) -> Vec<String> {
        self.diagnostics.iter().map(|d| d.render(file, source)).collect()
    }
}

struct Checker {
    diags: Vec<Diagnostic>,
}

impl Checker {
    fn error(&mut self, span: Range<usize>, msg: impl Into<String>, help: impl Into<String>) {
        self.diags.push(Diagnostic::error(Some(span), msg).help(help));
    }
    fn warn(&mut self, span: Range<usize>, msg: impl Into<String>, help: impl Into<String>) {
        self.diags.push(Diagnostic::warning(Some(span), msg).help(help));
    }
    fn duration(&mut self, v: &Option<Spanned<String>>, what: &str) -> Option<Duration> {
        let v = v.as_ref()?;
        match duration::parse(v.get_ref()) {
            Ok(d) => Some(d),
            Err(e) => {
                self.error(v.span(), format!("{what}: {e}"), "write it in one of the accepted forms");
                None
            }
        }
    }
}

/// Parses and checks a policy.
pub fn load(source: &str) -> Loaded {
    let raw: RawPolicy = match toml::from_str(source) {
        Ok(r) => r,
        Err(e) => {
            let msg = e.message().trim().to_string();
            let help = if msg.contains("unknown field") {
                "remove the key or fix its spelling"
            } else if msg.contains("missing field") {
                "add the key"
            } else if msg.contains("invalid type") {
                "give the value the type the message names"
            } else {
                "fix the TOML syntax"
            };
            return Loaded { policy: None, diagnostics: vec![Diagnostic::error(e.span(), msg).help(help)] };
        }
    };
    let mut ck = Checker { diags: Vec::new() };
    let pool = check_pool(&mut ck, &raw.pool);
    let mut classes = Vec::new();
    let mut qos_seen: HashSet<String> = HashSet::new();
    let mut ranks: BTreeMap<u32, String> = BTreeMap::new();
    if raw.classes.is_empty() {
        ck.diags.push(
            Diagnostic::error(None, "no workload class is defined").help("add at least one [classes.NAME] table"),
        );
    }
    // Uniqueness is checked on the raw tables, so a class with another
    // error still shows its clashes in the same run.
    for (name, class) in &raw.classes {
        let c = class.get_ref();
        if !qos_seen.insert(c.qos.get_ref().clone()) {
            ck.error(
                c.qos.span(),
                format!("QOS {:?} is used by two classes", c.qos.get_ref()),
                "give every class its own QOS",
            );
        }
        if let (Some(r), "flexible") = (&c.rank, c.tier.get_ref().as_str()) {
            if let Some(other) = ranks.insert(*r.get_ref(), name.clone()) {
                ck.error(
                    r.span(),
                    format!("rank {} is used by classes {other:?} and {name:?}", r.get_ref()),
                    "give every flexible class its own rank (1 = highest)",
                );
            }
        }
        if let Some(c) = check_class(&mut ck, name, class, pool.as_ref()) {
            classes.push(c);
        }
    }
    if let Some(pool) = &pool {
        check_pool_against_classes(&mut ck, &raw, pool, &classes);
    }
    classes.sort_by_key(|c| (c.rank().map_or(0, |r| r + 1), c.name.clone()));
    let has_errors = ck.diags.iter().any(|d| d.is_error());
    ck.diags.sort_by_key(|d| (d.span.as_ref().map_or(0, |s| s.start), d.severity));
    Loaded { policy: if has_errors { None } else { pool.map(|pool| Policy { pool, classes }) }, diagnostics: ck.diags }
}

fn check_pool(ck: &mut Checker, raw: &Spanned<RawPool>) -> Option<Pool> {
    let p = raw.get_ref();
    if p.partitions.get_ref().is_empty() {
        ck.error(
            p.partitions.span(),
            "the pool lists no partition",
            "name the partition(s) whose GPUs the pool covers",
        );
    }
    if *p.total_gpus.get_ref() == 0 {
        ck.error(p.total_gpus.span(), "total_gpus is 0", "give the number of GPUs in the pool's partitions");
    }
    if let Some(n) = &p.gpus_per_node {
        if *n.get_ref() == 0 || n.get_ref() > p.total_gpus.get_ref() {
            ck.error(
                n.span(),
                format!("gpus_per_node {} is not between 1 and total_gpus ({})", n.get_ref(), p.total_gpus.get_ref()),
                "give the GPUs of the pool's largest node (Slurm gives an --exclusive job all of them)",
            );
        }
    }
    let min_runtime = ck.duration(&p.min_runtime_before_reclaim, "min_runtime_before_reclaim");
    let mut ok = true;
    if p.min_runtime_before_reclaim.is_some() && min_runtime.is_none() {
        ok = false;
    }
    if let Some(fp) = &p.flexible_partition {
        if p.partitions.get_ref().iter().any(|q| q.get_ref() == fp.get_ref()) {
            ck.error(
                fp.span(),
                format!("flexible_partition {:?} is also one of the pool's partitions", fp.get_ref()),
                "use a separate partition over the same nodes, so its partition QOS caps only flexible jobs",
            );
        }
    }
    ok.then(|| Pool {
        partitions: p.partitions.get_ref().iter().map(|s| s.get_ref().clone()).collect(),
        gpu_types: p.gpu_types.iter().map(|s| s.get_ref().clone()).collect(),
        total_gpus: *p.total_gpus.get_ref(),
        gpus_per_node: p.gpus_per_node.as_ref().map(|n| *n.get_ref()),
        default_class: p.default_class.get_ref().clone(),
        min_runtime_before_reclaim: min_runtime.unwrap_or_default(),
        flexible_partition: p.flexible_partition.as_ref().map(|s| s.get_ref().clone()),
        nodes: p.nodes.as_ref().map(|s| s.get_ref().clone()).unwrap_or_else(|| "ALL".into()),
        audit: p.audit,
    })
}

fn valid_qos_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

fn check_class(ck: &mut Checker, n: &String, raw: &Spanned<RawClass>, pool: Option<&Pool>) -> Option<Class> {
    let c = raw.get_ref();
    let mut ok = check_class_names(ck, n, raw);
    let (time_limit, limits_ok) = check_time_limit(ck, n, c);
    ok &= limits_ok;
    if let (Some(cap), Some(pool)) = (&c.max_gpus_per_job, pool) {
        if *cap.get_ref() > pool.total_gpus {
            ck.warn(
                cap.span(),
                format!("class {n}: max_gpus_per_job {} exceeds the pool's {} GPUs", cap.get_ref(), pool.total_gpus),
                "lower it to at most total_gpus",
            );
        }
    }
    let entitled = c.entitled.as_ref().map(|e| {
        let e = e.get_ref();
        Entitlement { accounts: e.accounts.clone(), users: e.users.clone(), groups: e.groups.clone() }
    });
    let (tier, tier_ok) = match c.tier.get_ref().as_str() {
        "protected" => check_protected(ck, n, c, entitled.as_ref()),
        "flexible" => check_flexible(ck, n, c),
        other => {
            ck.error(c.tier.span(), format!("class {n}: {other:?} is not a tier"), "use \"protected\" or \"flexible\"");
            return None;
        }
    };
    (ok && tier_ok).then(|| Class {
        name: n.clone(),
        tier,
        qos: c.qos.get_ref().clone(),
        manage_qos: c.manage_qos.unwrap_or(true),
        match_partitions: c.partitions.iter().map(|s| s.get_ref().clone()).collect(),
        description: c.description.clone(),
        entitled,
        max_gpus_per_job: c.max_gpus_per_job.as_ref().map(|s| *s.get_ref()),
        time_limit,
    })
}

/// The class's own name and its QOS name; false when either is unusable.
fn check_class_names(ck: &mut Checker, n: &str, raw: &Spanned<RawClass>) -> bool {
    let c = raw.get_ref();
    let mut ok = true;
    if let Err(e) = names::check_class(n) {
        ck.error(raw.span(), e.to_string(), "rename the [classes.NAME] table");
        ok = false;
    }
    if !valid_qos_name(c.qos.get_ref()) {
        ck.error(
            c.qos.span(),
            format!("{:?} is not a valid QOS name", c.qos.get_ref()),
            "use letters, digits, '-', '_' or '.'",
        );
        ok = false;
    } else if c.qos.get_ref().eq_ignore_ascii_case(super::FLEXIBLE_CAP_QOS) {
        ck.error(
            c.qos.span(),
            format!("QOS {:?} is onepool's own partition QOS of the flexible partition", c.qos.get_ref()),
            "give the class another QOS",
        );
        ok = false;
    }
    ok
}

/// `time_limit`: its durations, and default within max; false when a
/// duration given did not parse.
fn check_time_limit(ck: &mut Checker, n: &str, c: &RawClass) -> (TimeLimitRule, bool) {
    let tl = c.time_limit.as_ref();
    let tl_default = tl.and_then(|t| ck.duration(&t.get_ref().default, "time_limit.default"));
    let tl_max = tl.and_then(|t| ck.duration(&t.get_ref().max, "time_limit.max"));
    if let (Some(d), Some(m), Some(t)) = (tl_default, tl_max, tl) {
        if d > m {
            ck.error(
                t.span(),
                format!(
                    "class {n}: time_limit.default ({}) exceeds time_limit.max ({})",
                    duration::format(d),
                    duration::format(m)
                ),
                "lower the default or raise the maximum",
            );
        }
    }
    if let Some(t) = tl {
        let t = t.get_ref();
        if t.required && t.default.is_some() {
            ck.warn(
                tl.unwrap().span(),
                format!("class {n}: time_limit.required is set, so time_limit.default is never used"),
                "drop one of them",
            );
        }
    }
    let parsed = !tl.is_some_and(|t| {
        (t.get_ref().default.is_some() && tl_default.is_none()) || (t.get_ref().max.is_some() && tl_max.is_none())
    });
    let rule = TimeLimitRule { required: tl.is_some_and(|t| t.get_ref().required), default: tl_default, max: tl_max };
    (rule, parsed)
}

/// A protected class: who is entitled and how many GPUs it protects; the
/// flexible-only keys refused.
fn check_protected(ck: &mut Checker, n: &str, c: &RawClass, entitled: Option<&Entitlement>) -> (Tier, bool) {
    let mut ok = true;
    for (key, present) in [
        ("rank", c.rank.as_ref().map(|s| s.span())),
        ("reclaim", c.reclaim.as_ref().map(|s| s.span())),
        ("drain_timeout", c.drain_timeout.as_ref().map(|s| s.span())),
        ("grace_time", c.grace_time.as_ref().map(|s| s.span())),
    ] {
        if let Some(span) = present {
            ck.error(
                span,
                format!("class {n} is protected, so `{key}` does not apply (protected work is never reclaimed)"),
                format!("remove `{key}`, or make the class flexible"),
            );
            ok = false;
        }
    }
    match &c.entitled {
        None => {
            ck.error(
                c.tier.span(),
                format!("protected class {n} does not say who is entitled to it"),
                "add entitled = { accounts = [...], users = [...], groups = [...] }",
            );
            ok = false;
        }
        Some(e) if entitled.is_some_and(|e| e.accounts.is_empty() && e.users.is_empty() && e.groups.is_empty()) => {
            ck.warn(
                e.span(),
                format!("protected class {n} entitles nobody"),
                "list the accounts, users or groups that own this capacity",
            );
        }
        Some(_) => {}
    }
    let capacity = match &c.capacity {
        Some(cap) => {
            let v = cap.get_ref();
            if v.lendable + v.reserved == 0 {
                ck.error(
                    cap.span(),
                    format!("protected class {n} protects 0 GPUs"),
                    "set capacity.lendable and/or capacity.reserved",
                );
                ok = false;
            }
            Capacity { lendable: v.lendable, reserved: v.reserved }
        }
        None => {
            ck.error(
                c.tier.span(),
                format!("protected class {n} has no capacity"),
                "add capacity = { lendable = N, reserved = M }",
            );
            ok = false;
            Capacity::default()
        }
    };
    (Tier::Protected { capacity }, ok)
}

/// A flexible class: its rank and how it is reclaimed, with drain and
/// grace times that Slurm can honour.
fn check_flexible(ck: &mut Checker, n: &str, c: &RawClass) -> (Tier, bool) {
    let mut ok = true;
    if let Some(cap) = &c.capacity {
        ck.error(
            cap.span(),
            format!("class {n} is flexible, so it has no protected capacity"),
            "remove `capacity`, or make the class protected",
        );
        ok = false;
    }
    let (rank, reclaim) = (flexible_rank(ck, n, c, &mut ok), reclaim_mode(ck, n, c, &mut ok));
    let drain = ck.duration(&c.drain_timeout, "drain_timeout");
    let grace = ck.duration(&c.grace_time, "grace_time");
    let drain_timeout = match (reclaim, &c.drain_timeout, drain) {
        (ReclaimMode::Immediate, Some(d), _) => {
            ck.error(
                d.span(),
                format!("class {n} is reclaimed immediately, so drain_timeout never applies"),
                "remove drain_timeout, or use reclaim = \"graceful\"",
            );
            ok = false;
            Duration::ZERO
        }
        (ReclaimMode::Immediate, None, _) => Duration::ZERO,
        (_, None, _) => {
            ck.error(
                c.reclaim.as_ref().unwrap().span(),
                format!("class {n} is reclaimed with a notice ({reclaim}) but has no drain_timeout"),
                "add drain_timeout = \"60s\" (how long the job may take to yield)",
            );
            ok = false;
            Duration::ZERO
        }
        (_, Some(_), None) => {
            ok = false;
            Duration::ZERO
        }
        (_, Some(_), Some(d)) => d,
    };
    if c.grace_time.is_some() && grace.is_none() {
        ok = false;
    }
    let grace_time = grace.unwrap_or(drain_timeout);
    if grace_time < drain_timeout {
        ck.error(
            c.grace_time.as_ref().unwrap().span(),
            format!(
                "class {n}: grace_time {} cannot honour drain_timeout {}: Slurm kills the job when GraceTime ends",
                duration::format(grace_time),
                duration::format(drain_timeout)
            ),
            "raise grace_time to at least drain_timeout, or drop it (it defaults to drain_timeout)",
        );
        ok = false;
    }
    if reclaim == ReclaimMode::Immediate && grace_time > Duration::ZERO {
        ck.warn(
            c.grace_time.as_ref().unwrap().span(),
            format!("class {n} is reclaimed immediately but has a grace_time"),
            "remove grace_time",
        );
    }
    (Tier::Flexible { rank, reclaim, drain_timeout, grace_time }, ok)
}

/// A flexible class's rank: 1 or more, and required.
fn flexible_rank(ck: &mut Checker, n: &str, c: &RawClass, ok: &mut bool) -> u32 {
    match &c.rank {
        Some(r) if *r.get_ref() >= 1 => *r.get_ref(),
        Some(r) => {
            ck.error(r.span(), format!("class {n}: rank must be 1 or more"), "1 is the highest flexible rank");
            *ok = false;
            0
        }
        None => {
            ck.error(
                c.tier.span(),
                format!("flexible class {n} has no rank"),
                "add rank = N (1 = first to get GPUs, last to yield them)",
            );
            *ok = false;
            0
        }
    }
}

/// How a flexible class yields: immediately unless it says otherwise.
fn reclaim_mode(ck: &mut Checker, n: &str, c: &RawClass, ok: &mut bool) -> ReclaimMode {
    match &c.reclaim {
        None => ReclaimMode::Immediate,
        Some(r) => match ReclaimMode::parse(r.get_ref()) {
            Some(m) => m,
            None => {
                ck.error(
                    r.span(),
                    format!("class {n}: {:?} is not a reclaim mode", r.get_ref()),
                    "use \"immediate\", \"graceful\" or \"requeue\"",
                );
                *ok = false;
                ReclaimMode::Immediate
            }
        },
    }
}

fn check_pool_against_classes(ck: &mut Checker, raw: &RawPolicy, pool: &Pool, classes: &[Class]) {
    let p = raw.pool.get_ref();
    let known: Vec<&str> = raw.classes.keys().map(String::as_str).collect();
    if !known.contains(&pool.default_class.as_str()) {
        ck.error(
            p.default_class.span(),
            format!("default_class {:?} is not a defined class", pool.default_class),
            format!("use one of: {}", known.join(", ")),
        );
    } else if classes.iter().any(|c| c.name == pool.default_class && c.is_protected()) {
        ck.warn(p.default_class.span(), format!("default_class {:?} is protected: every job that does not name a class is refused unless its owner is entitled", pool.default_class), "make the default a flexible class");
    }
    let mut protected_total: u32 = 0;
    let mut reserved_total: u32 = 0;
    for (name, class) in &raw.classes {
        let Some(c) = classes.iter().find(|c| &c.name == name) else {
            continue;
        };
        if let Tier::Protected { capacity } = c.tier {
            protected_total += capacity.total();
            reserved_total += capacity.reserved;
            if protected_total > pool.total_gpus {
                ck.error(
                    class.get_ref().capacity.as_ref().map(|s| s.span()).unwrap_or(class.span()),
                    format!("protected capacity adds up to {protected_total} GPUs (up to class {}), more than the pool's {} GPUs", c.name, pool.total_gpus),
                    "lower the protected capacities or raise total_gpus",
                );
            }
        }
    }
    if reserved_total > 0 && pool.flexible_partition.is_none() {
        ck.error(
            raw.pool.span(),
            format!(
                "{reserved_total} GPUs are reserved, but the pool has no flexible_partition to cap flexible jobs in"
            ),
            "add flexible_partition = \"NAME\" (a partition over the same nodes; render prints it)",
        );
    }
    let flexible_cap = pool.total_gpus.saturating_sub(reserved_total);
    for (name, class) in &raw.classes {
        let Some(c) = classes.iter().find(|c| &c.name == name) else { continue };
        if let (false, Some(cap), Some(span)) =
            (c.is_protected(), c.max_gpus_per_job, class.get_ref().max_gpus_per_job.as_ref().map(|s| s.span()))
        {
            if reserved_total > 0 && cap > flexible_cap {
                ck.warn(
                    span,
                    format!(
                        "class {name} allows {cap} GPUs per job, but flexible work may hold at most {flexible_cap} GPUs together ({reserved_total} are reserved): larger jobs would never start"
                    ),
                    format!("lower max_gpus_per_job to {flexible_cap} or less"),
                );
            }
        }
    }
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;

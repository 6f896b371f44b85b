//! The doctor's verdicts, one line each, from what was read off the
//! cluster. Pure, so that every rule is tested on canned inputs.

use onepool_decisions::policy::diag::Severity;
use onepool_decisions::render::conf::Want;
use onepool_decisions::render::live::{Changes, PartitionChange};
use onepool_decisions::render::{shell_line, Rendered};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Pass,
    Warn,
    Fail,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One line of the report: what was checked, the verdict, what was seen
/// and, unless it passed, what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub status: Status,
    pub what: String,
    pub detail: String,
    pub fix: Option<String>,
}

impl Check {
    pub fn pass(what: impl Into<String>, detail: impl Into<String>) -> Check {
        Check { status: Status::Pass, what: what.into(), detail: detail.into(), fix: None }
    }
    pub fn warn(what: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { status: Status::Warn, what: what.into(), detail: detail.into(), fix: Some(fix.into()) }
    }
    pub fn fail(what: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { status: Status::Fail, what: what.into(), detail: detail.into(), fix: Some(fix.into()) }
    }
    pub fn json(&self) -> Value {
        json!({"status": self.status.label().to_lowercase(), "check": self.what, "detail": self.detail, "fix": self.fix})
    }
}

/// Each slurm.conf setting the policy relies on. A mismatched
/// `PreemptExemptTime` only changes how long borrowers run before reclaim:
/// a warning; every other one breaks a guarantee or a graceful reclaim.
pub fn slurm_conf(rendered: &Rendered, changes: &Changes, live: impl Fn(&str) -> Option<String>) -> Vec<Check> {
    rendered
        .slurm_conf
        .iter()
        .map(|line| {
            let what = format!("slurm.conf {}", line.key);
            match changes.slurm_conf.iter().find(|c| c.key == line.key) {
                None => Check::pass(what, live(line.key).unwrap_or_else(|| line.value.clone())),
                Some(c) => {
                    let now = c.live.as_deref().unwrap_or("not set");
                    let detail = format!("{now}: {}", c.why);
                    let fix = format!(
                        "set {}={} in slurm.conf, then `scontrol reconfigure` (or restart slurmctld)",
                        c.key, c.value
                    );
                    if matches!(line.want, Want::Duration(_)) {
                        Check::warn(what, detail, fix)
                    } else {
                        Check::fail(what, detail, fix)
                    }
                }
            }
        })
        .collect()
}

/// Each class QOS (and the flexible partition's) against the policy:
/// Priority, Preempt, PreemptMode, GraceTime and the GPU limits.
pub fn qos(rendered: &Rendered, changes: &Changes) -> Vec<Check> {
    rendered
        .all_qos()
        .map(|spec| {
            let what = match &spec.class {
                Some(class) => format!("QOS {} (class {class})", spec.name),
                None => format!("QOS {} (flexible partition)", spec.name),
            };
            match changes.qos.iter().find(|c| c.name().eq_ignore_ascii_case(&spec.name)) {
                None => {
                    Check::pass(what, "Priority, Preempt, PreemptMode, GraceTime and limits as the policy renders them")
                }
                Some(c) => {
                    let detail = match c {
                        onepool_decisions::render::live::QosChange::Add(_) => "does not exist".to_string(),
                        onepool_decisions::render::live::QosChange::Modify { .. } => {
                            let command = c.command();
                            let wanted =
                                command.iter().skip_while(|w| *w != "set").skip(1).cloned().collect::<Vec<_>>();
                            format!("differs from the policy, which wants {}", wanted.join(" "))
                        }
                    };
                    Check::fail(what, detail, c.command().join(" "))
                }
            }
        })
        .collect()
}

/// The associations: every one lists the class QOS (else Slurm refuses
/// their jobs: "Invalid qos specification"), and onepoold's account exists.
/// `changes` carries `Changes::with_associations`'s result.
pub fn associations(rendered: &Rendered, changes: &Changes) -> Vec<Check> {
    let what = "associations' QOS lists";
    let grants = if changes.grants.is_empty() {
        Check::pass(what, "every association may use the class QOS")
    } else {
        let fix: Vec<String> = changes.grants.iter().map(|g| shell_line(&g.command())).collect();
        let detail: Vec<String> = changes.grants.iter().map(|g| g.why()).collect();
        Check::fail(what, detail.join("; "), fix.join(" && "))
    };
    let s = &rendered.service;
    let what = format!("onepoold's Slurm association {}/{}", s.account, s.user);
    let service = match &changes.service {
        None => Check::pass(what, "exists"),
        Some(s) => {
            let fix: Vec<String> = s.commands().iter().map(|c| shell_line(c.as_slice())).collect();
            Check::warn(what, "missing: onepoold cannot submit replica jobs", fix.join(" && "))
        }
    };
    vec![grants, service]
}

/// The pool's partitions: they exist, each lets only the pool's QOS run,
/// and the flexible partition caps what flexible work holds.
pub fn partitions(rendered: &Rendered, changes: &Changes) -> Vec<Check> {
    let mut out = Vec::new();
    for p in &rendered.pool_partitions {
        let what = format!("partition {p}");
        let missing = changes.problems.iter().find(|d| d.message.contains(&format!("partition {p:?}")));
        match (missing, changes.access.iter().find(|a| a.want.name == *p)) {
            (Some(d), _) => out.push(Check::fail(what, d.message.clone(), d.help.clone().unwrap_or_default())),
            (None, Some(a)) => {
                let now = a.live.as_ref().map_or("ALL".to_string(), |l| l.join(","));
                out.push(Check::fail(
                    what,
                    format!("AllowQos={now}: jobs in other QOS could run there outside the policy"),
                    a.want.instruction().trim().replace('\n', " "),
                ))
            }
            (None, None) => out.push(Check::pass(what, "exists; AllowQos as the policy renders it")),
        }
    }
    if let Some(flex) = &rendered.flexible_partition {
        let what = format!("partition {} (flexible)", flex.name);
        out.push(match &changes.partition {
            None => Check::pass(what, format!("exists with QOS={}", flex.qos.name)),
            Some(PartitionChange::Missing { line, why }) => {
                Check::fail(what, format!("missing: {why}"), format!("add to slurm.conf: {line}"))
            }
            Some(PartitionChange::WrongQos { name, live_qos, qos }) => Check::fail(
                what,
                format!("QOS={}: flexible jobs there are not capped", live_qos.as_deref().unwrap_or("N/A")),
                format!("add QOS={qos} to PartitionName={name} in slurm.conf"),
            ),
        });
    }
    out
}

/// Problems the rendering cannot fix that no line above covers (e.g. a
/// site QOS that must exist).
pub fn problems(rendered: &Rendered, changes: &Changes) -> Vec<Check> {
    changes
        .problems
        .iter()
        .filter(|d| !rendered.pool_partitions.iter().any(|p| d.message.contains(&format!("partition {p:?}"))))
        .map(|d| {
            let fix = d.help.clone().unwrap_or_else(|| "see the message".into());
            match d.severity {
                Severity::Error => Check::fail("cluster", d.message.clone(), fix),
                Severity::Warning => Check::warn("cluster", d.message.clone(), fix),
            }
        })
        .collect()
}

/// The plugstack line of onepool's SPANK plugin, from each file's text
/// (`include`d files too). Slurm acts on a failing SPANK prolog only for
/// a `required` plugin.
pub fn plugstack(files: &[(String, String)]) -> Check {
    let what = "plugstack spank_onepool.so";
    for (file, text) in files {
        for (n, line) in text.lines().enumerate() {
            let mut words = line.split_whitespace();
            let (Some(kind), Some(path)) = (words.next(), words.next()) else { continue };
            if kind.starts_with('#') || !path.ends_with("spank_onepool.so") {
                continue;
            }
            let at = format!("{file}:{}", n + 1);
            return match kind {
                "required" => Check::pass(what, format!("required at {at}")),
                "optional" => Check::fail(
                    what,
                    format!("optional at {at}: a node where it fails to load runs jobs without the GPU hand-off check and the workload options"),
                    format!("change `optional` to `required` at {at}"),
                ),
                other => Check::fail(what, format!("{other:?} at {at} is neither required nor optional"), format!("write `required {path}` at {at}")),
            };
        }
    }
    let read: Vec<&str> = files.iter().map(|(f, _)| f.as_str()).collect();
    Check::fail(
        what,
        format!("no line loads it (read: {})", if read.is_empty() { "nothing".into() } else { read.join(", ") }),
        "add `required /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_onepool.so` (its installed path) to plugstack.conf on every node",
    )
}

/// Whether the nodes track processes by cgroup while the GPU hand-off
/// check is on (issue #25). Under `proctrack/linuxproc` a process a job
/// started with `setsid` outlives the job and keeps its GPU open; nothing
/// proves whose it was, so the hand-off check drains the node instead of
/// killing it, and any user can drain every node so. Under
/// `proctrack/cgroup` Slurm ends such a process with its job, and
/// `task/cgroup` with `ConstrainDevices=yes` keeps a job off the GPUs it
/// was not given. A plugstack line with `gpu_source=none` turns the
/// hand-off check off; `gpu_source=fake:` is the dev cluster's test aid
/// (a warning there).
pub fn process_tracking(stack: &[(String, String)], config: impl Fn(&str) -> Option<String>) -> Check {
    let what = "process tracking";
    let line = stack.iter().flat_map(|(_, t)| t.lines()).find(|l| {
        let mut w = l.split_whitespace();
        matches!((w.next(), w.next()), (Some(k), Some(p)) if !k.starts_with('#') && p.ends_with("spank_onepool.so"))
    });
    let source = line.and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("gpu_source="))).unwrap_or("nvml");
    let proctrack = config("ProctrackType").unwrap_or_default();
    let task = config("TaskPlugin").unwrap_or_default();
    if source == "none" {
        return Check::pass(what, format!("{proctrack}; the GPU hand-off check is off (gpu_source=none)"));
    }
    let fix = "set ProctrackType=proctrack/cgroup and TaskPlugin=task/cgroup in slurm.conf and ConstrainDevices=yes in cgroup.conf on every node, then restart slurmd and slurmctld";
    if proctrack != "proctrack/cgroup" {
        let detail = format!(
            "ProctrackType={proctrack}: a process a job leaves behind (setsid) keeps its GPU open, and the GPU hand-off check drains the node instead of killing it"
        );
        return if source.starts_with("fake:") {
            Check::warn(what, format!("{detail} (gpu_source=fake: a test cluster)"), fix)
        } else {
            Check::fail(what, detail, fix)
        };
    }
    if !task.split(',').any(|t| t.trim() == "task/cgroup") {
        return Check::warn(
            what,
            format!("{proctrack}, but TaskPlugin={task}: jobs are not kept off the GPUs they were not given"),
            "add task/cgroup to TaskPlugin and set ConstrainDevices=yes in cgroup.conf",
        );
    }
    Check::pass(what, format!("{proctrack}, {task}"))
}

/// `major.minor.micro` of a `SLURM_VERSION_NUMBER`.
pub fn release(n: u32) -> String {
    format!("{}.{:02}.{}", n >> 16, (n >> 8) & 0xff, n & 0xff)
}

/// An installed plugin's build release against slurmctld's: Slurm
/// refuses a plugin whose major.minor differs.
pub fn plugin_release(name: &str, found: Result<(String, Option<u32>), String>, slurm: &str) -> Check {
    let what = format!("plugin {name}");
    let fix = format!(
        "install the onepool plugins built for Slurm {slurm}: rebuild them against this release's headers (docs/packages.md: Building the plugins for a site)"
    );
    match found {
        Err(e) => Check::fail(what, e, fix),
        Ok((path, None)) => Check::fail(what, format!("{path} exports no plugin_version: Slurm will not load it"), fix),
        Ok((path, Some(n))) => {
            let built = release(n);
            let major_minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
            if major_minor(&built) == major_minor(slurm) {
                Check::pass(what, format!("{path}, built for Slurm {built}; slurmctld runs {slurm}"))
            } else {
                Check::fail(
                    what,
                    format!("{path} was built for Slurm {built} but slurmctld runs {slurm}: Slurm refuses it"),
                    fix,
                )
            }
        }
    }
}

/// gres.conf's `AutoDetect` value, when set for every node.
pub fn autodetect(gres_conf: &str) -> Option<String> {
    gres_conf.lines().map(|l| l.split('#').next().unwrap_or("").trim()).find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim().eq_ignore_ascii_case("AutoDetect") && !l.contains(char::is_whitespace)).then(|| v.trim().to_string())
    })
}

/// The GPU device files of the nodes on this host (per node, from
/// `gres_conf::gpu_files`): each must exist and be a character device
/// (Slurm rejects regular files). `kind` says what a path is:
/// `Some(true)` a character device, `Some(false)` something else, `None`
/// missing.
pub fn gres_devices(
    gres_file: &str,
    auto: Option<&str>,
    here: &[(String, Result<Vec<String>, String>)],
    elsewhere: usize,
    kind: impl Fn(&str) -> Option<bool>,
) -> Vec<Check> {
    let mut out = Vec::new();
    let auto = auto.filter(|a| !a.eq_ignore_ascii_case("off"));
    if let Some(a) = auto {
        out.push(Check::pass(
            "gres.conf AutoDetect",
            format!("AutoDetect={a}: slurmd finds the GPUs itself (check `slurmd -G` on a node)"),
        ));
    }
    for (node, files) in here {
        let what = format!("gres.conf GPUs of {node}");
        let files = match files {
            Err(e) => {
                out.push(Check::fail(what, format!("{gres_file}: {e}"), format!("fix {gres_file}")));
                continue;
            }
            Ok(f) if f.is_empty() => {
                if auto.is_none() {
                    out.push(Check::warn(
                        what,
                        format!("no Name=gpu File= line for it in {gres_file}"),
                        "add `NodeName=<node> Name=gpu File=/dev/nvidia[0-N]`",
                    ));
                }
                continue;
            }
            Ok(f) => f,
        };
        let missing: Vec<&str> = files.iter().filter(|f| kind(f).is_none()).map(String::as_str).collect();
        let not_char: Vec<&str> = files.iter().filter(|f| kind(f) == Some(false)).map(String::as_str).collect();
        out.push(if !missing.is_empty() {
            Check::fail(
                what,
                format!("missing: {}", missing.join(", ")),
                format!("fix File= in {gres_file}, or load the driver that creates these device nodes"),
            )
        } else if !not_char.is_empty() {
            Check::fail(
                what,
                format!("not character devices: {}", not_char.join(", ")),
                format!("point File= in {gres_file} at the GPUs' device nodes (Slurm rejects regular files)"),
            )
        } else {
            Check::pass(what, format!("{} device file(s) present", files.len()))
        });
    }
    if elsewhere > 0 {
        out.push(Check::warn(
            "gres.conf GPUs of other hosts",
            format!("{elsewhere} node(s) run on other hosts: their device files cannot be seen from here"),
            "run `onepool doctor --local` on each node (e.g. through your configuration management)",
        ));
    }
    out
}

/// The config found at its default place while the policy is in audit mode.
pub fn daemon_during_audit(path: &str) -> Check {
    Check::warn(
        "onepoold config",
        format!("{path} not checked: the policy is in audit mode, where onepoold cannot run"),
        format!("after the trial (audit = false): onepool doctor --daemon-config {path}"),
    )
}

/// onepoold's own check of its config against the policy (`onepoold --check`).
pub fn daemon(config: Option<&str>, result: Option<Result<String, String>>) -> Check {
    let what = "onepoold config";
    match (config, result) {
        (None, _) | (_, None) => Check::warn(
            what,
            "no onepoold config here (not checked)",
            "pass --daemon-config FILE, or run the doctor on the host where onepoold runs",
        ),
        (Some(path), Some(Ok(out))) => {
            let verdict = format!("{path}: {}", out.lines().last().unwrap_or("fits").trim());
            // How each endpoint's answers continue elsewhere (issue #43),
            // its request classes (issue #44), their headroom and what the
            // engine is told of them (issue #51).
            let resume: Vec<&str> = out
                .lines()
                .filter_map(|l| {
                    ["resume: ", "classes: ", "headroom: ", "priority: "].iter().find_map(|p| l.strip_prefix(p))
                })
                .collect();
            let verdict = match resume.is_empty() {
                true => verdict,
                false => format!("{verdict}; {}", resume.join("; ")),
            };
            // What onepoold would start with but warns about (a plain
            // replica transport among them) is the doctor's warning too.
            let warnings: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("warning: ")).collect();
            if warnings.is_empty() {
                Check::pass(what, verdict)
            } else {
                Check::warn(
                    what,
                    format!("{verdict}: {}", warnings.join("; ")),
                    format!("each warning says what to change in {path}"),
                )
            }
        }
        (Some(path), Some(Err(out))) => {
            let errors: Vec<&str> = out.lines().filter(|l| l.starts_with("error: ")).collect();
            let detail = if errors.is_empty() { out.trim().to_string() } else { errors.join("; ") };
            Check::fail(
                what,
                format!("{path}: {detail}"),
                format!("fix {path} (each error names its key), then `onepoold --check --config {path}`"),
            )
        }
    }
}

/// Who holds onepoold's leadership lock (`[ha]`, docs/ha.md), as the
/// instance on this host sees it: FAIL when a connection that is not an
/// onepoold instance of this configuration holds it (then none acts).
pub fn leadership(state: Result<Option<onepool_control::api::Leadership>, String>) -> Check {
    let what = "onepoold lock";
    match state {
        Err(e) => Check::warn(what, format!("not checked: {e}"), "run the doctor on a host where onepoold runs"),
        Ok(None) => Check::warn(what, "onepoold says nothing of its leadership", "upgrade onepoold"),
        Ok(Some(l)) => match (&l.foreign_holder, l.acting, &l.acting_instance) {
            (Some(stranger), _, _) => Check::fail(
                what,
                format!(
                    "held by {stranger}, which is not an onepoold instance of this configuration (no proof made with \
                     the replica key): no instance acts on Slurm"
                ),
                "end that database connection (KILL on the server), and keep the replica key private (docs/ha.md)",
            ),
            (None, true, _) => Check::pass(what, format!("{} acts on Slurm", l.instance)),
            (None, false, Some(holder)) => Check::pass(what, format!("{} follows; acting: {holder}", l.instance)),
            (None, false, None) => Check::warn(
                what,
                format!(
                    "{} follows and no instance is seen acting{}",
                    l.instance,
                    l.last_error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default()
                ),
                "onepool status on each instance; the lock's database must be reachable (docs/ha.md)",
            ),
        },
    }
}

/// A serving preflight (`onepoold --preflight`): PASS with the time to the
/// first answer, FAIL with why the replica did not serve.
pub fn preflight(endpoint: &str, config: Option<&str>, result: Result<String, String>) -> Check {
    let what = format!("serving preflight of {endpoint}");
    match result {
        Ok(out) => {
            let answered = out.lines().find(|l| l.contains("first chat completion answered")).unwrap_or("").trim();
            let job = out.lines().next().unwrap_or("").trim();
            Check::pass(&what, format!("{job}; {answered}"))
        }
        Err(out) => {
            let detail =
                out.lines().map(str::trim_end).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("\n        ");
            let fix = match config {
                Some(c) => format!(
                    "fix what the replica's output says (the endpoint's [endpoint.replicas] command in {c}, the model server on the nodes), then run the preflight again"
                ),
                None => "pass --daemon-config FILE".to_string(),
            };
            Check::fail(&what, detail, fix)
        }
    }
}

/// The text report: one line per check, the fix under what did not pass.
pub fn text(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        out.push_str(&format!("{}  {}: {}\n", c.status.label(), c.what, c.detail));
        if let Some(fix) = &c.fix {
            out.push_str(&format!("      fix: {fix}\n"));
        }
    }
    let n = |s: Status| checks.iter().filter(|c| c.status == s).count();
    out.push_str(&format!("{} passed, {} warning(s), {} failed\n", n(Status::Pass), n(Status::Warn), n(Status::Fail)));
    out
}

pub fn json(checks: &[Check]) -> Value {
    let n = |s: Status| checks.iter().filter(|c| c.status == s).count();
    json!({
        "checks": checks.iter().map(Check::json).collect::<Vec<_>>(),
        "passed": n(Status::Pass),
        "warnings": n(Status::Warn),
        "failed": n(Status::Fail),
    })
}

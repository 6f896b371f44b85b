//! The slurm.conf settings onepool's design rests on, each with the reason
//! it is needed and the rule for deciding whether a live value already
//! satisfies it (sites keep their own plugins, flags and parameters).

use std::time::Duration;

use crate::policy::Policy;

/// One `Key=Value` line of the slurm.conf fragment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfLine {
    pub key: &'static str,
    pub value: String,
    /// One line printed as a comment above the setting.
    pub why: String,
    pub want: Want,
}

/// When a live value already does what onepool needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Equal to the rendered value (ASCII case ignored).
    Exactly,
    /// A comma-separated list holding every item; the site's other items
    /// stay, so `lua` becomes `lua,onepool`.
    Includes(&'static [Item]),
    /// A Slurm time, compared as a duration.
    Duration(Duration),
    /// Preemption by cancelling or requeueing (the cluster-wide default;
    /// every onepool QOS sets its own mode).
    CancelOrRequeue,
}

/// A list item and the items that imply it (Slurm sets implied flags too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item {
    pub name: &'static str,
    pub implied_by: &'static [&'static str],
}

const JOB_SUBMIT: &[Item] = &[Item { name: "onepool", implied_by: &["job_submit/onepool"] }];

const ENFORCE: &[Item] = &[
    Item { name: "associations", implied_by: &["all", "limits", "qos", "safe", "wckeys"] },
    Item { name: "limits", implied_by: &["all", "safe"] },
    Item { name: "qos", implied_by: &["all"] },
];

const CTLD_PARAMS: &[Item] = &[Item { name: "preempt_send_user_signal", implied_by: &[] }];

const STORE_FLAGS: &[Item] = &[Item { name: "job_comment", implied_by: &[] }];

const PROLOG_FLAGS: &[Item] = &[Item { name: "Alloc", implied_by: &["Contain"] }];

pub(super) fn lines(policy: &Policy) -> Vec<ConfLine> {
    let exempt = policy.pool.min_runtime_before_reclaim;
    let requeue = policy.classes.iter().any(|c| c.reclaim() == Some(crate::annotation::ReclaimMode::Requeue));
    let mode_why = if requeue {
        "cluster-wide default only: every onepool QOS sets its own PreemptMode, and requeue there needs batch jobs to be requeueable (JobRequeue=1, Slurm's default, or sbatch --requeue)"
    } else {
        "cluster-wide default only: every onepool QOS sets its own PreemptMode"
    };
    let line =
        |key, value: &str, why: &str, want| ConfLine { key, value: value.to_string(), why: why.to_string(), want };
    vec![
        line(
            "JobSubmitPlugins",
            "onepool",
            "onepool's slurmctld plugin classifies every job, sets its class QOS and routes flexible jobs",
            Want::Includes(JOB_SUBMIT),
        ),
        line(
            "PriorityType",
            "priority/multifactor",
            "QOS priority counts only with the multifactor priority plugin",
            Want::Exactly,
        ),
        line(
            "PriorityWeightQOS",
            "10000",
            "makes the class QOS priority dominate the job priority, so protected work is scheduled first",
            Want::Exactly,
        ),
        line(
            "PreemptType",
            "preempt/qos",
            "reclaim follows the class QOS Preempt lists, so Slurm keeps the guarantee even when onepool's daemon is down",
            Want::Exactly,
        ),
        line("PreemptMode", "CANCEL", mode_why, Want::CancelOrRequeue),
        line(
            "PreemptExemptTime",
            &slurm_time(exempt),
            "pool.min_runtime_before_reclaim: a borrower runs at least this long before it can be reclaimed, which stops expand/reclaim thrash",
            Want::Duration(exempt),
        ),
        line(
            "AccountingStorageEnforce",
            "associations,limits,qos",
            "without limits and qos Slurm does not enforce the QOS GPU limits (GrpTRES, MaxTRESPerJob)",
            Want::Includes(ENFORCE),
        ),
        line(
            "SlurmctldParameters",
            "preempt_send_user_signal",
            "a job selected for reclaim gets its --signal notice at once, at the start of its GraceTime, so it can drain or checkpoint",
            Want::Includes(CTLD_PARAMS),
        ),
        line(
            "AccountingStoreFlags",
            "job_comment",
            "slurmdbd keeps job comments, where onepool's replicas note what a reclaim's drain finished and cut and why a server died, for onepool report (comments become as visible as the job: PrivateData=jobs keeps them to their owners)",
            Want::Includes(STORE_FLAGS),
        ),
        line(
            "PrologFlags",
            "Alloc",
            "the prolog runs when GPUs are allocated, before the job's first step, so onepool's checks run before a job uses GPUs handed over from a reclaimed one",
            Want::Includes(PROLOG_FLAGS),
        ),
    ]
}

/// `[D-]HH:MM:SS`, a form every Slurm time parameter accepts.
pub fn slurm_time(d: Duration) -> String {
    let s = d.as_secs();
    let (days, h, m, s) = (s / 86_400, s / 3_600 % 24, s / 60 % 60, s % 60);
    if days > 0 {
        format!("{days}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// Items of a comma-separated live value; Slurm shows an unset list as
/// `(null)` or `none`.
pub(crate) fn list_items(live: &str) -> Vec<&str> {
    live.split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty() && !i.eq_ignore_ascii_case("(null)") && !i.eq_ignore_ascii_case("none"))
        .collect()
}

impl ConfLine {
    /// The value slurm.conf must get, given what the cluster runs with now
    /// (`None`: the key is unset); `None` when the live value already does.
    pub fn needed_change(&self, live: Option<&str>) -> Option<String> {
        let live = live.map(str::trim).filter(|v| *v != "(null)");
        match self.want {
            Want::Exactly => match live {
                Some(v) if v.eq_ignore_ascii_case(&self.value) => None,
                _ => Some(self.value.clone()),
            },
            Want::Includes(items) => {
                let have = list_items(live.unwrap_or(""));
                let has = |name: &str| have.iter().any(|h| h.eq_ignore_ascii_case(name));
                let missing: Vec<&str> = items
                    .iter()
                    .filter(|i| !has(i.name) && !i.implied_by.iter().any(|n| has(n)))
                    .map(|i| i.name)
                    .collect();
                if missing.is_empty() {
                    return None;
                }
                Some(have.into_iter().chain(missing).collect::<Vec<_>>().join(","))
            }
            Want::Duration(want) => {
                // -1 and NONE mean "no minimum", the same as 0.
                let live = live.and_then(|v| match v {
                    "-1" | "NONE" | "none" => Some(Duration::ZERO),
                    v => crate::duration::parse(v).ok(),
                });
                match live {
                    Some(d) if d == want => None,
                    _ => Some(self.value.clone()),
                }
            }
            Want::CancelOrRequeue => {
                let modes = list_items(live.unwrap_or(""));
                let has = |m: &str| modes.iter().any(|h| h.eq_ignore_ascii_case(m));
                if has("CANCEL") || has("REQUEUE") {
                    return None;
                }
                // GANG and WITHIN are independent of how jobs are preempted;
                // OFF and SUSPEND are what has to go.
                let keep = modes
                    .iter()
                    .filter(|m| m.eq_ignore_ascii_case("GANG") || m.eq_ignore_ascii_case("WITHIN"))
                    .copied();
                Some(std::iter::once(self.value.as_str()).chain(keep).collect::<Vec<_>>().join(","))
            }
        }
    }
}

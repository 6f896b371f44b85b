//! `[victims]`: what reclaimed batch jobs do next, per class of the
//! policy (model inputs; see the scenario's docs).

use std::collections::BTreeMap;

use onepool_decisions::duration::parse_seconds;
use onepool_decisions::policy::{Policy, Tier};
use serde::Deserialize;
use toml::Spanned;

use crate::engine::{Cancelled, VictimModel};

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVictims {
    cancelled: Option<Spanned<String>>,
    release_after: Option<Spanned<String>>,
    #[serde(default)]
    class: BTreeMap<Spanned<String>, RawVictimClass>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawVictimClass {
    cancelled: Option<Spanned<String>>,
    release_after: Option<Spanned<String>>,
}

pub(super) type SpanErr = (Option<std::ops::Range<usize>>, String);

/// The `[victims]` table, per class of the policy.
pub(super) fn victims(policy: &Policy, raw: &RawVictims) -> Result<Vec<VictimModel>, SpanErr> {
    let cancelled = |v: &Spanned<String>, key: &str| {
        Cancelled::parse(v.get_ref())
            .ok_or_else(|| (Some(v.span()), format!("{key} {:?}: use \"resubmit\" or \"drop\"", v.get_ref())))
    };
    let duration = |v: &Spanned<String>, key: &str| {
        parse_seconds(v.get_ref()).ok_or_else(|| {
            (Some(v.span()), format!("{key} {:?} is not a duration (e.g. \"30s\", \"2m\")", v.get_ref()))
        })
    };
    let all = VictimModel {
        cancelled: raw.cancelled.as_ref().map(|v| cancelled(v, "victims.cancelled")).transpose()?.unwrap_or_default(),
        release_after_s: raw.release_after.as_ref().map(|v| duration(v, "victims.release_after")).transpose()?,
    };
    let mut out = vec![all; policy.classes.len()];
    for (name, c) in &raw.class {
        let key = format!("victims.class.{}", name.get_ref());
        let Some(i) = policy.classes.iter().position(|k| k.name == *name.get_ref()) else {
            return Err((Some(name.span()), format!("{key}: the policy has no class {:?}", name.get_ref())));
        };
        let (mode, drain) = match policy.classes[i].tier {
            Tier::Protected { .. } => {
                return Err((Some(name.span()), format!("{key}: a protected class is never reclaimed")));
            }
            Tier::Flexible { reclaim, drain_timeout, .. } => (reclaim, drain_timeout),
        };
        if let Some(v) = &c.cancelled {
            if mode == onepool_decisions::annotation::ReclaimMode::Requeue {
                return Err((
                    Some(v.span()),
                    format!("{key}.cancelled: its jobs are requeued when reclaimed, never cancelled"),
                ));
            }
            out[i].cancelled = cancelled(v, &format!("{key}.cancelled"))?;
        }
        if let Some(v) = &c.release_after {
            if mode == onepool_decisions::annotation::ReclaimMode::Immediate {
                return Err((
                    Some(v.span()),
                    format!("{key}.release_after: its jobs are reclaimed immediately (no notice to act on)"),
                ));
            }
            let d = duration(v, &format!("{key}.release_after"))?;
            if d > drain.as_secs_f64() {
                return Err((
                    Some(v.span()),
                    format!(
                        "{key}.release_after {:?} is longer than the class's drain timeout ({} s): Slurm ends the job then",
                        v.get_ref(),
                        drain.as_secs()
                    ),
                ));
            }
            out[i].release_after_s = Some(d);
        }
    }
    Ok(out)
}

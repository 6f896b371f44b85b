//! What the slurmctld plugin records on each job, in `admin_comment` (which
//! users cannot change; `comment` can be forged), for the daemon and tools
//! to read back: `onepool:class=inference;tier=flexible;reclaim=graceful;drain=1m;endpoint=llm`.

use std::time::Duration;

use crate::annotation::ReclaimMode;
use crate::duration;

pub const PREFIX: &str = "onepool:";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    pub class: String,
    pub protected: bool,
    pub reclaim: Option<ReclaimMode>,
    pub drain_timeout: Option<Duration>,
    pub endpoint: Option<String>,
}

impl JobRecord {
    pub fn encode(&self) -> String {
        let mut s =
            format!("{PREFIX}class={};tier={}", self.class, if self.protected { "protected" } else { "flexible" });
        if let Some(r) = self.reclaim {
            s.push_str(&format!(";reclaim={r}"));
        }
        if let Some(d) = self.drain_timeout {
            s.push_str(&format!(";drain={}", duration::format(d)));
        }
        if let Some(e) = &self.endpoint {
            s.push_str(&format!(";endpoint={e}"));
        }
        s
    }

    /// Reads a record back; `None` when the comment is not ours or is damaged.
    pub fn decode(s: &str) -> Option<JobRecord> {
        let body = s.trim().strip_prefix(PREFIX)?;
        let mut r =
            JobRecord { class: String::new(), protected: false, reclaim: None, drain_timeout: None, endpoint: None };
        let mut tier_seen = false;
        for field in body.split(';') {
            let (k, v) = field.split_once('=')?;
            match k {
                "class" => r.class = v.to_string(),
                "tier" => {
                    r.protected = match v {
                        "protected" => true,
                        "flexible" => false,
                        _ => return None,
                    };
                    tier_seen = true;
                }
                "reclaim" => r.reclaim = Some(ReclaimMode::parse(v)?),
                "drain" => r.drain_timeout = Some(duration::parse(v).ok()?),
                "endpoint" => r.endpoint = Some(v.to_string()),
                _ => {} // newer writers may add fields
            }
        }
        (!r.class.is_empty() && tier_seen).then_some(r)
    }
}

/// What job_submit/onepool records in audit mode (`[pool] audit = true`),
/// where it changes nothing else: the placement or refusal it would have
/// made, in the job's `admin_comment`, so that `onepool report` counts the
/// trial from records no user can write (issue #42), not from log lines.
/// Its own prefix: no reader of [`JobRecord`] takes it for a class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditRecord {
    /// Would have placed the job in this class.
    Place { class: String },
    /// Would have refused it by this rule ([`crate::classify::Rule::name`]).
    Refuse { rule: String },
}

pub const AUDIT_PREFIX: &str = "onepool-audit:";

impl AuditRecord {
    pub fn encode(&self) -> String {
        match self {
            AuditRecord::Place { class } => format!("{AUDIT_PREFIX}would=place;class={class}"),
            AuditRecord::Refuse { rule } => format!("{AUDIT_PREFIX}would=refuse;rule={rule}"),
        }
    }

    /// `None` for anything else, a [`JobRecord`] included.
    pub fn decode(s: &str) -> Option<AuditRecord> {
        let body = s.trim().strip_prefix(AUDIT_PREFIX)?;
        let (mut would, mut class, mut rule) = (None, None, None);
        for field in body.split(';') {
            match field.split_once('=')? {
                ("would", v) => would = Some(v),
                ("class", v) => class = Some(v.to_string()),
                ("rule", v) => rule = Some(v.to_string()),
                _ => {}
            }
        }
        match would? {
            "place" => Some(AuditRecord::Place { class: class.filter(|c| !c.is_empty())? }),
            "refuse" => Some(AuditRecord::Refuse { rule: rule.filter(|r| !r.is_empty())? }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_audit_record_round_trips_and_is_never_a_class_record() {
        for a in [AuditRecord::Place { class: "training".into() }, AuditRecord::Refuse { rule: "not-entitled".into() }]
        {
            assert_eq!(AuditRecord::decode(&a.encode()), Some(a.clone()));
            assert_eq!(JobRecord::decode(&a.encode()), None, "{a:?}");
        }
        assert_eq!(AuditRecord::decode("onepool-audit:would=place;class="), None);
        assert_eq!(AuditRecord::decode("onepool:class=x;tier=flexible"), None);
    }

    #[test]
    fn round_trip() {
        let r = JobRecord {
            class: "inference".into(),
            protected: false,
            reclaim: Some(ReclaimMode::Graceful),
            drain_timeout: Some(Duration::from_secs(90)),
            endpoint: Some("llm".into()),
        };
        assert_eq!(r.encode(), "onepool:class=inference;tier=flexible;reclaim=graceful;drain=1m30s;endpoint=llm");
        assert_eq!(JobRecord::decode(&r.encode()), Some(r));
        assert_eq!(JobRecord::decode("something else"), None);
        assert_eq!(JobRecord::decode("onepool:class=x"), None);
    }
}

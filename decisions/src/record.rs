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

#[cfg(test)]
mod tests {
    use super::*;

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

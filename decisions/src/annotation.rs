//! Workload annotations: what a user says a job is (`--workload=training`
//! and friends). The SPANK plugin checks their syntax on the submit host and
//! passes them on through the job's SPANK environment; the slurmctld plugin
//! reads them back here, checks them again (the environment can be set by
//! any API client, not only our SPANK plugin) and decides.

use std::fmt;
use std::time::Duration;

use crate::{duration, names};

/// Longest value accepted for any annotation: keeps slurmctld's work and
/// log lines bounded whatever a client sends.
pub const MAX_VALUE_LEN: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReclaimMode {
    /// Cancelled at once when reclaimed (GraceTime 0).
    Immediate,
    /// A drain notice, then up to the drain timeout to finish in-flight work.
    Graceful,
    /// A checkpoint notice, then requeued.
    Requeue,
}

impl ReclaimMode {
    pub const ALL: [ReclaimMode; 3] = [ReclaimMode::Immediate, ReclaimMode::Graceful, ReclaimMode::Requeue];

    pub fn as_str(self) -> &'static str {
        match self {
            ReclaimMode::Immediate => "immediate",
            ReclaimMode::Graceful => "graceful",
            ReclaimMode::Requeue => "requeue",
        }
    }

    pub fn parse(s: &str) -> Option<ReclaimMode> {
        ReclaimMode::ALL.into_iter().find(|m| m.as_str() == s)
    }
}

impl fmt::Display for ReclaimMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The annotations, each with its command-line option and the environment
/// variable it travels in and is exported to the job as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Workload,
    Reclaim,
    DrainTimeout,
    Endpoint,
}

impl Key {
    pub const ALL: [Key; 4] = [Key::Workload, Key::Reclaim, Key::DrainTimeout, Key::Endpoint];

    /// The option name (`--workload`).
    pub fn option(self) -> &'static str {
        match self {
            Key::Workload => "workload",
            Key::Reclaim => "reclaim",
            Key::DrainTimeout => "drain-timeout",
            Key::Endpoint => "endpoint",
        }
    }

    /// The variable name (`ONEPOOL_WORKLOAD`), in the job's SPANK
    /// environment and in the tasks' environment.
    pub fn env(self) -> &'static str {
        match self {
            Key::Workload => "ONEPOOL_WORKLOAD",
            Key::Reclaim => "ONEPOOL_RECLAIM",
            Key::DrainTimeout => "ONEPOOL_DRAIN_TIMEOUT",
            Key::Endpoint => "ONEPOOL_ENDPOINT",
        }
    }

    pub fn arginfo(self) -> &'static str {
        match self {
            Key::Workload => "CLASS",
            Key::Reclaim => "immediate|graceful|requeue",
            Key::DrainTimeout => "DURATION",
            Key::Endpoint => "NAME",
        }
    }

    pub fn usage(self) -> &'static str {
        match self {
            Key::Workload => "onepool workload class of this job (e.g. training, inference, agents)",
            Key::Reclaim => "what happens when the GPUs are reclaimed: immediate, graceful (drain) or requeue",
            Key::DrainTimeout => "how long a graceful reclaim may drain (e.g. 90s, 5m)",
            Key::Endpoint => "marks the job as a replica of this inference endpoint",
        }
    }

    pub fn from_env(name: &str) -> Option<Key> {
        Key::ALL.into_iter().find(|k| k.env() == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    #[error("--{option}: the value is {len} bytes long; at most {MAX_VALUE_LEN} are accepted")]
    TooLong { option: &'static str, len: usize },
    #[error("--{option}: {source}")]
    Name {
        option: &'static str,
        #[source]
        source: names::NameError,
    },
    #[error("--reclaim: {value:?} is not a reclaim mode; use immediate, graceful or requeue")]
    Reclaim { value: String },
    #[error("--drain-timeout: {source}")]
    Duration {
        #[source]
        source: duration::DurationError,
    },
    #[error("--drain-timeout is only meaningful with --reclaim=graceful or requeue (got --reclaim=immediate)")]
    DrainWithImmediate,
}

/// A job's annotations, each syntactically valid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Annotation {
    pub workload: Option<String>,
    pub reclaim: Option<ReclaimMode>,
    pub drain_timeout: Option<Duration>,
    pub endpoint: Option<String>,
}

impl Annotation {
    /// Checks one value and stores it.
    pub fn set(&mut self, key: Key, value: &str) -> Result<(), AnnotationError> {
        if value.len() > MAX_VALUE_LEN {
            return Err(AnnotationError::TooLong { option: key.option(), len: value.len() });
        }
        let value = value.trim();
        match key {
            Key::Workload => {
                names::check_class(value).map_err(|source| AnnotationError::Name { option: key.option(), source })?;
                self.workload = Some(value.to_string());
            }
            Key::Endpoint => {
                names::check_endpoint(value)
                    .map_err(|source| AnnotationError::Name { option: key.option(), source })?;
                self.endpoint = Some(value.to_string());
            }
            Key::Reclaim => {
                self.reclaim = Some(
                    ReclaimMode::parse(value).ok_or_else(|| AnnotationError::Reclaim { value: value.to_string() })?,
                );
            }
            Key::DrainTimeout => {
                self.drain_timeout =
                    Some(duration::parse(value).map_err(|source| AnnotationError::Duration { source })?);
            }
        }
        Ok(())
    }

    /// Checks that the values make sense together.
    pub fn check_combination(&self) -> Result<(), AnnotationError> {
        if self.reclaim == Some(ReclaimMode::Immediate) && self.drain_timeout.is_some() {
            return Err(AnnotationError::DrainWithImmediate);
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        *self == Annotation::default()
    }

    /// Reads the annotations out of a job's SPANK environment (`NAME=value`
    /// entries; Slurm may prefix names with `SLURM_SPANK_`). Entries that are
    /// not ours are ignored; every bad one of ours is reported.
    pub fn from_spank_env<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Annotation, Vec<AnnotationError>> {
        let mut a = Annotation::default();
        let mut errors = Vec::new();
        for entry in entries {
            let Some((name, value)) = entry.split_once('=') else {
                continue;
            };
            let name = name.strip_prefix("SLURM_SPANK_").unwrap_or(name);
            if let Some(key) = Key::from_env(name) {
                if let Err(e) = a.set(key, value) {
                    errors.push(e);
                }
            }
        }
        if errors.is_empty() {
            if let Err(e) = a.check_combination() {
                errors.push(e);
            }
        }
        if errors.is_empty() {
            Ok(a)
        } else {
            Err(errors)
        }
    }

    /// The `(variable, value)` pairs for the SPANK/job environment.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        if let Some(w) = &self.workload {
            v.push((Key::Workload.env(), w.clone()));
        }
        if let Some(r) = self.reclaim {
            v.push((Key::Reclaim.env(), r.to_string()));
        }
        if let Some(d) = self.drain_timeout {
            v.push((Key::DrainTimeout.env(), duration::format(d)));
        }
        if let Some(e) = &self.endpoint {
            v.push((Key::Endpoint.env(), e.clone()));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_through_env() {
        let mut a = Annotation::default();
        a.set(Key::Workload, "inference").unwrap();
        a.set(Key::Reclaim, "graceful").unwrap();
        a.set(Key::DrainTimeout, "90s").unwrap();
        a.set(Key::Endpoint, "llama-70b").unwrap();
        let env: Vec<String> = a.to_env().iter().map(|(k, v)| format!("SLURM_SPANK_{k}={v}")).collect();
        let back = Annotation::from_spank_env(env.iter().map(String::as_str)).unwrap();
        assert_eq!(back, a);
    }

    #[test]
    fn foreign_entries_are_ignored_and_bad_ones_all_reported() {
        let r =
            Annotation::from_spank_env(["OTHER=1", "ONEPOOL_WORKLOAD=Bad Name", "ONEPOOL_RECLAIM=later", "garbage"]);
        let errs = r.unwrap_err();
        assert_eq!(errs.len(), 2);
        assert!(errs[0].to_string().starts_with("--workload: invalid workload class name"));
        assert_eq!(
            errs[1].to_string(),
            "--reclaim: \"later\" is not a reclaim mode; use immediate, graceful or requeue"
        );
    }

    #[test]
    fn oversized_value_is_refused_with_its_size() {
        let mut a = Annotation::default();
        let e = a.set(Key::Endpoint, &"x".repeat(5000)).unwrap_err();
        assert_eq!(e.to_string(), "--endpoint: the value is 5000 bytes long; at most 256 are accepted");
    }

    #[test]
    fn drain_timeout_with_immediate_is_contradictory() {
        let r = Annotation::from_spank_env(["ONEPOOL_RECLAIM=immediate", "ONEPOOL_DRAIN_TIMEOUT=5m"]);
        assert_eq!(r.unwrap_err(), vec![AnnotationError::DrainWithImmediate]);
    }

    proptest! {
        #[test]
        fn any_env_never_panics(entries in proptest::collection::vec(".{0,40}", 0..8)) {
            let _ = Annotation::from_spank_env(entries.iter().map(String::as_str));
        }
    }
}

//! Which runs are onepoold's replica jobs: the only ones whose launcher's
//! note (a drain's record, a server's end, in the job's comment) the
//! report reads (issue #35). A comment is its job's user's to write, and
//! any user may name a job `onepool-chat-0`; neither says whose replica a
//! job is. What no user can write is the job's uid and job_submit/onepool's
//! record in its AdminComment. So a replica job is one onepoold itself
//! would own (`owned()` in elastic-daemon/src/controller/sbatch.rs): a job
//! of onepoold's service user ([`SERVICE_USER`]) named
//! `onepool-ENDPOINT-SLOT`, whose record names that endpoint and one of its
//! replica classes, for an endpoint of onepoold's configuration with the
//! slot in its `port_range`. Without a configuration that loads, any
//! endpoint a record of the service user's job names counts, and the
//! report says so.

use std::path::Path;

use onepool_decisions::policy::SERVICE_USER;
use onepool_elastic_daemon::config::Config;
use onepool_launcher::conventions::port_from_name;

use super::records::Run;

#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaJobs {
    /// onepoold's endpoints that run replica jobs; `None`: its
    /// configuration was not read, any endpoint counts.
    endpoints: Option<Vec<Endpoint>>,
    /// The rule, in words, for the report (`replica_jobs`).
    pub said: String,
}

#[derive(Debug, Clone, PartialEq)]
struct Endpoint {
    name: String,
    /// Its baseline, supplemental and warm classes.
    classes: Vec<String>,
    /// `port_range`: the slots its replica jobs are named with (the last
    /// one excluded, as onepoold has it).
    slots: (u16, u16),
}

impl ReplicaJobs {
    /// From onepoold's configuration at `path` (`--daemon-config`), or
    /// without it when it is missing or does not load.
    pub fn read(path: &Path) -> ReplicaJobs {
        match onepool_elastic_daemon::config::load(path) {
            Ok(c) => ReplicaJobs::configured(&c, path),
            Err(_) if !path.exists() => ReplicaJobs::unconfigured(&format!("no {} (--daemon-config)", path.display())),
            Err(_) => ReplicaJobs::unconfigured(&format!(
                "{} does not load: onepoold --check --config {0} says why",
                path.display()
            )),
        }
    }

    /// The endpoints of onepoold's configuration (`path`).
    pub fn configured(config: &Config, path: &Path) -> ReplicaJobs {
        let endpoints: Vec<Endpoint> = config
            .endpoints
            .iter()
            .filter_map(|e| {
                let r = e.replicas.as_ref()?;
                let mut classes = vec![r.baseline_workload.clone(), r.supplemental_workload.clone()];
                classes.extend(r.warm.as_ref().map(|w| w.workload.clone()));
                Some(Endpoint { name: e.name.clone(), classes, slots: r.port_range })
            })
            .collect();
        let names: Vec<&str> = endpoints.iter().map(|e| e.name.as_str()).collect();
        let said = format!(
            "jobs of user {SERVICE_USER} that job_submit/onepool recorded as replicas of onepoold's endpoints in {} ({})",
            path.display(),
            if names.is_empty() { "none runs replica jobs".to_string() } else { names.join(", ") }
        );
        ReplicaJobs { endpoints: Some(endpoints), said }
    }

    /// Without onepoold's configuration (`why`): any endpoint.
    pub fn unconfigured(why: &str) -> ReplicaJobs {
        ReplicaJobs {
            endpoints: None,
            said: format!(
                "jobs of user {SERVICE_USER} that job_submit/onepool recorded as replicas of any endpoint ({why})"
            ),
        }
    }

    /// The endpoint `r` is a replica job of, if it is one.
    pub fn endpoint_of<'a>(&self, r: &'a Run) -> Option<&'a str> {
        if r.user != SERVICE_USER {
            return None;
        }
        let record = r.record.as_ref()?;
        let endpoint = record.endpoint.as_deref()?;
        let slot = port_from_name(endpoint, &r.name)?;
        let Some(endpoints) = &self.endpoints else { return Some(endpoint) };
        endpoints
            .iter()
            .any(|e| e.name == endpoint && slot >= e.slots.0 && slot < e.slots.1 && e.classes.contains(&record.class))
            .then_some(endpoint)
    }

    /// The runs as the report reads them: a launcher's note only on a
    /// replica job.
    pub fn notes_trusted(&self, runs: &[Run]) -> Vec<Run> {
        runs.iter()
            .map(|r| {
                let mut r = r.clone();
                if self.endpoint_of(&r).is_none() {
                    r.note = None;
                }
                r
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use onepool_decisions::record::JobRecord;

    use super::*;

    fn job(user: &str, name: &str, record: Option<&str>) -> Run {
        Run {
            id: "1".into(),
            name: name.into(),
            qos: "op-b".into(),
            state: "COMPLETED".into(),
            submit: 0.0,
            eligible: 0.0,
            start: 0.0,
            end: 1.0,
            gpus: 1,
            nodes: vec!["n1".into()],
            user: user.into(),
            record: record.and_then(JobRecord::decode),
            note: None,
        }
    }

    const CHAT: &str = "onepool:class=inference;tier=flexible;reclaim=graceful;drain=1m;endpoint=chat";

    #[test]
    fn only_the_service_user_s_recorded_replicas() {
        let any = ReplicaJobs::unconfigured("no /x.toml");
        assert_eq!(any.endpoint_of(&job("onepool", "onepool-chat-7", Some(CHAT))), Some("chat"));
        for (user, name, record) in [
            ("op-ana", "onepool-chat-7", Some(CHAT)),
            ("onepool", "onepool-chat-7", None),
            ("onepool", "onepool-code-7", Some(CHAT)),
            ("onepool", "train", Some(CHAT)),
            ("onepool", "onepool-chat-7", Some("onepool:class=inference;tier=flexible")),
        ] {
            assert_eq!(any.endpoint_of(&job(user, name, record)), None, "{user} {name} {record:?}");
        }
        assert!(any.said.contains("any endpoint (no /x.toml)"), "{}", any.said);
    }

    #[test]
    fn a_configured_endpoint_its_classes_and_slots() {
        let configured = ReplicaJobs {
            endpoints: Some(vec![Endpoint {
                name: "chat".into(),
                classes: vec!["inference-baseline".into(), "inference".into()],
                slots: (18000, 18999),
            }]),
            said: String::new(),
        };
        assert_eq!(configured.endpoint_of(&job("onepool", "onepool-chat-18007", Some(CHAT))), Some("chat"));
        for (name, record) in [
            ("onepool-chat-7", CHAT),
            ("onepool-code-18007", "onepool:class=inference;tier=flexible;endpoint=code"),
            ("onepool-chat-18007", "onepool:class=agents;tier=flexible;endpoint=chat"),
        ] {
            assert_eq!(configured.endpoint_of(&job("onepool", name, Some(record))), None, "{name} {record}");
        }
    }
}

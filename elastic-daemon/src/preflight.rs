//! `onepoold --preflight ENDPOINT` (issue #24): before onepoold goes live,
//! one replica of the endpoint submitted through Slurm exactly as onepoold
//! would submit it (its command, class, GPUs, the replica key), followed
//! until it answers one chat completion, then cancelled. An admin learns
//! how long a replica takes to serve on the cluster, or why it does not:
//! Slurm's end of the job, the server's signal or exit code and its last
//! output lines (the launcher's note in the job's comment).
//!
//! The job is named `onepool-preflight-<endpoint>`, which no replica
//! controller takes for one of its own (their names end in a slot number),
//! so a running onepoold neither routes to it nor cancels it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onepool_decisions::replicas::Kind;
use onepool_launcher::conventions::{ReplicaNote, REPLICA_KEY_ENV};
use onepool_router::backend_pool::{IdleConns, Transport};
use onepool_router::replica_client::Call;
use onepool_slurm_commands::adapter::{Commands, Slurm};
use onepool_slurm_commands::SystemRunner;

use crate::config::{Config, ReplicaSettings, ReplicaTransport};
use crate::controller::sbatch_args;

/// What a preflight saw, step by step, in seconds from the submission.
#[derive(Debug, Default)]
pub struct Preflight {
    pub job: u32,
    pub node: Option<String>,
    pub running: Option<f64>,
    pub listening: Option<(SocketAddr, f64)>,
    pub healthy: Option<f64>,
    /// The first answer's time and the model that gave it.
    pub answered: Option<(f64, String)>,
    /// Why it failed, if it did.
    pub failure: Option<String>,
}

impl Preflight {
    pub fn passed(&self) -> bool {
        self.failure.is_none() && self.answered.is_some()
    }

    /// One line per step, for the admin.
    pub fn report(&self, endpoint: &str) -> String {
        let mut out = format!("preflight of endpoint {endpoint}: replica job {}\n", self.job);
        let at = |t: Option<f64>| t.map_or("-".to_string(), |t| format!("{t:.1} s"));
        out.push_str(&format!("  running on {}: {}\n", self.node.as_deref().unwrap_or("-"), at(self.running)));
        match &self.listening {
            Some((a, t)) => out.push_str(&format!("  its launcher listening at {a}: {t:.1} s\n")),
            None => out.push_str("  its launcher listening: -\n"),
        }
        out.push_str(&format!("  healthy: {}\n", at(self.healthy)));
        match &self.answered {
            Some((t, model)) => out.push_str(&format!("  first chat completion answered ({model}): {t:.1} s\n")),
            None => out.push_str("  first chat completion answered: -\n"),
        }
        if let Some(f) = &self.failure {
            out.push_str("  FAILED: ");
            out.push_str(&f.replace('\n', "\n    | "));
            out.push('\n');
        }
        out
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    #[error("no endpoint {0:?} with [endpoint.replicas] in the configuration")]
    NoSuchEndpoint(String),
    #[error(transparent)]
    Key(#[from] crate::replica_key::KeyError),
    #[error("submitting the replica job: {0}")]
    Submit(String),
}

/// The job's name: not `onepool-<endpoint>-<slot>`, so no controller owns it.
pub fn job_name(endpoint: &str) -> String {
    format!("onepool-preflight-{endpoint}")
}

/// Submits one replica of `endpoint`, follows it for at most `timeout`
/// past its start (the endpoint's startup_timeout when `None`), and
/// cancels it whatever happened.
pub async fn run(config: &Config, endpoint: &str, timeout: Option<Duration>) -> Result<Preflight, PreflightError> {
    let e = config
        .endpoints
        .iter()
        .find(|e| e.name == endpoint && e.replicas.is_some())
        .ok_or_else(|| PreflightError::NoSuchEndpoint(endpoint.to_string()))?;
    let settings = e.replicas.as_ref().expect("filtered above");
    let health_path = e.health.as_ref().map_or("/health".to_string(), |h| h.path.clone());
    let key = crate::replica_key::load_or_create(&config.replica_key_file)?;
    let mut env: Vec<(String, String)> =
        config.slurm_conf.iter().map(|p| ("SLURM_CONF".to_string(), p.display().to_string())).collect();
    env.push((REPLICA_KEY_ENV.to_string(), key.clone()));
    let slurm = std::sync::Arc::new(Commands { runner: SystemRunner { timeout: Duration::from_secs(30), env } });
    let mut args = sbatch_args(endpoint, settings, Kind::Baseline, settings.port_range.0, 1);
    if let Some(i) = args.iter().position(|a| a == "-J") {
        args[i + 1] = job_name(endpoint);
    }
    let t0 = Instant::now();
    let submit = {
        let slurm = slurm.clone();
        tokio::task::spawn_blocking(move || {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            slurm.submit(&a)
        })
    };
    let job = match submit.await {
        Ok(Ok(job)) => job,
        Ok(Err(e)) => return Err(PreflightError::Submit(e.to_string())),
        Err(e) => return Err(PreflightError::Submit(e.to_string())),
    };
    let mut p = Preflight { job, ..Preflight::default() };
    let limit = timeout.unwrap_or(settings.startup_timeout);
    follow(&slurm, &mut p, settings, &health_path, &key, t0, limit).await;
    let cancel = slurm.clone();
    let _ = tokio::task::spawn_blocking(move || cancel.cancel(job, None)).await;
    Ok(p)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

async fn follow(
    slurm: &std::sync::Arc<Commands<SystemRunner>>,
    p: &mut Preflight,
    settings: &ReplicaSettings,
    health_path: &str,
    key: &str,
    t0: Instant,
    limit: Duration,
) {
    let fields: Vec<_> =
        http::HeaderValue::from_str(key).ok().map(|k| (onepool_router::REPLICA_KEY_HEADER, k)).into_iter().collect();
    let mut conns: Option<Arc<IdleConns>> = None;
    let secs = || t0.elapsed().as_secs_f64();
    // Waiting in the queue does not count against the limit: the pool may
    // be full, and Slurm's own reason is shown when it is what stops us.
    let mut started_at: Option<Instant> = None;
    let queue_limit = Duration::from_secs(600);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (s, job) = (slurm.clone(), p.job);
        let details = blocking(move || s.job_details(job)).await.and_then(Result::ok).flatten();
        let Some(d) = details else {
            p.failure = Some(format!("job {} left Slurm's table (MinJobAge) before it served", p.job));
            return;
        };
        match d.state.as_str() {
            "PENDING" | "CONFIGURING" => {
                if t0.elapsed() > queue_limit {
                    p.failure =
                        Some(format!("job {} still pending after {} s: {}", p.job, queue_limit.as_secs(), d.reason));
                    return;
                }
                continue;
            }
            "RUNNING" => {}
            _ => {
                let note = ReplicaNote::decode(&d.comment).unwrap_or_default();
                let server = note.ended.first().map(|(_, s)| s.as_str());
                let why = format!("job {} ended before it served: {}", p.job, d.ending());
                p.failure = Some(why + &crate::controller::launcher_end(&note, server));
                return;
            }
        }
        let started = *started_at.get_or_insert_with(Instant::now);
        p.running.get_or_insert_with(secs);
        if started.elapsed() > limit {
            p.failure = Some(format!(
                "job {} did not answer a chat completion within {} s of starting to run (startup_timeout {}); see the job's output file ({})",
                p.job,
                limit.as_secs(),
                onepool_decisions::duration::format(settings.startup_timeout),
                settings.output
            ));
            return;
        }
        if p.listening.is_none() {
            let slot = settings.port_range.0;
            let Some(note) = ReplicaNote::decode(&d.comment) else { continue };
            let Some(port) = note.port(slot) else { continue };
            let transport = match transport(settings, &note, slot) {
                Ok(Some(t)) => t,
                Ok(None) => continue,
                Err(e) => {
                    p.failure = Some(format!("cannot pin job {}'s certificate: {e}", p.job));
                    return;
                }
            };
            let Some((node, address)) = where_it_listens(slurm, p.job, port).await else { continue };
            p.node = Some(node);
            p.listening = Some((address, secs()));
            conns = Some(Arc::new(IdleConns::new(transport)));
        }
        let (Some((address, _)), Some(conns)) = (p.listening, conns.as_ref()) else { continue };
        if p.healthy.is_none() {
            let ok = get(conns, address, health_path, &fields, ANSWER_LIMIT).await.is_ok_and(|(s, _)| s.is_success());
            if !ok {
                continue;
            }
            p.healthy = Some(secs());
        }
        match chat(conns, address, &fields).await {
            Ok(model) => {
                p.answered = Some((secs(), model));
                return;
            }
            Err(e) => tracing::debug!("preflight chat completion: {e}"),
        }
    }
}

/// How the replica in `slot` is reached, as onepoold's router reaches it:
/// pinned to the certificate its launcher reported, unless the endpoint
/// says "plain"; `None` while the note has no fingerprint yet.
fn transport(settings: &ReplicaSettings, note: &ReplicaNote, slot: u16) -> Result<Option<Transport>, String> {
    match (settings.transport, note.pin(slot)) {
        (ReplicaTransport::Plain, _) => Ok(Some(Transport::Plain)),
        (ReplicaTransport::Tls, None) => Ok(None),
        (ReplicaTransport::Tls, Some(pin)) => {
            onepool_launcher::hop_tls::pinned_client(pin).map(|c| Some(Transport::Pinned(c)))
        }
    }
}

/// The node job `job` runs on and the address its launcher's `port` has
/// there (the node's NodeAddr, else its name resolved); `None` until
/// Slurm says where it runs.
async fn where_it_listens(
    slurm: &std::sync::Arc<Commands<SystemRunner>>,
    job: u32,
    port: u16,
) -> Option<(String, SocketAddr)> {
    let s = slurm.clone();
    let node = blocking(move || s.jobs().map(|js| js.into_iter().find(|j| j.job_id == job).map(|j| j.batch_host)))
        .await
        .and_then(Result::ok)
        .flatten()
        .filter(|n| !n.is_empty())?;
    let s = slurm.clone();
    let nodes = blocking(move || s.nodes()).await.and_then(Result::ok).unwrap_or_default();
    let host = nodes.iter().find(|n| n.name == node).map_or(node.clone(), |n| {
        if n.address.is_empty() {
            n.name.clone()
        } else {
            n.address.clone()
        }
    });
    let address = match host.parse::<IpAddr>() {
        Ok(ip) => Some(SocketAddr::new(ip, port)),
        Err(_) => tokio::net::lookup_host((host.as_str(), port)).await.ok().and_then(|mut a| a.next()),
    }?;
    Some((node, address))
}

/// The most of a replica's answer preflight reads: a model list or a
/// 4-token completion is a few kilobytes.
const ANSWER_LIMIT: usize = 1 << 20;

/// How long one of preflight's requests may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

async fn get(
    conns: &Arc<IdleConns>,
    address: SocketAddr,
    path: &str,
    fields: &[(http::HeaderName, http::HeaderValue)],
    limit: usize,
) -> Result<(http::StatusCode, bytes::Bytes), String> {
    onepool_router::replica_client::get(conns, address, path, fields, ASK_TIMEOUT, ASK_TIMEOUT, limit).await
}

/// The first model the replica lists, asked for a 4-token answer.
async fn chat(
    conns: &Arc<IdleConns>,
    address: SocketAddr,
    fields: &[(http::HeaderName, http::HeaderValue)],
) -> Result<String, String> {
    let (_, listed) = get(conns, address, "/v1/models", fields, ANSWER_LIMIT).await?;
    let models: serde_json::Value = serde_json::from_slice(&listed).unwrap_or_default();
    let model = models["data"][0]["id"].as_str().unwrap_or("default").to_string();
    let body =
        serde_json::json!({"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4});
    let mut fields = fields.to_vec();
    fields.push((http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json")));
    let body = body.to_string();
    let call = Call { method: "POST", path: "/v1/chat/completions", fields: &fields, body: body.as_bytes() };
    let (status, _) =
        onepool_router::replica_client::request(conns, address, call, ASK_TIMEOUT, ASK_TIMEOUT, ANSWER_LIMIT).await?;
    if !status.is_success() {
        return Err(format!("HTTP {status}"));
    }
    Ok(model)
}

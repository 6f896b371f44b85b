//! Starting and stopping the whole router from a [`Config`]: a proxy
//! listener per endpoint that has one, the shared (routed) listeners,
//! health checkers, the control socket and the
//! metrics listener. The binary and the integration tests share this.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use onepool_control::ControlError;
use onepool_router::access_log::AccessLog;
use onepool_router::endpoint::{Endpoint, QueueSettings};
use onepool_router::line_log::LineLog;
use onepool_router::metrics::Metrics;
use onepool_router::proxy::{BodyBudget, Dispatch, Target};
use onepool_router::settings::ConnSettings;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::control;
use crate::controller::{Controller, ControllerView, SharedSlurm};
use crate::inherited::{self, Inherited};
use crate::leader::mariadb::MariaDbLock;
use crate::leader::{Leadership, Pace};
pub use crate::routed::{RoutedEndpoint, Router};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("endpoint {endpoint:?}: cannot listen on {address}: {source}; is another process using it?")]
    Listen { endpoint: String, address: SocketAddr, source: std::io::Error },
    #[error("[[listener]]: cannot listen on {address}: {source}; is another process using it?")]
    SharedListen { address: SocketAddr, source: std::io::Error },
    #[error("metrics: cannot listen on {address}: {source}")]
    Metrics { address: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error("{0}")]
    Policy(String),
    #[error(transparent)]
    ReplicaKey(#[from] crate::replica_key::KeyError),
    #[error("access_log: cannot open {path}: {source}")]
    AccessLog { path: PathBuf, source: std::io::Error },
    #[error("decision_log: cannot open {path}: {source}")]
    DecisionLog { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Ha(#[from] crate::leader::mariadb::SetupError),
}

pub struct Daemon {
    pub router: Arc<Router>,
    pub metrics: Arc<Metrics>,
    /// The request body bytes requests in flight hold, and their limit.
    pub body_budget: Arc<BodyBudget>,
    pub metrics_address: Option<SocketAddr>,
    pub control_socket: PathBuf,
    /// The shared listeners' bound addresses, in configuration order.
    pub listeners: Vec<SocketAddr>,
    /// Whether this instance acts on Slurm (`[ha]`).
    pub leadership: Arc<Leadership>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Daemon {
    /// Binds every listener first, so a bad address fails the start
    /// before anything serves.
    pub async fn start(config: Config) -> Result<Daemon, StartError> {
        Daemon::start_with(config, Inherited::default()).await
    }

    /// [`Daemon::start`] on the sockets `inherited` holds where their
    /// addresses are configured (see [`crate::inherited`]).
    pub async fn start_with(mut config: Config, mut inherited: Inherited) -> Result<Daemon, StartError> {
        crate::policy_check::resolve_from_policy(&mut config).map_err(StartError::Policy)?;
        // Read before anything listens: a key nobody else may read, or no start.
        let replica_key = match config.needs_replica_key() {
            true => Some(crate::replica_key::load_or_create(&config.replica_key_file)?),
            false => None,
        };
        let metrics = Arc::new(Metrics::new());
        let (leadership, lock) = leadership(&config, replica_key.as_deref(), &metrics)?;
        let budget = BodyBudget::new(config.max_buffered_body_bytes, &metrics);
        let access = match &config.access_log {
            Some(a) => Some(
                AccessLog::start("access log", a.clone(), metrics.access_log_dropped.clone())
                    .map_err(|source| StartError::AccessLog { path: a.path.clone(), source })?,
            ),
            None => None,
        };
        let decision_log = match &config.decision_log {
            Some(d) => Some(
                LineLog::start("decision log", d.clone(), metrics.decision_log_dropped.clone())
                    .map_err(|source| StartError::DecisionLog { path: d.path.clone(), source })?,
            ),
            None => None,
        };
        let (tx, rx) = watch::channel(false);
        let Routes { mut endpoints, targets, mut listeners } =
            routes(&config, &mut inherited, replica_key.as_deref(), &metrics, &budget, &access).await?;
        let mut shared = Vec::new();
        for l in &config.listeners {
            let listener = inherited::bind(&mut inherited, l.listen)
                .await
                .map_err(|source| StartError::SharedListen { address: l.listen, source })?;
            shared.push(listener.local_addr().unwrap_or(l.listen));
            listeners.push((listener, Arc::new(Dispatch::routed(&l.routes, &targets, &budget)), l.conn.clone()));
        }
        inherited.close_unused();
        let metrics_listener = match config.metrics_address {
            Some(address) => {
                Some(TcpListener::bind(address).await.map_err(|source| StartError::Metrics { address, source })?)
            }
            None => None,
        };
        let metrics_address = metrics_listener.as_ref().and_then(|l| l.local_addr().ok());
        let control_listener = control::bind(&config.control_socket, config.control_socket_mode)?;
        let runs = controllers(&config, replica_key.as_deref(), &mut endpoints, decision_log.as_ref(), &leadership);
        let router = Arc::new(Router { endpoints, leadership: leadership.clone() });
        let serving = Serving { listeners, control: control_listener, metrics: metrics_listener };
        let mut tasks = spawn(&config, &router, runs, serving, &metrics, &rx);
        if let Some((lock, pace)) = lock {
            tasks.push(tokio::spawn(crate::leader::run(leadership.clone(), lock, pace, rx.clone())));
        }
        Ok(Daemon {
            router,
            metrics,
            body_budget: budget,
            metrics_address,
            control_socket: config.control_socket,
            listeners: shared,
            leadership,
            shutdown: tx,
            tasks,
        })
    }

    pub fn endpoint(&self, name: &str) -> Option<&RoutedEndpoint> {
        self.router.endpoints.get(name)
    }

    /// What the endpoint's replica controller did so far; `None` when the
    /// endpoint has no `[endpoint.replicas]`.
    pub fn replica_view(&self, name: &str) -> Option<ControllerView> {
        let view = self.router.endpoints.get(name)?.replica_jobs.as_ref()?;
        Some(view.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Stops accepting everywhere (replica jobs keep running; the next
    /// start re-adopts them), lets in-flight requests finish (each
    /// listener waits up to the configured grace), then returns.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        let _ = std::fs::remove_file(&self.control_socket);
    }
}

/// The lock's task to run, with `[ha] lock`.
type LockTask = Option<(MariaDbLock, Pace)>;

/// This instance's leadership, and with `[ha] lock` the lock's task to
/// run: a follower until it takes the lock. The lock's names are made
/// with `replica_key`, which every instance shares and nobody else may
/// read ([`crate::leader::names`]).
fn leadership(
    config: &Config,
    replica_key: Option<&str>,
    metrics: &Arc<Metrics>,
) -> Result<(Arc<Leadership>, LockTask), StartError> {
    let instance = &config.ha.instance;
    let Some(settings) = &config.ha.lock else {
        return Ok((Leadership::single(instance, Some(metrics.clone())), None));
    };
    for w in crate::leader::warnings(config) {
        tracing::warn!("{w}");
    }
    let Some(key) = replica_key else {
        unreachable!("Config::needs_replica_key holds with [ha] lock, and the key is read before")
    };
    let names = lock_names(config, settings, key)?;
    let site = names.site().to_string();
    let lock = MariaDbLock::new(settings, names)?;
    tracing::info!(%instance, lock = %site, database = %format!("{}:{}", settings.host, settings.port),
        "[ha]: following until this instance takes the lock (its name on the server is made with the replica key)");
    let pace = Pace { every: settings.check_interval, answer_within: settings.fence() };
    Ok((Leadership::shared(instance, settings.fence(), Some(metrics.clone())), Some((lock, pace))))
}

/// The lock's names: `[ha] lock_name` (else `onepoold.<ClusterName>`)
/// under the replica key.
fn lock_names(
    config: &Config,
    settings: &crate::config::LockSettings,
    replica_key: &str,
) -> Result<crate::leader::names::LockNames, StartError> {
    let site = match &settings.lock_name {
        Some(n) => n.clone(),
        None => crate::leader::mariadb::default_lock_name(config.slurm_conf.as_deref())
            .map_err(crate::leader::mariadb::SetupError::LockName)?,
    };
    Ok(crate::leader::names::LockNames::new(replica_key, &site))
}

/// A listener with what it serves and how.
type Listening = (TcpListener, Arc<Dispatch>, ConnSettings);

/// Each endpoint's router, its proxy target, and the listener of those
/// with an address of their own.
struct Routes {
    endpoints: BTreeMap<String, RoutedEndpoint>,
    targets: HashMap<String, Arc<Target>>,
    listeners: Vec<Listening>,
}

async fn routes(
    config: &Config,
    inherited: &mut Inherited,
    replica_key: Option<&str>,
    metrics: &Arc<Metrics>,
    budget: &Arc<BodyBudget>,
    access: &Option<Arc<AccessLog>>,
) -> Result<Routes, StartError> {
    let mut r = Routes { endpoints: BTreeMap::new(), targets: HashMap::new(), listeners: Vec::new() };
    for e in &config.endpoints {
        let listener = match e.listen {
            None => None,
            Some(address) => Some(inherited::bind(inherited, address).await.map_err(|source| StartError::Listen {
                endpoint: e.name.clone(),
                address,
                source,
            })?),
        };
        let listen = listener.as_ref().map(|l| l.local_addr()).transpose().ok().flatten().or(e.listen);
        let endpoint = Endpoint::new(
            &e.name,
            e.replica_concurrency,
            QueueSettings { size: e.queue_size, timeout: e.queue_timeout },
            e.thresholds,
            metrics.clone(),
        );
        if let (Some(key), true) = (replica_key, e.replicas.is_some() || config.replica_key_named) {
            if let Ok(v) = http::HeaderValue::from_str(key) {
                endpoint.set_replica_key(v);
            }
        }
        let routed = RoutedEndpoint {
            endpoint: endpoint.clone(),
            health_checked: e.health.is_some(),
            listen,
            replica_jobs: None,
        };
        r.endpoints.insert(e.name.clone(), routed);
        let target = Target::new(endpoint, e.proxy.clone(), metrics.clone(), budget.clone(), access.clone());
        r.targets.insert(e.name.clone(), target.clone());
        if let Some(l) = listener {
            r.listeners.push((l, Arc::new(Dispatch::Single(target)), e.proxy.conn()));
        }
    }
    Ok(r)
}

/// A replica controller per endpoint with `[endpoint.replicas]`, all on one
/// shared read of Slurm; each endpoint's router gets its controller's view.
fn controllers(
    config: &Config,
    replica_key: Option<&str>,
    endpoints: &mut BTreeMap<String, RoutedEndpoint>,
    decision_log: Option<&Arc<LineLog>>,
    leadership: &Arc<Leadership>,
) -> Vec<Controller> {
    let mut runs = Vec::new();
    if config.endpoints.iter().any(|e| e.replicas.is_some()) {
        let mut env: Vec<(String, String)> =
            config.slurm_conf.iter().map(|p| ("SLURM_CONF".to_string(), p.display().to_string())).collect();
        // To the replica jobs through sbatch's environment (the job's
        // user and root alone can read a job's environment; a command
        // line every user on this host can). Its digest only: the
        // environment crosses the network in Slurm's RPCs, in clear.
        if let Some(key) = &replica_key {
            let digest = onepool_launcher::access::digest_hex(key.as_bytes());
            env.push((onepool_launcher::conventions::REPLICA_KEY_DIGEST_ENV.to_string(), digest));
        }
        let runner = onepool_slurm_commands::SystemRunner { timeout: Duration::from_secs(30), env };
        // Controllers that poll within a quarter of the shortest poll
        // interval share one read of Slurm.
        let share = config
            .endpoints
            .iter()
            .filter_map(|e| e.replicas.as_ref().map(|r| r.poll_interval))
            .min()
            .unwrap_or_default()
            / 4;
        let commands = onepool_slurm_commands::adapter::Commands { runner };
        let slurm: SharedSlurm = Arc::new(onepool_slurm_commands::adapter::Coalesced::new(commands, share));
        for e in &config.endpoints {
            let Some(settings) = e.replicas.clone() else { continue };
            let Some(routed) = endpoints.get_mut(&e.name) else { continue };
            let (mut controller, view) =
                Controller::new(&e.name, routed.endpoint.clone(), routed.health_checked, settings, slurm.clone());
            if let Some(log) = decision_log {
                controller.set_decision_log(log.clone());
            }
            controller.set_leadership(leadership.clone());
            routed.replica_jobs = Some(view);
            runs.push(controller);
        }
    }
    runs
}

/// The sockets the daemon serves on besides the endpoints' own.
struct Serving {
    listeners: Vec<Listening>,
    control: tokio::net::UnixListener,
    metrics: Option<TcpListener>,
}

/// Every task of a running daemon: health checks, controllers, proxies (and
/// their certificates kept fresh), the control socket and the metrics.
fn spawn(
    config: &Config,
    router: &Arc<Router>,
    runs: Vec<Controller>,
    serving: Serving,
    metrics: &Arc<Metrics>,
    rx: &watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for e in &config.endpoints {
        if let Some(check) = e.health.clone() {
            let endpoint = router.endpoints[&e.name].endpoint.clone();
            tasks.push(tokio::spawn(onepool_router::health::run(endpoint, check, rx.clone())));
        }
    }
    for controller in runs {
        tasks.push(tokio::spawn(controller.run(rx.clone())));
    }
    for (listener, dispatch, conn) in serving.listeners {
        if let Some(tls) = conn.tls.clone() {
            let every = onepool_router::tls::RELOAD_EVERY;
            tasks.push(tokio::spawn(onepool_router::tls::keep_fresh(tls, every, rx.clone())));
        }
        let (metrics, rx, grace) = (metrics.clone(), rx.clone(), config.shutdown_grace);
        tasks.push(tokio::spawn(async move {
            onepool_router::proxy::serve(listener, dispatch, conn, &metrics, rx, grace).await
        }));
    }
    tasks.push(tokio::spawn(control::serve(serving.control, router.clone(), rx.clone())));
    if let Some(l) = serving.metrics {
        tasks.push(tokio::spawn(serve_metrics(l, metrics.clone(), config.metrics_auth.clone(), rx.clone())));
    }
    tasks
}

/// The metrics listener (loopback only). With `auth`, a scrape must carry
/// one of its bearer tokens: the metrics name every replica's address and
/// traffic, which other users of the host need not see (issue #25).
async fn serve_metrics(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    auth: Option<onepool_router::settings::BearerTokens>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = onepool_router::shutdown::stopped(&mut shutdown) => return,
        };
        let (metrics, auth) = (metrics.clone(), auth.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let (metrics, auth) = (metrics.clone(), auth.clone());
                async move {
                    if auth.as_ref().is_some_and(|a| !a.allows(req.headers())) {
                        let mut r = Response::new(Full::new(Bytes::from_static(b"a bearer token is required\n")));
                        *r.status_mut() = StatusCode::UNAUTHORIZED;
                        r.headers_mut()
                            .insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
                        return Ok::<_, Infallible>(r);
                    }
                    let mut r = if req.uri().path() == "/metrics" {
                        let mut r = Response::new(Full::new(Bytes::from(metrics.encode())));
                        r.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static(
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            ),
                        );
                        r
                    } else {
                        Response::new(Full::new(Bytes::from_static(b"metrics are at /metrics\n")))
                    };
                    if req.uri().path() != "/metrics" {
                        *r.status_mut() = StatusCode::NOT_FOUND;
                    }
                    Ok::<_, Infallible>(r)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

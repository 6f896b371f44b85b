//! Starting and stopping the cluster's daemons, in dependency order.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::error::{Error, IoContext, Result};
use crate::layout::{display, Layout};
use crate::process::{self, Tracked};
use crate::spec::Spec;
use crate::{policy_conf, templates, Cluster, PLUGINS};

const NVIDIA_MAJOR: u32 = 195;

pub(crate) fn service_names(spec: Option<&Spec>) -> Vec<String> {
    let mut v: Vec<String> = ["munged", "mariadbd", "slurmdbd", "slurmctld"].iter().map(|s| s.to_string()).collect();
    if let Some(spec) = spec {
        v.extend(spec.node_names().iter().map(|n| format!("slurmd-{n}")));
    }
    v
}

/// Commands each package provides, to tell whether it is installed without
/// asking dpkg about every one.
fn missing_packages() -> Vec<&'static str> {
    let probe: HashMap<&str, &str> = [
        ("slurmctld", "/usr/sbin/slurmctld"),
        ("slurmd", "/usr/sbin/slurmd"),
        ("slurm-client", "/usr/bin/sbatch"),
        ("slurmdbd", "/usr/sbin/slurmdbd"),
        ("libslurm-dev", "/usr/include/slurm/slurm.h"),
        ("munge", "/usr/sbin/munged"),
        ("mariadb-server", "/usr/sbin/mariadbd"),
        ("mariadb-client", "/usr/bin/mariadb"),
        ("procps", "/usr/bin/pgrep"),
    ]
    .into_iter()
    .collect();
    templates::packages().into_iter().filter(|p| probe.get(p).is_some_and(|path| !Path::new(path).exists())).collect()
}

pub(crate) fn ensure_packages(install: bool, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let missing = missing_packages();
    if missing.is_empty() {
        return Ok(());
    }
    let list = missing.join(" ");
    if !install || onepool_os::geteuid() != 0 {
        return Err(Error::Setup(format!(
            "missing Debian packages: {list}; install them with `apt-get install {list}`"
        )));
    }
    progress(&format!("installing {list} with apt-get"));
    let apt = |args: &[&str]| {
        process::run(
            Command::new("apt-get").args(args).env("DEBIAN_FRONTEND", "noninteractive"),
            Duration::from_secs(900),
        )
    };
    apt(&["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(templates::packages());
    apt(&args)?;
    Ok(())
}

/// Debian's plugin folder; Slurm's own plugins must stay on PluginDir.
fn slurm_plugin_dir() -> Result<PathBuf> {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/slurm-wlm",
        "/usr/lib/aarch64-linux-gnu/slurm-wlm",
        "/usr/lib64/slurm",
        "/usr/lib/slurm",
    ];
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("select_cons_tres.so").exists())
        .ok_or_else(|| Error::Setup(format!("no Slurm plugin folder found among {}", candidates.join(", "))))
}

/// Renders every config file; returns whether any of them changed.
pub(crate) fn write_configs(
    l: &Layout,
    spec: &Spec,
    policy: &onepool_decisions::policy::Policy,
    opts: &crate::options::UpOptions,
) -> Result<bool> {
    let dir = display(&l.root);
    let nodes: String = spec
        .node_names()
        .iter()
        .zip(&spec.slurmd_ports)
        .map(|(n, port)| {
            // The hosts mode: the node's name resolves (every namespace's
            // hosts file) and its address is its namespace's own.
            let (host, addr) = match spec.hosts.as_ref().and_then(|net| net.node_named(spec.nodes, n)) {
                Some(h) => (h.name, h.address.to_string()),
                None => ("localhost".to_string(), "127.0.0.1".to_string()),
            };
            format!(
                "NodeName={n} NodeHostname={host} NodeAddr={addr} Port={port} CPUs={} RealMemory={} Gres=gpu:{} State=UNKNOWN\n",
                spec.cpus_per_node, spec.memory_mb_per_node, spec.gpus_per_node
            )
        })
        .collect();
    let gpu_lines: String = spec
        .node_names()
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let first = i as u32 * spec.gpus_per_node;
            let last = first + spec.gpus_per_node - 1;
            format!("NodeName={n} Name=gpu File={dir}/dev/nvidia[{first}-{last}]\n")
        })
        .collect();
    let vars = vec![
        ("DIR", dir.clone()),
        ("CLUSTER", spec.cluster.clone()),
        ("PARTITION", spec.partition.clone()),
        ("CTLD_PORT", spec.ctld_port.to_string()),
        ("DBD_PORT", spec.dbd_port.to_string()),
        ("DB_PORT", spec.db_port.to_string()),
        ("DB_PASSWORD", spec.db_password.clone()),
        ("MUNGE_SOCKET", display(&l.munge_socket())),
        ("SLURM_PLUGIN_DIR", display(&slurm_plugin_dir()?)),
        ("NODES", nodes),
        ("GPU_LINES", gpu_lines),
    ];
    let text = |template: &str| templates::render(template, &vars).map_err(Error::Setup);
    let mut site = text(templates::SLURM_CONF)?;
    if let Some(net) = &spec.hosts {
        site = crate::hosts::slurm_conf(&site, net)?;
    }
    if let Some(p) = &opts.site_conf {
        site =
            policy_conf::override_settings(&site, &fs::read_to_string(p).ctx(|| format!("reading {}", p.display()))?);
    }
    let mut changed = false;
    if opts.cgroup {
        crate::cgroups::check_this_host()?;
        site = policy_conf::override_settings(&site, crate::cgroups::SLURM_SETTINGS);
        changed |= write_file(&l.cgroup_conf(), crate::cgroups::CGROUP_CONF, 0o644)?;
    } else if l.cgroup_conf().exists() {
        fs::remove_file(l.cgroup_conf()).ctx(|| "removing cgroup.conf".into())?;
        changed = true;
    }
    let (slurm_conf, policy_conf) = if opts.before_onepool {
        (site, policy_conf::BEFORE_ONEPOOL.to_string())
    } else {
        policy_conf::merge(&site, policy, opts.job_submit_plugins.as_deref())?
    };
    changed |= write_file(&l.slurm_conf(), &slurm_conf, 0o644)?;
    changed |= write_file(&l.policy_slurm_conf(), &policy_conf, 0o644)?;
    let mut dbd = text(templates::SLURMDBD_CONF)?;
    if let Some(net) = &spec.hosts {
        dbd = crate::hosts::slurmdbd_conf(&dbd, net);
    }
    changed |= write_file(&l.slurmdbd_conf(), &dbd, 0o600)?;
    changed |= write_file(&l.gres_conf(), &text(templates::GRES_CONF)?, 0o644)?;
    let plugstack =
        if opts.before_onepool { BEFORE_ONEPOOL_PLUGSTACK.to_string() } else { text(templates::PLUGSTACK_CONF)? };
    changed |= write_file(&l.plugstack_conf(), &plugstack, 0o644)?;
    let lua = match &opts.job_submit_lua {
        Some(p) => fs::read_to_string(p).ctx(|| format!("reading {}", p.display()))?,
        None => templates::JOB_SUBMIT_LUA.to_string(),
    };
    changed |= write_file(&l.job_submit_lua(), &lua, 0o644)?;
    Ok(changed)
}

const BEFORE_ONEPOOL_PLUGSTACK: &str =
    "# The site's plugstack.conf before onepool (`onepool-devcluster up --before-onepool`).\n";

/// Writes `text` unless the file already holds it; returns whether it changed.
fn write_file(path: &Path, text: &str, mode: u32) -> Result<bool> {
    if fs::read_to_string(path).ok().as_deref() == Some(text) {
        return Ok(false);
    }
    fs::write(path, text).ctx(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).ctx(|| format!("chmod {}", path.display()))?;
    Ok(true)
}

pub(crate) fn make_gpu_devices(l: &Layout, spec: &Spec) -> Result<()> {
    let procs = l.gpu_processes();
    // A cluster that starts afresh (no slurmd running) has nothing on its
    // GPUs: holders a test left behind (one that was killed before it
    // cleaned up) would otherwise be found again, by then under a reused
    // pid, and drain a node (seen on 26.05: "held by pid 562 (worker[4])").
    let fresh = spec.node_names().iter().all(|n| running(l, &format!("slurmd-{n}")).is_none());
    if !procs.exists() || fresh {
        let text = format!(
            "# Fake GPU source of this dev cluster: `<device minor> <pid>` per process on a GPU.\ngpus 0-{}\n",
            spec.nodes * spec.gpus_per_node - 1
        );
        fs::write(&procs, text).ctx(|| format!("writing {}", procs.display()))?;
    }
    // Root's alone, like NVML's view of a real node: a line written here
    // makes the hand-off check drain a node, and any user could (issue #25).
    // Set on every start, for clusters made when it was open to all.
    fs::set_permissions(&procs, fs::Permissions::from_mode(0o644)).ctx(|| "chmod gpu-processes".into())?;
    for minor in 0..spec.nodes * spec.gpus_per_node {
        let path = l.dev().join(format!("nvidia{minor}"));
        if path.exists() {
            // Readable and writable by all, as the driver makes
            // /dev/nvidiaN: only the devices cgroup (the cgroup mode) or
            // nothing stands between a job and a GPU it was not given.
            fs::set_permissions(&path, fs::Permissions::from_mode(0o666))
                .ctx(|| format!("chmod {}", path.display()))?;
            continue;
        }
        onepool_os::make_char_device(&path, 0o666, NVIDIA_MAJOR, minor).map_err(|source| Error::Io {
            what: format!("mknod {} c {NVIDIA_MAJOR} {minor} (needs root)", path.display()),
            source,
        })?;
        // mknod's mode went through the umask.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).ctx(|| format!("chmod {}", path.display()))?;
    }
    Ok(())
}

/// Copies the built plugins in; returns whether any changed. A fresh copy
/// (new inode) rather than an overwrite: a running daemon has the old file
/// mapped, and rewriting it in place would crash it.
pub(crate) fn install_plugins(l: &Layout, src: &Path) -> Result<bool> {
    let mut changed = false;
    for (built, slurm_name) in PLUGINS {
        let from = src.join(built);
        let bytes =
            fs::read(&from).ctx(|| format!("reading plugin {} (build it with `cargo build`)", from.display()))?;
        let to = l.plugins().join(slurm_name);
        if fs::read(&to).ok().as_deref() == Some(&bytes[..]) {
            continue;
        }
        let tmp = l.plugins().join(format!(".{slurm_name}.new"));
        fs::write(&tmp, &bytes).ctx(|| format!("writing {}", tmp.display()))?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).ctx(|| "chmod plugin".into())?;
        fs::rename(&tmp, &to).ctx(|| format!("installing {}", to.display()))?;
        changed = true;
    }
    Ok(changed)
}

fn running(l: &Layout, name: &str) -> Option<Tracked> {
    Tracked::read(&l.pid_file(name)).filter(|t| t.alive())
}

fn slurm_env(c: &mut Command, l: &Layout) {
    c.env("SLURM_CONF", l.slurm_conf());
}

/// Starts a daemon on `host`: in its network namespace in the hosts mode
/// (`None`: the root namespace, as munged's socket file serves them all),
/// as it is in the single-namespace mode.
fn spawn_on(spec: &Spec, host: Option<crate::hosts::Host>, c: Command, l: &Layout, name: &str) -> Result<Tracked> {
    let c = match (&spec.hosts, host) {
        (Some(_), Some(h)) => crate::hosts::in_namespace(&c, &h),
        _ => c,
    };
    process::spawn(c, &l.log_file(&format!("{name}.stdout")), &l.pid_file(name))
}

/// The head host (slurmctld, slurmdbd, MariaDB) in the hosts mode.
fn head(spec: &Spec) -> Option<crate::hosts::Host> {
    spec.hosts.as_ref().map(|n| n.head())
}

/// The address MariaDB listens on and slurmdbd connects from.
fn db_address(spec: &Spec) -> String {
    head(spec).map_or_else(|| "127.0.0.1".to_string(), |h| h.address.to_string())
}

/// The daemons that run on `host` in the hosts mode (to restart when its
/// namespace had to be made again).
pub(crate) fn services_on(host: &str) -> Vec<String> {
    match host {
        "head" => vec!["mariadbd".into(), "slurmdbd".into(), "slurmctld".into()],
        node if node.starts_with("node") => vec![format!("slurmd-{node}")],
        _ => Vec::new(),
    }
}

/// Stops the daemons of hosts whose namespaces were just made again: they
/// ran in a namespace that is gone from the network.
pub(crate) fn stop_rewired(l: &Layout, rewired: &[String], progress: &mut dyn FnMut(&str)) {
    for name in rewired.iter().flat_map(|h| services_on(h)) {
        if let Some(t) = running(l, &name) {
            t.stop(Duration::from_secs(15));
            progress(&format!("stopped {name}: its host's namespace was made again"));
        }
    }
}

pub(crate) fn start_all(
    cl: &Cluster,
    spec: &Spec,
    policy: Option<&onepool_decisions::policy::Policy>,
    restart_slurm: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let l = &cl.layout;
    start_munge(l, progress)?;
    start_mariadb(l, spec, progress)?;
    start_slurmdbd(cl, spec, progress)?;
    register_cluster(cl, spec)?;
    if restart_slurm {
        for name in service_names(Some(spec)).iter().filter(|n| n.starts_with("slurm") && *n != "slurmdbd") {
            if let Some(t) = running(l, name) {
                progress(&format!("plugins or configuration changed: restarting {name}"));
                t.stop(Duration::from_secs(10));
            }
        }
    }
    if !policy_conf::gpu_tres_known(cl)? {
        // First start: let slurmctld register gres/gpu without the partition
        // whose QOS needs it, then stop it for the real start below.
        let full = fs::read_to_string(l.policy_slurm_conf()).ctx(|| "reading the policy settings".into())?;
        let site = fs::read_to_string(l.slurm_conf()).ctx(|| "reading slurm.conf".into())?;
        write_file(&l.policy_slurm_conf(), &policy_conf::without_flexible_partition(&full), 0o644)?;
        write_file(&l.slurm_conf(), &policy_conf::without_allow_qos(&site), 0o644)?;
        start_slurmctld(cl, spec, progress)?;
        process::wait_for("slurmctld to register gres/gpu", &l.log_file("slurmctld"), Duration::from_secs(30), || {
            policy_conf::gpu_tres_known(cl).unwrap_or(false)
        })?;
        if let Some(t) = running(l, "slurmctld") {
            t.stop(Duration::from_secs(10));
        }
        write_file(&l.policy_slurm_conf(), &full, 0o644)?;
        write_file(&l.slurm_conf(), &site, 0o644)?;
    }
    if let Some(policy) = policy {
        policy_conf::apply_qos(cl, policy, progress)?;
    }
    start_slurmctld(cl, spec, progress)?;
    let throttled = match crate::throttle::percent_from_env()? {
        Some(p) => Some((p, crate::throttle::node_cgroup(&l.root, p)?)),
        None => None,
    };
    for (node, _) in spec.node_names().iter().zip(&spec.slurmd_ports) {
        let name = format!("slurmd-{node}");
        if running(l, &name).is_none() {
            fs::create_dir_all(l.spool().join(node)).ctx(|| "creating spool".into())?;
            let mut c = Command::new("slurmd");
            c.args(["-D", "-N", node, "-f"]).arg(l.slurm_conf());
            slurm_env(&mut c, l);
            let host = spec.hosts.as_ref().and_then(|net| net.node_named(spec.nodes, node));
            let slurmd = spawn_on(spec, host, c, l, &name)?;
            match &throttled {
                Some((p, cgroup)) => {
                    crate::throttle::join(cgroup, slurmd.pid)?;
                    progress(&format!("started {name}, its CPU capped with the other nodes' at {p}% of one core"));
                }
                None => progress(&format!("started {name}")),
            }
        }
    }
    wait_nodes_idle(cl, spec, progress)
}

fn start_munge(l: &Layout, progress: &mut dyn FnMut(&str)) -> Result<()> {
    if running(l, "munged").is_some() {
        return Ok(());
    }
    if !l.munge_key().exists() {
        process::run(
            Command::new("mungekey").arg("--create").arg(format!("--keyfile={}", display(&l.munge_key()))),
            Duration::from_secs(30),
        )?;
    }
    let _ = fs::remove_file(l.munge_socket());
    let mut c = Command::new("munged");
    c.arg("--foreground")
        .arg("--force")
        .arg(format!("--key-file={}", display(&l.munge_key())))
        .arg(format!("--socket={}", display(&l.munge_socket())))
        .arg(format!("--pid-file={}", display(&l.run().join("munged.pid"))))
        .arg(format!("--log-file={}", display(&l.log_file("munged"))))
        .arg(format!("--seed-file={}", display(&l.run().join("munged.seed"))));
    process::spawn(c, &l.log_file("munged.stdout"), &l.pid_file("munged"))?;
    let sock = l.munge_socket();
    process::wait_for("munged's socket", &l.log_file("munged"), Duration::from_secs(20), || sock.exists())?;
    progress("started munged");
    Ok(())
}

fn mariadb_client(l: &Layout, sql: &str) -> Result<String> {
    process::run(
        Command::new("mariadb")
            .arg("--no-defaults")
            .arg(format!("--socket={}", display(&l.db_socket())))
            .args(["-u", "root", "-N", "-e", sql]),
        Duration::from_secs(30),
    )
}

/// The dev cluster's lock for several onepoold instances (docs/ha.md):
/// MariaDB's `GET_LOCK` on the accounting server, reached over TLS pinned
/// to the certificate made at setup, as the user `onepool`.
#[derive(Clone, Debug)]
pub struct HaLock {
    pub host: String,
    pub port: u16,
    pub user: String,
    /// Mode 0600, root's (the tests and the demo run onepoold as root or
    /// give it a copy).
    pub password_file: PathBuf,
    /// The server's self-signed certificate: onepoold's `[ha] ca_file`.
    pub ca_file: PathBuf,
}

pub(crate) fn ha_lock(l: &Layout, spec: &Spec) -> HaLock {
    HaLock {
        host: db_address(spec),
        port: spec.db_port,
        user: "onepool".into(),
        password_file: l.etc().join("onepool-db.password"),
        ca_file: l.etc().join("mariadb-tls").join("cert.pem"),
    }
}

/// MariaDB's key and self-signed certificate (P-256, for the database's
/// address), made once: onepoold pins the certificate (`[ha] ca_file`).
/// Not a CA certificate: rustls takes a pinned end-entity certificate as
/// its own trust anchor only if it is not one.
fn db_tls(l: &Layout, spec: &Spec) -> Result<(PathBuf, PathBuf)> {
    let dir = l.etc().join("mariadb-tls");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let conf = dir.join("openssl.cnf");
    let text = format!(
        "[req]\ndistinguished_name = dn\nx509_extensions = ext\nprompt = no\n[dn]\nCN = onepool-devcluster-db\n\
         [ext]\nsubjectAltName = IP:127.0.0.1,IP:{}\nbasicConstraints = critical,CA:FALSE\n\
         keyUsage = critical,digitalSignature\nextendedKeyUsage = serverAuth\n",
        db_address(spec)
    );
    fs::create_dir_all(&dir).ctx(|| format!("creating {}", dir.display()))?;
    let changed = write_file(&conf, &text, 0o644)?;
    if changed || !cert.exists() || !key.exists() {
        process::run(
            Command::new("openssl")
                .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
                .args(["-days", "3650", "-config"])
                .arg(&conf)
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&cert),
            Duration::from_secs(60),
        )?;
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).ctx(|| format!("chmod {}", key.display()))?;
    }
    Ok((cert, key))
}

/// The `onepool` database user's password: made once, in a file only
/// root reads.
fn ha_password(l: &Layout) -> Result<String> {
    let path = l.etc().join("onepool-db.password");
    if let Ok(text) = fs::read_to_string(&path) {
        if let Some(pw) = text.lines().next().filter(|p| p.len() >= 16) {
            return Ok(pw.to_string());
        }
    }
    let mut buf = [0u8; 16];
    use std::io::Read;
    fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)).ctx(|| "reading /dev/urandom".into())?;
    let pw: String = buf.iter().map(|b| format!("{b:02x}")).collect();
    let _ = fs::remove_file(&path);
    write_file(&path, &format!("{pw}\n"), 0o600)?;
    Ok(pw)
}

fn start_mariadb(l: &Layout, spec: &Spec, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let (cert, key) = db_tls(l, spec)?;
    if let Some(t) = running(l, "mariadbd") {
        // Started before the cluster had TLS (an older onepool): again, with it.
        match mariadb_client(l, "SELECT @@have_ssl") {
            Ok(v) if v.trim() != "YES" => {
                t.stop(Duration::from_secs(60));
                progress("stopped MariaDB to start it with TLS");
            }
            _ => return ha_user(l),
        }
    }
    if !l.db_dir().join("mysql").exists() {
        progress("initialising MariaDB");
        process::run(
            Command::new("mariadb-install-db")
                .arg("--no-defaults")
                .arg(format!("--datadir={}", display(&l.db_dir())))
                .args(["--user=root", "--auth-root-authentication-method=socket", "--skip-test-db"]),
            Duration::from_secs(300),
        )?;
    }
    let _ = fs::remove_file(l.db_socket());
    let mut c = Command::new("mariadbd");
    c.arg("--no-defaults")
        .arg(format!("--datadir={}", display(&l.db_dir())))
        .arg(format!("--socket={}", display(&l.db_socket())))
        .arg(format!("--port={}", spec.db_port))
        .arg(format!("--bind-address={}", db_address(spec)))
        .arg("--user=root")
        .arg(format!("--pid-file={}", display(&l.run().join("mariadbd.pid"))))
        .arg(format!("--log-error={}", display(&l.log_file("mariadbd"))))
        .arg(format!("--ssl-cert={}", display(&cert)))
        .arg(format!("--ssl-key={}", display(&key)))
        .args([
            "--skip-name-resolve",
            "--skip-log-bin",
            "--innodb-buffer-pool-size=128M",
            "--innodb-log-file-size=32M",
            "--innodb-lock-wait-timeout=900",
            "--max-connections=64",
            // MariaDB 11.8 (Debian unstable) turns snapshot isolation on,
            // which slurmdbd does not support; `loose-` keeps 10.11 (Debian
            // 12), which lacks the option, starting.
            "--loose-innodb-snapshot-isolation=OFF",
        ]);
    spawn_on(spec, head(spec), c, l, "mariadbd")?;
    process::wait_for("MariaDB to accept connections", &l.log_file("mariadbd"), Duration::from_secs(120), || {
        mariadb_client(l, "SELECT 1").is_ok()
    })?;
    let pw = &spec.db_password;
    let from = db_address(spec);
    mariadb_client(
        l,
        &format!(
            "CREATE USER IF NOT EXISTS 'slurm'@'{from}' IDENTIFIED BY '{pw}'; \
             ALTER USER 'slurm'@'{from}' IDENTIFIED BY '{pw}'; \
             GRANT ALL ON slurm_acct_db.* TO 'slurm'@'{from}'; FLUSH PRIVILEGES;"
        ),
    )?;
    ha_user(l)?;
    progress("started MariaDB");
    Ok(())
}

/// The user onepoold's leadership lock connects as: no privileges
/// (GET_LOCK needs none), from any host, over TLS only.
fn ha_user(l: &Layout) -> Result<()> {
    let pw = ha_password(l)?;
    mariadb_client(
        l,
        &format!(
            "CREATE USER IF NOT EXISTS 'onepool'@'%' IDENTIFIED BY '{pw}' REQUIRE SSL; \
             ALTER USER 'onepool'@'%' IDENTIFIED BY '{pw}' REQUIRE SSL; FLUSH PRIVILEGES;"
        ),
    )?;
    Ok(())
}

fn start_slurmdbd(cl: &Cluster, spec: &Spec, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let l = &cl.layout;
    let spawn = |progress: &mut dyn FnMut(&str)| -> Result<()> {
        let mut c = Command::new("slurmdbd");
        c.arg("-D");
        slurm_env(&mut c, l);
        spawn_on(spec, head(spec), c, l, "slurmdbd")?;
        progress("started slurmdbd");
        Ok(())
    };
    if running(l, "slurmdbd").is_none() {
        spawn(progress)?;
    }
    // Slurm 24.11's slurmdbd against a just-started MariaDB 11.8 (Debian 13)
    // can die at its first query ("_check_mysql_concat_is_sane: null
    // result", error 5027); a second start works (measured). Restart it a
    // few times rather than wait out the timeout for a dead daemon.
    let mut restarts = 0;
    let mut error = None;
    process::wait_for("slurmdbd to answer sacctmgr", &l.log_file("slurmdbd"), Duration::from_secs(120), || {
        if process::run(cl.command("sacctmgr").args(["-n", "-P", "show", "cluster"]), Duration::from_secs(15)).is_ok() {
            return true;
        }
        if running(l, "slurmdbd").is_none() && restarts < 3 {
            restarts += 1;
            progress(&format!(
                "slurmdbd exited while starting (see {}); starting it again",
                l.log_file("slurmdbd").display()
            ));
            if let Err(e) = spawn(progress) {
                error = Some(e);
                return true;
            }
        }
        false
    })?;
    error.map_or(Ok(()), Err)
}

fn register_cluster(cl: &Cluster, spec: &Spec) -> Result<()> {
    let clusters = cl.run("sacctmgr", &["-n", "-P", "show", "cluster", "format=cluster"])?;
    if !clusters.lines().any(|c| c.trim() == spec.cluster) {
        cl.run("sacctmgr", &["-i", "add", "cluster", &spec.cluster])?;
    }
    Ok(())
}

pub(crate) fn restart_slurmctld(cl: &Cluster, progress: &mut dyn FnMut(&str)) -> Result<()> {
    if let Some(t) = running(&cl.layout, "slurmctld") {
        t.stop(Duration::from_secs(10));
        progress("stopped slurmctld");
    }
    start_slurmctld(cl, &cl.spec()?, progress)
}

fn start_slurmctld(cl: &Cluster, spec: &Spec, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let l = &cl.layout;
    if running(l, "slurmctld").is_none() {
        let mut c = Command::new("slurmctld");
        c.arg("-D").arg("-f").arg(l.slurm_conf());
        // A new cluster has no saved state: 26.05's slurmctld stops at its
        // first start ("No Assoc usage file ... to recover") unless told to
        // go on without it (measured); older releases start either way.
        if !l.state().join("assoc_usage").exists() {
            c.arg("-i");
        }
        slurm_env(&mut c, l);
        spawn_on(spec, head(spec), c, l, "slurmctld")?;
        progress("started slurmctld");
    }
    // A slurmctld that exits (a fatal error in its log) ends the wait at
    // once instead of after the whole timeout.
    let mut exited = false;
    process::wait_for(
        "slurmctld to answer `scontrol ping`",
        &l.log_file("slurmctld"),
        Duration::from_secs(60),
        || {
            exited = running(l, "slurmctld").is_none();
            exited || cl.run("scontrol", &["ping"]).map(|o| o.contains("UP")).unwrap_or(false)
        },
    )?;
    if exited {
        return Err(Error::Setup(format!("slurmctld exited; see {}", display(&l.log_file("slurmctld")))));
    }
    Ok(())
}

fn wait_nodes_idle(cl: &Cluster, spec: &Spec, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let l = &cl.layout;
    let want = spec.nodes as usize;
    process::wait_for("every node to be idle", &l.log_file("slurmctld"), Duration::from_secs(90), || {
        let Ok(out) = cl.run("sinfo", &["-h", "-N", "-o", "%N %t"]) else {
            return false;
        };
        // One line per node and partition: judge each node once.
        let states: std::collections::BTreeMap<&str, &str> =
            out.lines().filter_map(|line| line.split_once(' ')).map(|(n, s)| (n, s.trim())).collect();
        states.len() == want
            && states.values().all(|s| s.starts_with("idle") || s.starts_with("mix") || s.starts_with("alloc"))
    })?;
    progress(&format!("{want} nodes up"));
    Ok(())
}

pub(crate) fn stop_all(cl: &Cluster, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let l = &cl.layout;
    let spec = crate::Spec::load(&l.cluster_json())?;
    if running(l, "slurmctld").is_some() {
        // Let jobs end through Slurm first, so their steps go with them.
        if let Ok(ids) = cl.run("squeue", &["-h", "-o", "%i"]) {
            let mut args = vec!["--quiet"];
            args.extend(ids.split_whitespace());
            if args.len() > 1 {
                let _ = cl.run("scancel", &args);
            }
        }
        let _ = process::wait_for("jobs to end", &l.log_file("slurmctld"), Duration::from_secs(15), || {
            cl.run("squeue", &["-h", "-t", "running,completing"]).map(|o| o.trim().is_empty()).unwrap_or(true)
        });
    }
    let mut names = service_names(spec.as_ref());
    names.reverse();
    for name in names {
        if let Some(t) = running(l, &name) {
            t.stop(Duration::from_secs(15));
            progress(&format!("stopped {name}"));
        }
        let _ = fs::remove_file(l.pid_file(&name));
    }
    kill_orphaned_steps(l, progress);
    Ok(())
}

/// slurmstepd daemonizes away from slurmd; find the ones of this cluster by
/// the SLURM_CONF they inherited, and kill them with their job processes.
fn kill_orphaned_steps(l: &Layout, progress: &mut dyn FnMut(&str)) {
    let ours = format!("SLURM_CONF={}", display(&l.slurm_conf()));
    let Ok(entries) = fs::read_dir("/proc") else {
        return;
    };
    let mut parent: HashMap<i32, i32> = HashMap::new();
    let mut steps = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) {
            if let Some(ppid) = stat.rfind(')').and_then(|i| stat[i + 2..].split_whitespace().nth(1)?.parse().ok()) {
                parent.insert(pid, ppid);
            }
        }
        let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !cmd.starts_with(b"slurmstepd") {
            continue;
        }
        let env = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if env.split(|b| *b == 0).any(|v| v == ours.as_bytes()) {
            steps.push(pid);
        }
    }
    let mut victims = steps.clone();
    let mut i = 0;
    while i < victims.len() {
        let p = victims[i];
        victims.extend(parent.iter().filter(|(_, pp)| **pp == p).map(|(c, _)| *c));
        i += 1;
    }
    for pid in &victims {
        if let Some(t) = Tracked::of(*pid) {
            // Tracked::of matched the pid to a live process of this cluster.
            let _ = onepool_os::signal(t.pid as u32, onepool_os::SIGKILL);
        }
    }
    if !victims.is_empty() {
        progress(&format!("killed {} leftover step process(es)", victims.len()));
    }
}

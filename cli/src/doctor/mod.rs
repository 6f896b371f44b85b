//! `onepool doctor`: is this cluster ready for the policy? Every setting
//! the policy relies on, read from the live cluster through Slurm's own
//! commands and files, one line each with PASS/WARN/FAIL and the fix.
//! Exit status: 0 nothing failed, 1 something failed, 2 the doctor could
//! not look (a Slurm command or file it needs failed).

mod checks;
mod elf;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use onepool_decisions::gres_conf;
use onepool_decisions::policy::load;
use onepool_decisions::render::live::{
    self, parse_sacctmgr_assoc, parse_sacctmgr_qos, parse_scontrol_config, parse_scontrol_partitions, LiveConfig,
};
use onepool_decisions::render::render;
use onepool_slurm_commands::{CommandError, Runner, SystemRunner};

pub use checks::{Check, Status};

const COMMAND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
pub const DAEMON_CONFIG: &str = "/etc/slurm/onepoold.toml";
const SHOW_NODES: &[&str] = &["scontrol", "-o", "show", "nodes"];

pub const EXIT_STATUS_HELP: &str =
    "Exit status: 0 nothing failed (warnings allowed), 1 a check failed, 2 the doctor could not read the cluster";

#[derive(Args)]
pub struct DoctorArgs {
    /// Policy file [default: $ONEPOOL_POLICY, else /etc/slurm/onepool.toml]
    pub policy: Option<PathBuf>,
    /// onepoold's config [default: $ONEPOOL_DAEMON_CONFIG, else /etc/slurm/onepoold.toml when it exists]
    #[arg(long)]
    pub daemon_config: Option<PathBuf>,
    /// Only what this host holds (plugstack, installed plugins, GPU device files): run it on each node
    #[arg(long)]
    pub local: bool,
    /// One JSON object: {"checks": [{"status", "check", "detail", "fix"}], "passed", "warnings", "failed"}
    #[arg(long)]
    pub json: bool,
    /// Also submit one replica of ENDPOINT through Slurm as onepoold would
    /// (`onepoold --preflight`), wait until it answers a chat completion,
    /// report how long that took, and cancel it; on failure, why (the
    /// server's signal or exit code and last output lines). Repeatable.
    #[arg(long = "preflight", value_name = "ENDPOINT")]
    pub preflight: Vec<String>,
}

pub fn run(args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    let src = crate::policy::source::read(args.policy.clone())?;
    let named = args
        .daemon_config
        .clone()
        .or_else(|| std::env::var_os("ONEPOOL_DAEMON_CONFIG").filter(|v| !v.is_empty()).map(PathBuf::from));
    let daemon_config = match named {
        Some(path) => Some(DaemonConfig { path, named: true }),
        None => Path::new(DAEMON_CONFIG).exists().then(|| DaemonConfig { path: DAEMON_CONFIG.into(), named: false }),
    };
    let host = Host::this();
    let mut checks = examine(&src, daemon_config.as_ref(), args.local, &SystemRunner::new(COMMAND_TIMEOUT), &host)?;
    for endpoint in &args.preflight {
        let config = daemon_config.as_ref().map(|d| d.path.as_path());
        checks.push(preflight(&host, config, endpoint, &SystemRunner::new(PREFLIGHT_TIMEOUT)));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&checks::json(&checks))?);
    } else {
        print!("{}", checks::text(&checks));
    }
    Ok(if checks.iter().any(|c| c.status == Status::Fail) { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// A preflight waits for the queue (up to 10 minutes) and the model's load.
const PREFLIGHT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1800);

/// `onepoold --preflight ENDPOINT --config FILE`, as a check.
fn preflight(host: &Host, config: Option<&Path>, endpoint: &str, runner: &dyn Runner) -> Check {
    let Some(config) = config else {
        return checks::preflight(endpoint, None, Err("no onepoold config here: pass --daemon-config FILE".into()));
    };
    let argv = [
        host.onepoold.to_string_lossy().into_owned(),
        "--config".into(),
        config.display().to_string(),
        "--preflight".into(),
        endpoint.to_string(),
    ];
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let result = match runner.run(&argv) {
        Ok(out) => Ok(out),
        Err(CommandError::Failed { stdout, stderr, .. }) => Err(format!("{stdout}{stderr}")),
        Err(e) => Err(e.to_string()),
    };
    checks::preflight(endpoint, Some(&config.display().to_string()), result)
}

type ReadFile = Box<dyn Fn(&Path) -> std::io::Result<Vec<u8>>>;
type FileKind = Box<dyn Fn(&str) -> Option<bool>>;
type PluginVersion = Box<dyn Fn(&Path) -> Result<Option<u32>, String>>;

/// What the doctor reads off this host beyond Slurm's commands: its names
/// (to find the nodes it runs) and its files.
pub struct Host {
    pub names: Vec<String>,
    pub read: ReadFile,
    /// What a path is: `Some(true)` a character device, `Some(false)`
    /// something else, `None` missing.
    pub kind: FileKind,
    /// A plugin file's `plugin_version` ([`elf::plugin_version`]).
    pub plugin_version: PluginVersion,
    pub onepoold: PathBuf,
}

impl Host {
    fn this() -> Host {
        use std::os::unix::fs::FileTypeExt;
        let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            let h = h.trim().to_string();
            names.extend(h.split('.').next().map(str::to_string));
            names.push(h);
        }
        // The onepoold installed beside this onepool, else the one on PATH.
        let onepoold = std::env::current_exe()
            .ok()
            .and_then(|e| Some(e.parent()?.join("onepoold")))
            .filter(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from("onepoold"));
        Host {
            names,
            read: Box::new(|p| std::fs::read(p)),
            kind: Box::new(|p| std::fs::metadata(p).ok().map(|m| m.file_type().is_char_device())),
            plugin_version: Box::new(|p| {
                let bytes = std::fs::read(p).map_err(|e| e.to_string())?;
                elf::plugin_version(&bytes)
            }),
            onepoold,
        }
    }
}

/// onepoold's config, and whether the admin named it (else it was found at
/// its default place).
pub struct DaemonConfig {
    pub path: PathBuf,
    pub named: bool,
}

/// Every check, in report order.
pub fn examine(
    src: &crate::policy::source::Source,
    daemon_config: Option<&DaemonConfig>,
    local: bool,
    runner: &dyn Runner,
    host: &Host,
) -> anyhow::Result<Vec<Check>> {
    let loaded = load(&src.text);
    let policy = match &loaded.policy {
        Some(p) if loaded.errors().next().is_none() => p,
        _ => {
            let detail = crate::policy::check::summary(&src.name, &loaded);
            return Ok(vec![Check::fail("policy", detail, format!("onepool policy check {}", src.name))]);
        }
    };
    let rendered = render(policy);
    let cmd = |argv: &[&str]| runner.run(argv).with_context(|| format!("the doctor needs `{}`", argv.join(" ")));
    let config = parse_scontrol_config(&cmd(live::SHOW_CONFIG)?);
    anyhow::ensure!(!config.values.is_empty(), "`scontrol show config` printed no settings");
    let slurm = config.get("SLURM_VERSION").unwrap_or("unknown").to_string();
    let mut out = vec![Check::pass("policy", format!("{} loads; Slurm {slurm}", src.name))];
    if !local {
        let qos = parse_sacctmgr_qos(&cmd(live::SHOW_QOS)?).map_err(|e| anyhow::anyhow!("`sacctmgr show qos`: {e}"))?;
        let partitions = parse_scontrol_partitions(&cmd(live::SHOW_PARTITIONS)?)
            .map_err(|e| anyhow::anyhow!("`scontrol show partition`: {e}"))?;
        let assocs =
            parse_sacctmgr_assoc(&cmd(live::SHOW_ASSOC)?).map_err(|e| anyhow::anyhow!("`sacctmgr show assoc`: {e}"))?;
        let changes = live::diff(&rendered, &qos, &config, &partitions).with_associations(&rendered, &assocs);
        out.extend(checks::slurm_conf(&rendered, &changes, |k| config.get(k).map(str::to_string)));
        out.extend(checks::qos(&rendered, &changes));
        out.extend(checks::associations(&rendered, &changes));
        out.extend(checks::partitions(&rendered, &changes));
        out.extend(checks::problems(&rendered, &changes));
    }
    let stack = plugstack_files(&config, host);
    out.push(checks::plugstack(&stack));
    out.push(checks::process_tracking(&stack, |k| config.get(k).map(str::to_string)));
    out.extend(plugins(&config, &stack, &slurm, local, host));
    out.extend(gres(&config, &cmd(SHOW_NODES)?, host));
    if !local {
        // During an audit trial onepoold cannot run (it needs the plugin's
        // records): the packaged sample config found in its place is not
        // a failure then, only a config the admin names is checked.
        if let Some(d) = daemon_config.filter(|d| policy.pool.audit && !d.named) {
            out.push(checks::daemon_during_audit(&d.path.display().to_string()));
            return Ok(out);
        }
        let daemon_config = daemon_config.map(|d| d.path.as_path());
        let result = daemon_config.map(|p| {
            let argv = [
                host.onepoold.to_string_lossy().into_owned(),
                "--check".into(),
                "--config".into(),
                p.display().to_string(),
            ];
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            match runner.run(&argv) {
                Ok(out) => Ok(out),
                Err(CommandError::Failed { stdout, stderr, .. }) => Err(format!("{stdout}{stderr}")),
                Err(e) => Err(e.to_string()),
            }
        });
        out.push(checks::daemon(daemon_config.map(|p| p.display().to_string()).as_deref(), result));
        // With several instances, whether one of them holds the lock.
        let ha =
            daemon_config.and_then(|p| onepool_elastic_daemon::config::load(p).ok()).filter(|c| c.ha.lock.is_some());
        if let Some(c) = ha {
            let state = crate::status::control_state(&c.control_socket).map_err(|e| format!("{e:#}"));
            out.push(checks::leadership(state.map(|s| s.leadership)));
        }
    }
    Ok(out)
}

/// plugstack.conf and the files it `include`s (`*` in the last part of a path).
fn plugstack_files(config: &LiveConfig, host: &Host) -> Vec<(String, String)> {
    let Some(first) = config.get("PlugStackConfig").filter(|p| !p.is_empty() && *p != "(null)") else {
        return Vec::new();
    };
    let mut files = Vec::new();
    let mut todo = vec![PathBuf::from(first)];
    while let Some(p) = todo.pop() {
        let Ok(bytes) = (host.read)(&p) else { continue };
        let text = String::from_utf8_lossy(&bytes).into_owned();
        for line in text.lines() {
            if let Some(pattern) = line.trim().strip_prefix("include ") {
                todo.extend(glob(pattern.trim()));
            }
        }
        files.push((p.display().to_string(), text));
        if files.len() > 64 {
            break;
        }
    }
    files
}

fn glob(pattern: &str) -> Vec<PathBuf> {
    let path = Path::new(pattern);
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    let Some((prefix, suffix)) = name.split_once('*') else { return vec![path.to_path_buf()] };
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(prefix) && n.ends_with(suffix)))
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

/// The installed plugins against slurmctld's release: the job submit
/// plugin from PluginDir, the SPANK plugin from its plugstack line.
fn plugins(config: &LiveConfig, stack: &[(String, String)], slurm: &str, local: bool, host: &Host) -> Vec<Check> {
    let dirs: Vec<PathBuf> =
        config.get("PluginDir").unwrap_or("").split(':').filter(|d| !d.is_empty()).map(PathBuf::from).collect();
    // Found by what the path is (no read: the plugin is read once, for its version).
    let in_dirs = |name: &str| dirs.iter().map(|d| d.join(name)).find(|p| (host.kind)(&p.to_string_lossy()).is_some());
    let spank = stack.iter().flat_map(|(_, t)| t.lines()).find_map(|l| {
        let mut w = l.split_whitespace();
        let (kind, path) = (w.next()?, w.next()?);
        (!kind.starts_with('#') && path.ends_with("spank_onepool.so")).then(|| path.to_string())
    });
    let spank = spank.map(|p| if Path::new(&p).is_absolute() { Some(PathBuf::from(p)) } else { in_dirs(&p) });
    let mut wanted = vec![("spank_onepool.so", spank.flatten().or_else(|| in_dirs("spank_onepool.so")))];
    if !local {
        wanted.insert(0, ("job_submit_onepool.so", in_dirs("job_submit_onepool.so")));
    }
    wanted
        .into_iter()
        .map(|(name, path)| {
            let found = match path {
                None => Err(format!(
                    "not found in PluginDir ({})",
                    dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(":")
                )),
                Some(p) => (host.plugin_version)(&p)
                    .map_err(|e| format!("{}: {e}", p.display()))
                    .map(|v| (p.display().to_string(), v)),
            };
            checks::plugin_release(name, found, slurm)
        })
        .collect()
}

/// gres.conf's GPU device files for the nodes that run on this host.
fn gres(config: &LiveConfig, nodes: &str, host: &Host) -> Vec<Check> {
    let conf_dir = config.get("SLURM_CONF").map(|c| Path::new(c).parent().unwrap_or(Path::new("/")).to_path_buf());
    let file = conf_dir.unwrap_or_else(|| PathBuf::from("/etc/slurm")).join("gres.conf");
    let mut here = Vec::new();
    let mut elsewhere = 0;
    for line in nodes.lines() {
        let field = |key: &str| line.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('='));
        let (Some(name), gres) = (field("NodeName"), field("Gres").unwrap_or("")) else { continue };
        if !gres.split(',').any(|g| g.starts_with("gpu")) {
            continue;
        }
        let hostname = field("NodeHostName").unwrap_or(name);
        if host.names.iter().any(|h| h == hostname) {
            here.push(name.to_string());
        } else {
            elsewhere += 1;
        }
    }
    let shown = file.display().to_string();
    // Without nodes here, an unreadable gres.conf is only worth a warning.
    let mut unread = None;
    let text = match (host.read)(&file) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) if !here.is_empty() => {
            let fix = format!("create {shown} with the nodes' GPU device files");
            return vec![Check::fail("gres.conf", format!("{shown}: {e}"), fix)];
        }
        Err(e) => {
            unread = Some(Check::warn("gres.conf", format!("{shown}: {e}"), "run the doctor where gres.conf is"));
            String::new()
        }
    };
    let auto = checks::autodetect(&text);
    let per_node: Vec<(String, Result<Vec<String>, String>)> = here
        .into_iter()
        .map(|n| {
            let files = gres_conf::gpu_files(&text, &n);
            (n, files)
        })
        .collect();
    let mut out = checks::gres_devices(&shown, auto.as_deref(), &per_node, elsewhere, |p| (host.kind)(p));
    out.extend(unread);
    out
}

#[cfg(test)]
mod tests;

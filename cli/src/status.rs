//! `onepool status`: the pool per class, from Slurm (jobs and the classes
//! job_submit/onepool recorded on them), and the inference endpoints, from
//! onepoold's control socket. Each part is shown when its source answers;
//! a source that does not is named, with why.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use onepool_control::api::{Leadership, ReclaimView, ReplicaJob, StartFailures, State};
use onepool_decisions::policy::{self, Policy, Tier};
use onepool_slurm_commands::adapter::{Commands, Slurm};
use onepool_slurm_commands::state::JobInfo;
use onepool_slurm_commands::SystemRunner;
use serde_json::json;

/// Exit status when a command could not do its work at all (unreadable
/// file, Slurm command failing), as opposed to finding problems (1).
pub const EXIT_TROUBLE: u8 = 2;

#[derive(clap::Args)]
pub struct StatusArgs {
    /// onepoold's control socket.
    #[arg(long, env = "ONEPOOL_CONTROL_SOCKET", default_value = "/run/onepool/onepoold.sock")]
    pub socket: PathBuf,
    /// The policy file (classes, their QOS and capacity).
    #[arg(long, env = "ONEPOOL_POLICY", default_value = policy::DEFAULT_PATH)]
    pub policy: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Per class: what runs and what waits, in jobs and GPUs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ClassUse {
    pub running: u32,
    pub running_gpus: u64,
    pub pending: u32,
    pub pending_gpus: u64,
    /// Running jobs Slurm is preempting (their grace time runs).
    pub reclaiming: u32,
}

/// Adds up the jobs job_submit/onepool classified, by class.
pub fn pool_use(jobs: &[JobInfo]) -> BTreeMap<String, ClassUse> {
    let mut by_class: BTreeMap<String, ClassUse> = BTreeMap::new();
    for j in jobs {
        let Some(r) = j.record() else { continue };
        let u = by_class.entry(r.class).or_default();
        if j.is_running() {
            u.running += 1;
            u.running_gpus += j.gpus();
            u.reclaiming += u32::from(j.is_being_preempted());
        } else if j.is_pending() {
            u.pending += 1;
            u.pending_gpus += j.gpus();
        }
    }
    by_class
}

/// GPUs flexible work holds beyond what is not protected: borrowed from
/// lendable protected capacity, and reclaimed when the owners need it.
pub fn borrowed(policy: &Policy, uses: &BTreeMap<String, ClassUse>) -> u64 {
    let protected: u64 = policy
        .classes
        .iter()
        .map(|c| match &c.tier {
            Tier::Protected { capacity } => u64::from(capacity.total()),
            Tier::Flexible { .. } => 0,
        })
        .sum();
    let flexible: u64 = policy
        .classes
        .iter()
        .filter(|c| !c.is_protected())
        .filter_map(|c| uses.get(&c.name))
        .map(|u| u.running_gpus)
        .sum();
    flexible.saturating_sub(u64::from(policy.pool.total_gpus).saturating_sub(protected))
}

pub fn pool_table(policy: &Policy, uses: &BTreeMap<String, ClassUse>) -> String {
    let mut out = format!(
        "POOL {} GPUs: {} reserved, flexible work capped at {}; borrowed now: {} GPUs\n",
        policy.pool.total_gpus,
        policy.reserved_gpus(),
        policy.flexible_cap(),
        borrowed(policy, uses)
    );
    out.push_str(&format!(
        "{:<20} {:<13} {:>4} {:<24} {:>8} {:>5} {:>8} {:>9} {:>10}\n",
        "CLASS", "TIER", "RANK", "QOS", "RUNNING", "GPUS", "PENDING", "PEND_GPUS", "RECLAIMING"
    ));
    for c in &policy.classes {
        let u = uses.get(&c.name).cloned().unwrap_or_default();
        let (tier, rank) = match &c.tier {
            Tier::Protected { capacity } => (format!("protected({})", capacity.total()), "-".to_string()),
            Tier::Flexible { rank, .. } => ("flexible".to_string(), rank.to_string()),
        };
        out.push_str(&format!(
            "{:<20} {:<13} {:>4} {:<24} {:>8} {:>5} {:>8} {:>9} {:>10}\n",
            c.name, tier, rank, c.qos, u.running, u.running_gpus, u.pending, u.pending_gpus, u.reclaiming
        ));
    }
    out
}

/// onepoold's control socket, its calls bounded to 10 s.
fn control(socket: &Path) -> anyhow::Result<onepool_control::blocking::Control> {
    Ok(onepool_control::blocking::Control::new(socket, Duration::from_secs(10))?)
}

/// onepoold's `/v1/state`; the error says where it looked.
pub fn control_state(socket: &Path) -> anyhow::Result<State> {
    control(socket)?
        .state()
        .with_context(|| format!("cannot reach onepoold at {} (is it running? --socket)", socket.display()))
}

/// Which onepoold instance acts on Slurm (docs/ha.md), since when and the
/// last takeover (`now`: Unix seconds).
pub fn leadership_line(l: &Leadership, now: f64) -> String {
    let at = |t: f64| {
        let ago = (now - t).max(0.0);
        format!("{} ({:.0} s ago)", onepool_decisions::trace::format_time_ms(t), ago)
    };
    let name = &l.instance;
    if !l.shared {
        return format!("onepoold {name}: the only instance; acts on Slurm\n");
    }
    let mut out = match (l.acting, &l.acting_instance, &l.foreign_holder) {
        (true, _, _) => format!("onepoold {name}: ACTS on Slurm since {}", l.acting_since.map_or("?".into(), at)),
        (false, _, Some(stranger)) => format!(
            "onepoold {name}: follows; NO INSTANCE ACTS: the lock is held by {stranger}, which is not an onepoold \
             instance of this configuration (no proof made with the replica key); end that connection (docs/ha.md)"
        ),
        (false, Some(holder), None) => format!("onepoold {name}: follows (routes, acts on nothing); acting: {holder}"),
        (false, None, None) => format!("onepoold {name}: follows; the acting instance is unknown"),
    };
    match l.last_takeover {
        Some(t) => out.push_str(&format!("; last takeover here {}, {} in all", at(t), l.takeovers)),
        None => out.push_str("; no takeover here yet"),
    }
    if let Some(e) = &l.last_error {
        out.push_str(&format!("\n  lock: {e}"));
    }
    out.push('\n');
    out
}

pub fn endpoints_table(state: &State) -> String {
    let now_f = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let mut out = state.leadership.as_ref().map(|l| leadership_line(l, now_f)).unwrap_or_default();
    out += &format!(
        "{:<16} {:>6} {:<22} {:<9} {:>10} {:>8}\n",
        "ENDPOINT", "QUEUED", "REPLICA", "STATE", "IN_FLIGHT", "SERVED"
    );
    for ep in &state.endpoints {
        let (name, queued) = (&ep.name, ep.queued);
        if ep.replicas.is_empty() {
            out.push_str(&format!("{name:<16} {queued:>6} {:<22} {:<9} {:>10} {:>8}\n", "(none)", "-", "-", "-"));
        }
        for r in &ep.replicas {
            out.push_str(&format!(
                "{:<16} {:>6} {:<22} {:<9} {:>10} {:>8}\n",
                name,
                queued,
                r.address.to_string(),
                r.state.as_str(),
                format!("{}/{}", r.in_flight, r.limit),
                r.served
            ));
        }
    }
    out.push_str(&resume_lines(state));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    out.push_str(&replica_jobs_table(state, now));
    out
}

/// How each endpoint's answers continue on another replica (issue #43).
pub fn resume_lines(state: &State) -> String {
    let mut out = String::new();
    for ep in &state.endpoints {
        let line = match &ep.resume {
            Some(r) => {
                let how = match r.method.as_str() {
                    "tokens" => "by token ids (llama-server: exact to the junction, recomputed after it)",
                    "text" => "by text (may differ at the junction)",
                    other => other,
                };
                format!(
                    "{}: answers continue on another replica {how}, at most {} move(s) each; {} moved, {} could not be\n",
                    ep.name, r.max_moves, r.moved, r.not_moved
                )
            }
            None => format!(
                "{}: answers are not continued on another replica ([endpoint.resume] method = \"off\")\n",
                ep.name
            ),
        };
        out.push_str(&line);
        // Its request classes (issue #44), highest first.
        for c in &ep.classes {
            out.push_str(&format!(
                "{}: class {} (rank {}{}): {} waiting, {} in flight, {} requests, {} shed, {} yielded their slot\n",
                ep.name,
                c.name,
                c.rank,
                if c.lower { ", below the endpoint's own" } else { "" },
                c.queued,
                c.in_flight,
                c.requests,
                c.shed,
                c.yielded
            ));
            if let Some(line) = followed_line(&c.followed) {
                out.push_str(&format!("{}: class {}: {line}\n", ep.name, c.name));
            }
        }
    }
    if !out.is_empty() {
        out.insert(0, '\n');
    }
    out
}

/// The replica jobs onepoold runs, per endpoint with `[endpoint.replicas]`;
/// drains show how long they may still take (`now`: Unix seconds).
pub fn replica_jobs_table(state: &State, now: u64) -> String {
    let mut out = String::new();
    for ep in &state.endpoints {
        let Some(v) = &ep.replica_jobs else { continue };
        let name = &ep.name;
        out.push_str(&format!(
            "\n{name}: {} replicas wanted (min {}, max {}); load {:.1} in flight + queued; {:.1} requests/s\n",
            v.desired, v.min, v.max, v.load, v.rate,
        ));
        if v.lower > 0 {
            out.push_str(&format!(
                "  {} of them only for request classes below the endpoint's own, in their class (lower-class replicas)\n",
                v.lower
            ));
        }
        if let Some((read, serving)) = v.scraped {
            out.push_str(&format!(
                "  load from the replicas' own metrics: {read} of {serving} read (the rest: the router's count)\n"
            ));
        }
        if let Some(e) = &v.last_error {
            out.push_str(&format!("  last Slurm error: {e}\n"));
        }
        if let Some(l) = &v.latency {
            out.push_str(&format!("  latency: {l}\n"));
        }
        if v.advisory {
            let now = if v.advised.is_empty() { " nothing to do now".to_string() } else { String::new() };
            out.push_str(&format!("  advisory: decisions are logged, not carried out;{now}\n"));
            for a in &v.advised {
                out.push_str(&format!("    would {a}\n"));
            }
        }
        out.push_str(&start_failures(&v.start_failures, name, now));
        out.push_str(&reclaims(&v.reclaims, now));
        out.push_str(&format!(
            "  {:>8} {:<13} {:<10} {:<10} {:<22} {}\n",
            "JOBID", "KIND", "PHASE", "NODE", "ADDRESS", "DRAIN"
        ));
        for j in &v.jobs {
            out.push_str(&replica_job_line(j, now));
        }
    }
    out
}

fn replica_job_line(j: &ReplicaJob, now: u64) -> String {
    let drain = match j.drain_deadline {
        Some(d) => {
            let by = if j.preempted { "preempted by Slurm; " } else { "" };
            format!("{by}released within {}s", d.saturating_sub(now))
        }
        None if j.preempted => "preempted by Slurm".to_string(),
        None => "-".to_string(),
    };
    format!(
        "  {:>8} {:<13} {:<10} {:<10} {:<22} {}\n",
        j.job,
        j.kind.as_str(),
        j.phase.as_str(),
        j.node.as_deref().unwrap_or("-"),
        j.address.map_or_else(|| "-".to_string(), |a| a.to_string()),
        drain
    )
}

/// The last reclaims of the endpoint's replicas (issue #26).
fn reclaims(list: &[ReclaimView], now: u64) -> String {
    if list.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "  last reclaims ({}; times to the millisecond, and each taker's class: onepool report):\n",
        list.len()
    );
    for x in list.iter().rev() {
        let taker = match (x.taker, x.time_to_capacity_s) {
            (Some(j), Some(t)) => format!("; job {j} took them, {t} s after its submission"),
            _ => String::new(),
        };
        out.push_str(&format!(
            "    job {} ({}, {}) {} s ago: GPUs free {:.1} s after Slurm's pick was seen{taker}\n",
            x.job,
            x.kind.as_str(),
            x.mode.as_str(),
            now.saturating_sub(x.at),
            x.released_after_s
        ));
    }
    out
}

/// The endpoint's failed starts (issue #24): whether it backs off, until
/// when, and the last cause with the server's last output lines.
fn start_failures(f: &StartFailures, endpoint: &str, now: u64) -> String {
    let (total, in_a_row) = (f.total, f.in_a_row);
    if total == 0 {
        return String::new();
    }
    let mut out = if f.backing_off {
        let next = match f.next_attempt {
            Some(t) if t > now => format!("next attempt in {} s", t - now),
            _ => "one probe job at a time until a replica serves".to_string(),
        };
        format!(
            "  START BACK-OFF: {in_a_row} failed start(s) in a row ({total} since onepoold started); {next}; \
             after fixing the cause: onepool retry {endpoint}\n"
        )
    } else {
        format!(
            "  failed starts: {total} since onepoold started ({in_a_row} in a row before the last replica served)\n"
        )
    };
    if let Some(last) = &f.last {
        let ago = now.saturating_sub(last.at);
        let mut lines = last.cause.lines();
        out.push_str(&format!("  last failed start, {ago} s ago: {}\n", lines.next().unwrap_or("")));
        for l in lines {
            out.push_str(&format!("    | {l}\n"));
        }
    }
    out
}

#[derive(clap::Args)]
pub struct RetryArgs {
    /// The endpoint whose replicas failed to start.
    pub endpoint: String,
    /// onepoold's control socket.
    #[arg(long, env = "ONEPOOL_CONTROL_SOCKET", default_value = "/run/onepool/onepoold.sock")]
    pub socket: PathBuf,
}

/// `onepool retry ENDPOINT`: ends an endpoint's start back-off once the
/// cause is fixed, instead of waiting out its next attempt.
pub fn retry(args: &RetryArgs) -> anyhow::Result<ExitCode> {
    let answer = control(&args.socket)?
        .retry(&args.endpoint)
        .with_context(|| format!("onepoold at {}", args.socket.display()))?;
    println!(
        "onepool: endpoint {} submits replica jobs again at onepoold's next poll (it had {} failed start(s) in a row{})",
        args.endpoint,
        answer.was.in_a_row,
        if answer.was.backing_off { ", backing off" } else { "" }
    );
    Ok(ExitCode::SUCCESS)
}

pub fn run(args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    let mut report = json!({});
    match load_policy(&args.policy).and_then(|p| {
        let slurm = Commands { runner: SystemRunner::new(Duration::from_secs(30)) };
        Ok((p, slurm.jobs()?))
    }) {
        Ok((policy, jobs)) => {
            let uses = pool_use(&jobs);
            if args.json {
                report["pool"] = json!({
                    "total_gpus": policy.pool.total_gpus,
                    "reserved_gpus": policy.reserved_gpus(),
                    "borrowed_gpus": borrowed(&policy, &uses),
                    "classes": uses.iter().map(|(k, u)| (k.clone(), json!({
                        "running": u.running, "running_gpus": u.running_gpus,
                        "pending": u.pending, "pending_gpus": u.pending_gpus, "reclaiming": u.reclaiming,
                    }))).collect::<serde_json::Map<_, _>>(),
                });
            } else {
                print!("{}", pool_table(&policy, &uses));
            }
        }
        Err(e) => {
            failed = true;
            eprintln!("onepool: pool: {e:#}");
        }
    }
    match control_state(&args.socket) {
        Ok(state) => {
            if args.json {
                report["endpoints"] = serde_json::to_value(&state.endpoints)?;
                report["leadership"] = serde_json::to_value(&state.leadership)?;
            } else {
                println!();
                print!("{}", endpoints_table(&state));
            }
        }
        Err(e) => {
            failed = true;
            eprintln!("onepool: endpoints: {e:#}");
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(if failed { ExitCode::from(EXIT_TROUBLE) } else { ExitCode::SUCCESS })
}

fn load_policy(path: &Path) -> anyhow::Result<Policy> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the policy {}", path.display()))?;
    let loaded = policy::load(&text);
    match loaded.policy {
        Some(p) => Ok(p),
        None => bail!("{} has errors (run `onepool policy check`)", path.display()),
    }
}

/// How many of a class's generation requests the router followed (they
/// can yield their slot and move), how many it moves only by generating
/// them again (a grammar, several choices: they keep their slot), and why
/// the others were not (issue #51 item 6); `None` before any.
fn followed_line(followed: &std::collections::BTreeMap<String, u64>) -> Option<String> {
    if followed.is_empty() {
        return None;
    }
    let count = |k: &str| followed.get(k).copied().unwrap_or(0);
    let (yes, replay) = (count("yes"), count("replay"));
    let all: u64 = followed.values().sum();
    let mut not: Vec<(&String, &u64)> =
        followed.iter().filter(|(k, _)| !matches!(k.as_str(), "yes" | "replay")).collect();
    not.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let why: Vec<String> = not.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let mut line = format!("{yes} of {all} answers followed (can yield and move)");
    if replay > 0 {
        line.push_str(&format!("; {replay} move only by being generated again (keep their slot)"));
    }
    if !why.is_empty() {
        line.push_str(&format!("; not followed: {}", why.join(", ")));
    }
    Some(line)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;

    use super::*;

    /// One endpoint "chat" whose controller view is the default with
    /// `fields` set, read as a client reads the wire.
    fn with_jobs(fields: serde_json::Value) -> State {
        let mut view = serde_json::to_value(onepool_control::api::ControllerView::default()).unwrap();
        for (k, v) in fields.as_object().unwrap() {
            view[k] = v.clone();
        }
        let endpoint = json!({"name": "chat", "queued": 0, "peak_queued": 0, "replicas": [], "served_total": 0,
            "replica_jobs": view});
        serde_json::from_value(json!({ "endpoints": [endpoint] })).unwrap()
    }

    fn job(id: u32, state: &str, comment: &str, tres: &str, preempt: u64) -> JobInfo {
        serde_json::from_value(json!({
            "job_id": id, "job_state": state, "admin_comment": comment, "tres_per_job": tres,
            "node_count": 1, "preempt_time": preempt,
        }))
        .unwrap()
    }

    /// Issues #43 and #44: each endpoint's continued answers and its
    /// request classes, highest first.
    #[test]
    fn continued_answers_and_request_classes_are_shown_per_endpoint() {
        let state: State = serde_json::from_value(json!({"endpoints": [
            {"name": "chat", "queued": 3, "peak_queued": 5, "replicas": [], "served_total": 9,
             "resume": {"method": "tokens", "max_moves": 3, "moved": 4, "not_moved": 1},
             "classes": [
                {"name": "inference", "rank": 2, "queued": 0, "requests": 40, "shed": 0, "yielded": 0},
                {"name": "agents", "rank": 3, "queued": 3, "in_flight": 8, "lower": true, "requests": 900, "shed": 12, "yielded": 17,
                 "followed": {"yes": 850, "replay": 8, "several_choices": 30, "whole": 12}}]},
            {"name": "embed", "queued": 0, "peak_queued": 0, "replicas": [], "served_total": 0}
        ]}))
        .unwrap();
        let lines = resume_lines(&state);
        assert_eq!(
            lines,
            "\nchat: answers continue on another replica by token ids (llama-server: exact to the junction, recomputed after it), at most 3 move(s) each; 4 moved, 1 could not be\n\
             chat: class inference (rank 2): 0 waiting, 0 in flight, 40 requests, 0 shed, 0 yielded their slot\n\
             chat: class agents (rank 3, below the endpoint's own): 3 waiting, 8 in flight, 900 requests, 12 shed, 17 yielded their slot\n\
             chat: class agents: 850 of 900 answers followed (can yield and move); 8 move only by being generated again (keep their slot); not followed: several_choices 30, whole 12\n\
             embed: answers are not continued on another replica ([endpoint.resume] method = \"off\")\n"
        );
    }

    #[test]
    fn pool_use_and_borrowed_gpus() {
        let policy = policy::load(include_str!("../../etc/onepool.toml")).policy.unwrap();
        let jobs = [
            job(1, "RUNNING", "onepool:class=agents;tier=flexible;reclaim=immediate", "gres:gpu:4", 0),
            job(2, "RUNNING", "onepool:class=agents;tier=flexible;reclaim=immediate", "gres:gpu:4", 9),
            job(3, "RUNNING", "onepool:class=training;tier=flexible;reclaim=requeue;drain=2m", "gres:gpu:4", 0),
            job(4, "PENDING", "onepool:class=critical-training;tier=protected", "gres:gpu:8", 0),
            job(5, "RUNNING", "", "gres:gpu:4", 0),
        ];
        let uses = pool_use(&jobs);
        assert_eq!(
            uses["agents"],
            ClassUse { running: 2, running_gpus: 8, pending: 0, pending_gpus: 0, reclaiming: 1 }
        );
        assert_eq!(uses["critical-training"].pending_gpus, 8);
        assert!(!uses.contains_key(""), "jobs onepool did not classify are not counted");
        // 12 flexible GPUs run; 16 - 12 protected = 4 unprotected: 8 borrowed.
        assert_eq!(borrowed(&policy, &uses), 8);
        let t = pool_table(&policy, &uses);
        assert!(t.starts_with("POOL 16 GPUs: 4 reserved, flexible work capped at 12; borrowed now: 8 GPUs\n"), "{t}");
        assert!(
            t.lines().any(|l| l.starts_with("agents")
                && l.split_whitespace().collect::<Vec<_>>()[4..] == ["2", "8", "0", "0", "1"]),
            "{t}"
        );
    }

    #[test]
    fn control_socket_state_is_read_and_shown() {
        let dir = std::env::temp_dir().join(format!("onepool-status-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("c.sock");
        let _ = std::fs::remove_file(&sock);
        let listener = UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let n = c.read(&mut buf).unwrap();
            assert!(String::from_utf8_lossy(&buf[..n]).starts_with("GET /v1/state HTTP/1.1\r\n"));
            let body = r#"{"endpoints":[{"name":"llm","queued":3,"peak_queued":5,"served_total":41,"replicas":[{"id":1,"address":"10.0.0.5:8000","state":"draining","in_flight":2,"limit":8,"served":41,"peak_in_flight":8,"spill":false}]}]}"#;
            let chunked = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
            write!(
                c,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{chunked}"
            )
            .unwrap();
        });
        let state = control_state(&sock).unwrap();
        server.join().unwrap();
        let t = endpoints_table(&state);
        assert!(
            t.lines().nth(1).unwrap().split_whitespace().collect::<Vec<_>>()
                == ["llm", "3", "10.0.0.5:8000", "draining", "2/8", "41"],
            "{t}"
        );
        assert!(!t.contains("replicas wanted"), "no replica jobs without [endpoint.replicas]: {t}");
        let e = control_state(&dir.join("nope.sock")).unwrap_err();
        assert!(format!("{e:#}").contains("cannot reach onepoold at"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_leadership_says_who_acts_since_when_and_the_last_takeover() {
        let acting = Leadership {
            instance: "svc-b".into(),
            shared: true,
            acting: true,
            acting_since: Some(1_000.0),
            acting_instance: Some("svc-b".into()),
            takeovers: 2,
            last_takeover: Some(1_000.0),
            last_error: None,
            foreign_holder: None,
        };
        let t = leadership_line(&acting, 1_030.0);
        assert_eq!(
            t,
            "onepoold svc-b: ACTS on Slurm since 1970-01-01T00:16:40.000Z (30 s ago); \
             last takeover here 1970-01-01T00:16:40.000Z (30 s ago), 2 in all\n"
        );
        let following = Leadership {
            instance: "svc-a".into(),
            acting: false,
            acting_since: None,
            acting_instance: Some("the instance connected from 10.0.0.2:4100 (database connection 7)".into()),
            takeovers: 0,
            last_takeover: None,
            ..acting.clone()
        };
        let t = leadership_line(&following, 1_030.0);
        assert!(
            t.starts_with(
                "onepoold svc-a: follows (routes, acts on nothing); acting: the instance connected from 10.0.0.2:4100"
            ),
            "{t}"
        );
        assert!(t.contains("no takeover here yet"), "{t}");
        let squatted = Leadership {
            acting_instance: Some("database connection 9".into()),
            foreign_holder: Some("database connection 9".into()),
            ..following.clone()
        };
        let t = leadership_line(&squatted, 1_030.0);
        assert!(
            t.starts_with("onepoold svc-a: follows; NO INSTANCE ACTS: the lock is held by database connection 9"),
            "{t}"
        );
        let alone = Leadership { shared: false, ..acting };
        assert_eq!(leadership_line(&alone, 0.0), "onepoold svc-b: the only instance; acts on Slurm\n");
        // In the table, first.
        let state = State { endpoints: Vec::new(), leadership: Some(following) };
        assert!(endpoints_table(&state).starts_with("onepoold svc-a: follows"));
    }

    #[test]
    fn replica_jobs_show_their_phase_node_and_drain_deadline() {
        let state = with_jobs(json!({
        "desired": 2, "min": 1, "max": 3, "load": 7.5, "rate": 12.25, "rounds": 9, "submitted": [], "last_error": null,
            "scraped": [1, 2],
        "jobs": [
            {"job": 41, "port": 18000, "kind": "baseline", "phase": "serving", "address": "10.0.0.5:18000",
             "node": "node1", "preempted": false, "drain_deadline": null},
            {"job": 42, "port": 18002, "kind": "supplemental", "phase": "draining", "address": "10.0.0.6:18002",
             "node": "node2", "preempted": true, "drain_deadline": 1030},
            {"job": 43, "port": 18004, "kind": "supplemental", "phase": "pending", "address": null,
             "node": null, "preempted": false, "drain_deadline": null}
        ]}));
        let t = replica_jobs_table(&state, 1000);
        let lines: Vec<&str> = t.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines[0], "chat: 2 replicas wanted (min 1, max 3); load 7.5 in flight + queued; 12.2 requests/s");
        assert_eq!(lines[1], "  load from the replicas' own metrics: 1 of 2 read (the rest: the router's count)");
        let lines = [&lines[..1], &lines[2..]].concat();
        assert!(lines[1].split_whitespace().eq(["JOBID", "KIND", "PHASE", "NODE", "ADDRESS", "DRAIN"]), "{t}");
        assert!(lines[2].split_whitespace().eq(["41", "baseline", "serving", "node1", "10.0.0.5:18000", "-"]), "{t}");
        assert!(
            lines[3].ends_with("draining   node2      10.0.0.6:18002         preempted by Slurm; released within 30s"),
            "{t}"
        );
        assert!(lines[4].split_whitespace().eq(["43", "supplemental", "pending", "-", "-", "-"]), "{t}");
    }

    #[test]
    fn an_advisory_endpoint_says_what_it_would_do() {
        let state = with_jobs(json!({
            "desired": 2, "min": 1, "max": 3, "load": 9.0, "rate": 3.0, "jobs": [], "advisory": true,
            "advised": ["submit supplemental: the load wants 2 replicas, 1 live (1 serving)"]}));
        let t = replica_jobs_table(&state, 1000);
        assert!(t.contains("  advisory: decisions are logged, not carried out;\n"), "{t}");
        assert!(t.contains("    would submit supplemental: the load wants 2 replicas, 1 live (1 serving)\n"), "{t}");
        let idle = with_jobs(
            json!({"desired": 1, "min": 1, "max": 3, "load": 0.0, "rate": 0.0, "jobs": [], "advisory": true}),
        );
        assert!(replica_jobs_table(&idle, 1000)
            .contains("advisory: decisions are logged, not carried out; nothing to do now"));
        let acting = with_jobs(json!({"desired": 1, "min": 1, "max": 3, "load": 0.0, "rate": 0.0, "jobs": []}));
        assert!(!replica_jobs_table(&acting, 1000).contains("advisory"));
    }

    #[test]
    fn a_start_back_off_shows_its_cause_the_next_attempt_and_the_way_out() {
        let state = with_jobs(json!({
            "desired": 1, "min": 1, "max": 1, "load": 0.0, "rate": 0.0, "jobs": [],
            "start_failures": {"in_a_row": 3, "total": 3, "backing_off": true, "next_attempt": 1038,
                "last": {"job": 77, "at": 990, "cause": "job 77 ended before it served: FAILED, exit code 139; the model server killed by SIGSEGV; last output:\nloading model\nggml_backend_amx_mul_mat"}}
        }));
        let t = replica_jobs_table(&state, 1000);
        assert!(t.contains("  START BACK-OFF: 3 failed start(s) in a row (3 since onepoold started); next attempt in 38 s; after fixing the cause: onepool retry chat\n"), "{t}");
        assert!(t.contains("  last failed start, 10 s ago: job 77 ended before it served: FAILED, exit code 139; the model server killed by SIGSEGV; last output:\n    | loading model\n    | ggml_backend_amx_mul_mat\n"), "{t}");
        let calm = with_jobs(json!({"jobs": [],
            "start_failures": {"in_a_row": 0, "total": 0, "backing_off": false, "next_attempt": null, "last": null}}));
        assert!(!replica_jobs_table(&calm, 1000).contains("failed start"));
    }

    #[test]
    fn the_last_reclaims_are_listed_newest_first() {
        let state = with_jobs(json!({"jobs": [],
        "reclaims": [
            {"job": 50, "kind": "supplemental", "mode": "graceful", "at": 900, "released_after_s": 3.04, "taker": 52, "time_to_capacity_s": 4},
            {"job": 51, "kind": "warm", "mode": "immediate", "at": 990, "released_after_s": 0.5, "taker": null, "time_to_capacity_s": null}
        ]}));
        let t = replica_jobs_table(&state, 1000);
        assert!(
            t.contains(
                "  last reclaims (2; times to the millisecond, and each taker's class: onepool report):\n    \
                 job 51 (warm, immediate) 10 s ago: GPUs free 0.5 s after Slurm's pick was seen\n    \
                 job 50 (supplemental, graceful) 100 s ago: GPUs free 3.0 s after Slurm's pick was seen; job 52 took \
                 them, 4 s after its submission\n"
            ),
            "{t}"
        );
    }
}

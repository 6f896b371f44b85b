//! The inference part: one endpoint whose replicas onepoold ran as Slurm
//! jobs under a trace that load.py replayed, beside the same trace through
//! the simulator: the replica jobs (onepoold's log and sacct against
//! `--job-log`), the GPUs given back, and the requests' queueing delay.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use onepool_decisions::duration::parse_seconds;
use serde::Deserialize;

use super::format::{python_float, tenths};
use super::read;
use super::sacct::{self, SacctRun};
use crate::compare::ClassFigures;
use crate::input::parse_time;
use crate::job_log::{self, LoggedRun};
use crate::scenario::{self, EndpointModel};

/// What the inference part left in its folder, read.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The scenario's (first) endpoint, as written.
    pub endpoint: EndpointModel,
    pub requests: Requests,
    /// When the script stopped onepoold (epoch seconds).
    pub stopped: f64,
    /// onepoold's replica jobs by Slurm job id (epoch seconds).
    pub daemon: BTreeMap<String, ReplicaTimes>,
    /// sacct's runs of the replica jobs.
    pub replicas: Vec<SacctRun>,
    pub simulated: Vec<LoggedRun>,
    /// The simulated endpoint's class in the shared pool.
    pub shared: ClassFigures,
}

impl Inputs {
    /// `out`: the script's folder (requests.tsv, stopped, onepoold.log,
    /// replicas-sacct.txt, inference-job-log.tsv, inference.json).
    pub fn load(out: &Path, scenario: &Path) -> Result<Inputs, String> {
        let endpoint = scenario::endpoint_models(scenario)?
            .into_iter()
            .next()
            .ok_or_else(|| format!("{}: no [[endpoints]]", scenario.display()))?;
        let stopped = read(&out.join("stopped"))?;
        Ok(Inputs {
            endpoint,
            requests: read_requests(&read(&out.join("requests.tsv"))?)?,
            stopped: stopped.trim().parse().map_err(|_| format!("stopped: {stopped:?} is not a time"))?,
            daemon: replica_events(&read(&out.join("onepoold.log"))?),
            replicas: sacct::read(&read(&out.join("replicas-sacct.txt"))?, sacct::REPLICA_FORMAT)?,
            simulated: job_log::read(&read(&out.join("inference-job-log.tsv"))?)?,
            shared: shared_figures(&read(&out.join("inference.json"))?)?,
        })
    }
}

/// load.py's output: `# start EPOCH`, then a line a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Requests {
    pub start: f64,
    pub rows: Vec<Request>,
}

/// One request: its time in the trace, the epoch seconds it was sent and
/// answered (0 when never sent), its HTTP status (0: no answer) and the
/// tokens it asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub t: f64,
    pub sent: f64,
    pub done: f64,
    pub status: u16,
    pub tokens: u32,
}

fn read_requests(text: &str) -> Result<Requests, String> {
    let mut lines = text.lines();
    let head = lines.next().unwrap_or("");
    let start = head.strip_prefix("# start ").and_then(|t| t.trim().parse().ok());
    let start = start.ok_or_else(|| format!("requests.tsv: first line {head:?} is not \"# start EPOCH\""))?;
    let mut rows = Vec::new();
    for l in lines {
        let bad = || format!("requests.tsv: {l:?} is not INDEX T SENT DONE STATUS TOKENS");
        let [_, t, sent, done, status, tokens] = l.split('\t').collect::<Vec<_>>()[..] else { return Err(bad()) };
        rows.push(Request {
            t: t.parse().map_err(|_| bad())?,
            sent: sent.parse().map_err(|_| bad())?,
            done: done.parse().map_err(|_| bad())?,
            status: status.parse().map_err(|_| bad())?,
            tokens: tokens.parse().map_err(|_| bad())?,
        });
    }
    Ok(Requests { start, rows })
}

/// `onepool simulate --json`'s first class in the shared pool that served
/// requests: the endpoint's.
fn shared_figures(json: &str) -> Result<ClassFigures, String> {
    #[derive(Deserialize)]
    struct Report {
        comparison: Comparison,
    }
    #[derive(Deserialize)]
    struct Comparison {
        classes: Vec<Row>,
    }
    #[derive(Deserialize)]
    struct Row {
        shared: ClassFigures,
    }
    let r: Report = serde_json::from_str(json).map_err(|e| format!("inference.json: {e}"))?;
    r.comparison
        .classes
        .into_iter()
        .map(|c| c.shared)
        .find(|s| s.requests > 0)
        .ok_or_else(|| "inference.json: no class served requests".to_string())
}

/// A replica job's moments in onepoold's log (each the first time it is
/// logged).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicaTimes {
    pub submitted: Option<f64>,
    pub ready: Option<f64>,
    pub draining: Option<f64>,
}

/// onepoold's messages (elastic-daemon's controller and the router's
/// health checks) that mark a replica job's moments; tests/validate.rs
/// checks that onepoold still logs each.
const SUBMITTED: &str = "submitted a replica job";
const RUNNING: &str = "replica running; in the router";
const HEALTH: &str = "replica health changed";
const DRAINING: &str = "draining a replica";
pub const DAEMON_MESSAGES: [&str; 4] = [SUBMITTED, RUNNING, HEALTH, DRAINING];

/// Each replica job's moments in onepoold's log (`TIME LEVEL target:
/// message field=value ...`, the time in UTC). Readiness is logged by
/// address, so an address is tied to its job when the job joins the router.
pub fn replica_events(log: &str) -> BTreeMap<String, ReplicaTimes> {
    let mut events: BTreeMap<String, ReplicaTimes> = BTreeMap::new();
    let mut job_at: BTreeMap<String, String> = BTreeMap::new();
    for (t, msg) in log.lines().filter_map(log_line) {
        let job = field(msg, "job", |c| c.is_ascii_digit());
        let address = field(msg, "address", |c| !c.is_whitespace());
        if let (true, Some(job), Some(address)) = (msg.contains(RUNNING), job, address) {
            job_at.insert(address.to_string(), job.to_string());
        }
        let ready_job =
            address.filter(|_| msg.contains(HEALTH) && msg.contains("to=Ready")).and_then(|a| job_at.get(a));
        if let Some(j) = ready_job {
            events.entry(j.clone()).or_default().ready.get_or_insert(t);
        }
        if let (true, Some(job)) = (msg.contains(SUBMITTED), job) {
            events.entry(job.to_string()).or_default().submitted.get_or_insert(t);
        }
        if let (true, Some(job)) = (msg.contains(DRAINING), job) {
            events.entry(job.to_string()).or_default().draining.get_or_insert(t);
        }
    }
    events
}

/// A log line's time (epoch seconds) and what follows its level; `None`
/// for lines that are not `TIME(ending in Z) LEVEL ...`.
fn log_line(line: &str) -> Option<(f64, &str)> {
    let (time, rest) = line.trim().split_once(char::is_whitespace)?;
    let (level, msg) = rest.trim_start().split_once(char::is_whitespace)?;
    if level.is_empty() || !level.chars().all(|c| c.is_alphanumeric() || c == '_') {
        return None;
    }
    Some((parse_time(time.strip_suffix('Z')?)?, msg.trim_start()))
}

/// The value of the first `name=` that starts a word and is followed by
/// at least one character `value` takes, up to the first it does not.
fn field<'a>(msg: &'a str, name: &str, value: impl Fn(char) -> bool) -> Option<&'a str> {
    let key = format!("{name}=");
    let word = |c: char| c.is_alphanumeric() || c == '_';
    msg.match_indices(&key).find_map(|(i, _)| {
        if msg[..i].chars().next_back().is_some_and(word) {
            return None;
        }
        let rest = &msg[i + key.len()..];
        let v = &rest[..rest.find(|c| !value(c)).unwrap_or(rest.len())];
        (!v.is_empty()).then_some(v)
    })
}

/// A replica job on the cluster, times in seconds after the first request.
#[derive(Debug, Clone, PartialEq)]
struct RealReplica {
    class: String,
    start: Option<f64>,
    end: Option<f64>,
    state: String,
    id: String,
}

/// A simulated replica job: its class, start and end.
type SimReplica = (String, f64, f64);

/// The inference part's report, as the script prints it.
pub fn report(inp: &Inputs) -> Result<String, String> {
    let t0 = inp.requests.start;
    let startup = parse_seconds(&inp.endpoint.startup).ok_or_else(|| {
        format!("endpoint {}: startup {:?} is not a duration", inp.endpoint.name, inp.endpoint.startup)
    })?;
    let trace_end = inp.requests.rows.last().map(|r| r.t).ok_or("requests.tsv: no requests")?;
    let daemon: BTreeMap<&str, ReplicaTimes> = inp
        .daemon
        .iter()
        .map(|(id, e)| {
            let rel = |x: Option<f64>| x.map(|v| v - t0);
            (id.as_str(), ReplicaTimes { submitted: rel(e.submitted), ready: rel(e.ready), draining: rel(e.draining) })
        })
        .collect();
    let real = real_replicas(&inp.replicas, t0);
    let mut sim: Vec<SimReplica> = inp.simulated.iter().map(|r| (r.class.clone(), r.start, r.end)).collect();
    sim.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut out = String::new();
    let _ = write!(
        out,
        "\nReplica jobs (s after the first request; real: submitted, ready and draining from onepoold's log, start and end\n\
         from sacct (1 s resolution); simulated: --job-log, ready = start + startup ({}), a warm replica at once).\n\
         The trace ends at {trace_end:.0} s; then the simulator retires every replica, and the real run stops onepoold\n\
         (at {:.0} s) and cancels the replicas left. Matched by class, in the order they started:\n\n",
        inp.endpoint.startup,
        inp.stopped - t0
    );
    replica_table(&real, &sim, &daemon, startup, &mut out);
    given_back(&real, &sim, trace_end, &mut out);
    time_to_ready(&real, &daemon, &inp.endpoint.startup, &mut out);
    send_lag(&inp.requests, &mut out);
    delays(&inp.requests, &inp.shared, 1.0 / inp.endpoint.decode_tokens_per_s, &mut out);
    Ok(out)
}

/// sacct's replica jobs, their class from their QOS, started ones in start
/// order and then any that never started.
fn real_replicas(replicas: &[SacctRun], t0: f64) -> Vec<RealReplica> {
    let mut real: Vec<RealReplica> = replicas
        .iter()
        .map(|r| RealReplica {
            class: r.qos.replace("op-", ""),
            start: r.start.map(|v| v - t0),
            end: r.end.map(|v| v - t0),
            state: r.state.clone(),
            id: r.id.clone(),
        })
        .collect();
    real.sort_by(|a, b| {
        let key = |r: &RealReplica| (r.start.is_none(), r.start.unwrap_or(0.0));
        let (ka, kb) = (key(a), key(b));
        ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1))
    });
    real
}

/// Real and simulated replica jobs of each class, the k-th started beside
/// the k-th.
fn replica_table(
    real: &[RealReplica],
    sim: &[SimReplica],
    daemon: &BTreeMap<&str, ReplicaTimes>,
    startup: f64,
    out: &mut String,
) {
    out.push_str("| # | class | real submitted | sim submitted | real start | sim start | real ready | sim ready | real draining | real end | sim end | real state |\n");
    out.push_str("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
    let classes: BTreeSet<&str> =
        real.iter().map(|r| r.class.as_str()).chain(sim.iter().map(|s| s.0.as_str())).collect();
    let mut n = 0;
    for class in classes {
        let rs: Vec<&RealReplica> = real.iter().filter(|r| r.class == class).collect();
        let ss: Vec<&SimReplica> = sim.iter().filter(|s| s.0 == class).collect();
        for k in 0..rs.len().max(ss.len()) {
            let (r, s) = (rs.get(k), ss.get(k));
            let none = ReplicaTimes::default();
            let e = r.and_then(|r| daemon.get(r.id.as_str())).unwrap_or(&none);
            // A replica serving when the trace starts (warm) is ready at once.
            let sim_ready = s.map(|s| if s.1 <= 0.0 { s.1 } else { s.1 + startup });
            n += 1;
            let _ = writeln!(
                out,
                "| {n} | {class} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                tenths(e.submitted),
                tenths(s.map(|s| s.1)),
                tenths(r.and_then(|r| r.start)),
                tenths(s.map(|s| s.1)),
                tenths(e.ready),
                tenths(sim_ready),
                tenths(e.draining),
                tenths(r.and_then(|r| r.end)),
                tenths(s.map(|s| s.2)),
                r.map_or("-", |r| r.state.as_str()),
            );
        }
    }
}

fn joined(v: impl Iterator<Item = f64>) -> String {
    v.map(|t| format!("{t:.1}")).collect::<Vec<_>>().join(", ")
}

/// Scale-downs: replica jobs that ended before the trace did.
fn given_back(real: &[RealReplica], sim: &[SimReplica], trace_end: f64, out: &mut String) {
    let mut rdown: Vec<f64> = real.iter().filter_map(|r| r.end).filter(|e| *e < trace_end).collect();
    let mut sdown: Vec<f64> = sim.iter().map(|s| s.2).filter(|e| *e < trace_end).collect();
    rdown.sort_by(f64::total_cmp);
    sdown.sort_by(f64::total_cmp);
    let _ = writeln!(
        out,
        "\nGPUs given back before the trace ended (scale-downs), in time order: real {}; simulated {}",
        joined(rdown.into_iter()),
        joined(sdown.into_iter())
    );
}

/// From a replica's GPUs (sacct's start) to ready in the router, for the
/// replicas started during the run (not the one already serving).
fn time_to_ready(real: &[RealReplica], daemon: &BTreeMap<&str, ReplicaTimes>, startup: &str, out: &mut String) {
    let ups: Vec<f64> =
        real.iter().filter_map(|r| Some(daemon.get(r.id.as_str())?.ready? - r.start.filter(|s| *s > 0.0)?)).collect();
    if !ups.is_empty() {
        let _ = writeln!(
            out,
            "real time from GPUs (sacct start) to ready (onepoold), replicas started during the run: {} s; the scenario's startup: {startup}",
            joined(ups.into_iter())
        );
    }
}

fn send_lag(req: &Requests, out: &mut String) {
    let lag = req.rows.iter().filter(|r| r.sent > 0.0).map(|r| r.sent - req.start - r.t).reduce(f64::max);
    let lag = lag.map_or_else(|| "-".to_string(), |l| format!("{l:.3}"));
    let _ = writeln!(out, "real send lag behind the trace: max {lag} s");
}

/// The real queueing delays (the answer's time less the stand-in server's
/// own time for the tokens) beside the simulated ones.
fn delays(req: &Requests, sim: &ClassFigures, per_token: f64, out: &mut String) {
    let served: Vec<&Request> = req.rows.iter().filter(|r| r.status == 200).collect();
    let mut d: Vec<f64> = served.iter().map(|r| (r.done - r.sent - f64::from(r.tokens) * per_token).max(0.0)).collect();
    d.sort_by(f64::total_cmp);
    let _ = write!(
        out,
        "\nRequests, queueing delay (s; real = answer time - sent - generated tokens x {} s):\n\n",
        python_float(per_token)
    );
    out.push_str(
        "| | requests | not served | p50 | p90 | p99 | max |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let _ = writeln!(
        out,
        "| real (onepoold) | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
        req.rows.len(),
        req.rows.len() - served.len(),
        quantile(&d, 0.5),
        quantile(&d, 0.9),
        quantile(&d, 0.99),
        d.last().copied().unwrap_or(0.0)
    );
    let _ = writeln!(
        out,
        "| simulated | {} | {} | {:.2} | {:.2} | {:.2} | - |",
        sim.requests,
        sim.failed_requests + sim.unserved,
        sim.p50_queue_delay_s,
        sim.p90_queue_delay_s,
        sim.p99_queue_delay_s
    );
}

/// The value at rank ceil(p x n) of sorted `v` (p x n taken to a
/// thousandth first, as the report always has), 0 when empty.
fn quantile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let thousandths = (p * v.len() as f64 * 1000.0) as usize;
    let rank = thousandths.div_ceil(1000).min(v.len());
    v[rank.saturating_sub(1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_is_ready_when_its_address_turns_ready_after_it_joined_the_router() {
        let log = "\
2025-12-02T16:20:00.500000Z  INFO act: submitted a replica job endpoint=chat job=61 port=40002 replicas=1 kind=Supplemental
2025-12-02T16:20:01.000000Z  INFO health: replica health changed endpoint=chat address=10.0.0.2:40002 from=Unknown to=Ready
2025-12-02T16:20:02.000000Z  INFO observe: replica running; in the router endpoint=chat job=61 address=10.0.0.2:40002
2025-12-02T16:20:04.250000Z  INFO health: replica health changed endpoint=chat address=10.0.0.2:40002 from=Starting to=Ready
2025-12-02T16:20:09.000000Z  INFO health: replica health changed endpoint=chat address=10.0.0.2:40002 from=Busy to=Ready
2025-12-02T16:20:10.000000Z  INFO act: draining a replica endpoint=chat replica_job=99 job=61 port=40002
2025-12-02T16:20:11.000000Z  INFO act: draining a replica endpoint=chat job=61 port=40002
2025-12-02 16:20:12 INFO act: submitted a replica job endpoint=chat job=62
";
        let t = |s: &str| parse_time(s).unwrap();
        let e = replica_events(log);
        assert_eq!(e.keys().collect::<Vec<_>>(), ["61"]);
        assert_eq!(
            e["61"],
            ReplicaTimes {
                submitted: Some(t("2025-12-02T16:20:00.5")),
                ready: Some(t("2025-12-02T16:20:04.25")),
                draining: Some(t("2025-12-02T16:20:10")),
            }
        );
    }

    #[test]
    fn fields_start_a_word_and_take_only_their_characters() {
        let digits = |c: char| c.is_ascii_digit();
        assert_eq!(field("replica_job=9 job=abc job=42, port=1", "job", digits), Some("42"));
        assert_eq!(field("subjob=42", "job", digits), None);
        assert_eq!(field("address=[::1]:80 x=1", "address", |c| !c.is_whitespace()), Some("[::1]:80"));
    }

    #[test]
    fn quantiles_take_the_rank_ceil_p_times_n() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!([quantile(&v, 0.5), quantile(&v, 0.9), quantile(&v, 0.99)], [5.0, 9.0, 10.0]);
        assert_eq!(quantile(&v[..7], 0.9), 7.0);
        assert_eq!(quantile(&v[..3], 0.5), 2.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn requests_need_load_py_s_start_line() {
        let r = read_requests("# start 100.5\n0\t0.000\t100.51\t100.70\t200\t44\n1\t5.893\t0.0\t0.0\t0\t16\n").unwrap();
        assert_eq!((r.start, r.rows.len(), r.rows[0].tokens, r.rows[1].status), (100.5, 2, 44, 0));
        assert!(read_requests("0\t0.000\t100.51\t100.70\t200\t44\n").unwrap_err().contains("# start EPOCH"));
    }

    #[test]
    fn the_simulated_side_is_the_first_class_that_served_requests() {
        let json = r#"{"comparison": {"classes": [
            {"shared": {"class": "inference-baseline", "requests": 0}},
            {"shared": {"class": "inference", "requests": 601, "p99_queue_delay_s": 0.38}}]}}"#;
        let f = shared_figures(json).unwrap();
        assert_eq!((f.class.as_str(), f.requests, f.p99_queue_delay_s), ("inference", 601, 0.38));
        let none = r#"{"comparison": {"classes": [{"shared": {"class": "agents", "requests": 0}}]}}"#;
        assert_eq!(shared_figures(none).unwrap_err(), "inference.json: no class served requests");
    }
}

//! `onepool policy render`: the Slurm configuration that enforces the
//! policy, whole or (`--against-live`) only what the cluster lacks.

use std::process::ExitCode;

use onepool_decisions::policy::load;
use onepool_decisions::render::live::Changes;
use onepool_decisions::render::{render, Rendered};

use super::args::{Format, RenderArgs};
use super::check::summary;
use super::json::{self, Parts};
use super::source::Source;
use onepool_slurm_commands::{live, Runner, SystemRunner};

/// How long one Slurm command may take: slurmctld or slurmdbd not
/// answering shows as a clear error instead of a hang.
const COMMAND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What the command prints, kept apart from printing so tests can run it
/// against a fake cluster.
pub struct Output {
    pub stdout: String,
    pub stderr: Vec<String>,
    pub failed: bool,
}

pub fn run(src: &Source, args: &RenderArgs) -> anyhow::Result<ExitCode> {
    let out = output(src, args, &SystemRunner::new(COMMAND_TIMEOUT))?;
    print!("{}", out.stdout);
    for line in &out.stderr {
        eprintln!("{line}");
    }
    Ok(if out.failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

pub fn output(src: &Source, args: &RenderArgs, runner: &dyn Runner) -> anyhow::Result<Output> {
    let loaded = load(&src.text);
    // Warnings are shown but do not stop rendering.
    let mut stderr = loaded.render(&src.name, &src.text);
    let policy = match &loaded.policy {
        Some(p) if loaded.errors().next().is_none() => p,
        _ => {
            stderr.push(format!(
                "{}; nothing rendered: fix the errors first (onepool policy check {})",
                summary(&src.name, &loaded),
                src.name
            ));
            return Ok(Output { stdout: String::new(), stderr, failed: true });
        }
    };
    let rendered = render(policy);
    let parts = Parts { sacctmgr: !args.slurm_conf_only, slurm_conf: !args.sacctmgr_only };
    if !args.against_live {
        let stdout = match args.format {
            Format::Json => json_text(&json::rendered(&src.name, &rendered, parts))?,
            Format::Text => rendered_text(&src.name, &rendered, parts),
        };
        return Ok(Output { stdout, stderr, failed: false });
    }
    let changes = live::changes(&rendered, runner)?;
    stderr.extend(changes.problems.iter().map(|d| d.render("live cluster", "")));
    let stdout = match args.format {
        Format::Json => json_text(&json::changes(&src.name, &changes, parts))?,
        Format::Text => changes_text(&src.name, &changes, parts),
    };
    Ok(Output { stdout, stderr, failed: changes.has_errors() })
}

fn json_text(v: &serde_json::Value) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(v)? + "\n")
}

const SACCTMGR_NOTE: &str = "\
# 1. QOS, one per class: run these first, slurm.conf below names them.
#    `sacctmgr add` refuses a QOS that exists: on a cluster set up before,
#    `onepool policy render --against-live` prints only what to change.
";

const SLURM_CONF_NOTE: &str = "\
# 2. slurm.conf: save these lines as /etc/slurm/onepool-slurm.conf, add
#    `Include /etc/slurm/onepool-slurm.conf` at the end of slurm.conf and
#    restart slurmctld. Where slurm.conf sets one of these keys too, the
#    last one read wins: merge them (--against-live prints merged values).
";

pub fn rendered_text(name: &str, r: &Rendered, parts: Parts) -> String {
    match (parts.sacctmgr, parts.slurm_conf) {
        (true, false) => format!("# onepool QOS for {name}, in the order to create them\n\n{}", r.sacctmgr_text()),
        (false, true) => format!("# onepool slurm.conf settings for {name}\n\n{}", r.slurm_conf_text()),
        _ => format!(
            "# onepool: Slurm configuration for {name}\n\n{SACCTMGR_NOTE}\n{}\n{SLURM_CONF_NOTE}\n{}",
            r.sacctmgr_text(),
            r.slurm_conf_text()
        ),
    }
}

pub fn changes_text(name: &str, c: &Changes, parts: Parts) -> String {
    let mut sections = Vec::new();
    if parts.sacctmgr && !c.qos.is_empty() {
        sections.push(format!("# QOS (run these first):\n\n{}", c.sacctmgr_text()));
    }
    let conf = c.slurm_conf_text();
    if parts.slurm_conf && !conf.is_empty() {
        sections.push(format!(
            "# slurm.conf (set these where slurm.conf or its Include has them, then restart slurmctld):\n\n{conf}"
        ));
    }
    if sections.is_empty() {
        let scope = match (parts.sacctmgr, parts.slurm_conf) {
            (true, false) => " in the QOS",
            (false, true) => " in slurm.conf",
            _ => "",
        };
        return if c.has_errors() {
            format!("# nothing onepool can change{scope}: fix the problems reported on stderr\n")
        } else {
            format!("# the live cluster already matches {name}{scope}: nothing to change\n")
        };
    }
    format!("# onepool: changes that bring the live cluster to {name}\n\n{}", sections.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use onepool_slurm_commands::fake::samples::{CONFIG, PARTITIONS, QOS};
    use onepool_slurm_commands::fake::FakeRunner;

    const SAMPLE: &str = include_str!("../../../etc/onepool.toml");

    fn args(against_live: bool, format: Format) -> RenderArgs {
        RenderArgs { file: None, format, against_live, sacctmgr_only: false, slurm_conf_only: false }
    }

    fn sample() -> Source {
        Source { name: "etc/onepool.toml".into(), text: SAMPLE.into() }
    }

    #[test]
    fn against_live_prints_only_the_changes() {
        let runner = FakeRunner::new(QOS, CONFIG, PARTITIONS);
        let out = output(&sample(), &args(true, Format::Text), &runner).unwrap();
        assert!(!out.failed && out.stderr.is_empty(), "{:?}", out.stderr);
        let text = out.stdout;
        assert!(text.starts_with("# onepool: changes that bring the live cluster to etc/onepool.toml\n"), "{text}");
        assert!(text.contains("\nsacctmgr -i add qos op-inference set Priority=2000 "), "{text}");
        assert!(!text.contains("qos op-agents"), "op-agents already matches:\n{text}");
        assert!(text.contains("(now: lua)\nJobSubmitPlugins=lua,onepool\n"), "{text}");
        assert!(!text.contains("PriorityType"), "{text}");
        assert!(text.contains(
            "PartitionName=gpu-flex Nodes=ALL QOS=onepool-flexible-cap AllowQos=op-training,op-inference,op-agents MaxTime=INFINITE State=UP\n"
        ));
        assert!(
            text.ends_with("`scontrol update PartitionName=gpu AllowQos=op-critical-training,op-inference-baseline` applies it until slurmctld restarts\n"),
            "{text}"
        );
    }

    #[test]
    fn against_live_as_json_and_problems_fail_the_command() {
        let runner = FakeRunner::new("normal|0||cluster|00:00:00||||\n", CONFIG, "PartitionName=other\n");
        let out = output(&sample(), &args(true, Format::Json), &runner).unwrap();
        assert!(out.failed);
        assert_eq!(
            out.stderr,
            ["live cluster: error: the pool's partition \"gpu\" does not exist on the cluster; define it in slurm.conf, or correct pool.partitions in the policy"]
        );
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["up_to_date"], false);
        assert_eq!(v["sacctmgr"].as_array().unwrap().len(), 6);
        assert_eq!(v["sacctmgr"][0][4], "op-agents");
        assert_eq!(v["slurm_conf"][0]["value"], "lua,onepool");
        assert_eq!(v["partition"]["change"], "create");
        assert_eq!(v["problems"][0]["severity"], "error");
    }

    /// `sacctmgr show qos` of a cluster that has the sample's QOS already.
    fn matching_qos() -> String {
        onepool_slurm_commands::fake::samples::qos_matching(&onepool_decisions::render::render(
            &onepool_decisions::policy::load(SAMPLE).policy.unwrap(),
        ))
    }

    #[test]
    fn a_cluster_that_matches_needs_nothing() {
        let config = CONFIG.replace("= lua", "= lua,onepool");
        let partitions = format!(
            "{}PartitionName=gpu-flex QoS=onepool-flexible-cap AllowQos=op-training,op-inference,op-agents\n",
            PARTITIONS.replace("QoS=N/A", "QoS=N/A AllowQos=op-critical-training,op-inference-baseline")
        );
        let runner = FakeRunner::new(&matching_qos(), &config, &partitions);
        let out = output(&sample(), &args(true, Format::Text), &runner).unwrap();
        assert_eq!(out.stdout, "# the live cluster already matches etc/onepool.toml: nothing to change\n");
        assert!(!out.failed && out.stderr.is_empty());

        // Matching QOS, but slurm.conf lacks the plugin: with --sacctmgr-only
        // there is nothing to do.
        let runner = FakeRunner::new(&matching_qos(), CONFIG, &partitions);
        let qos_only = RenderArgs { sacctmgr_only: true, ..args(true, Format::Text) };
        let out = output(&sample(), &qos_only, &runner).unwrap();
        assert_eq!(out.stdout, "# the live cluster already matches etc/onepool.toml in the QOS: nothing to change\n");

        // Nothing to change, but the pool's partition is missing.
        let runner = FakeRunner::new(
            &matching_qos(),
            &config,
            "PartitionName=gpu-flex QoS=onepool-flexible-cap AllowQos=op-training,op-inference,op-agents\n",
        );
        let out = output(&sample(), &args(true, Format::Text), &runner).unwrap();
        assert_eq!(out.stdout, "# nothing onepool can change: fix the problems reported on stderr\n");
        assert!(out.failed);
        assert_eq!(out.stderr.len(), 1, "{:?}", out.stderr);
    }

    #[test]
    fn a_policy_with_errors_is_not_rendered() {
        let src = Source { name: "p.toml".into(), text: SAMPLE.replace("rank = 3", "rank = 2") };
        let out = output(&src, &args(false, Format::Text), &FakeRunner::new("", "", "")).unwrap();
        assert!(out.failed);
        assert_eq!(out.stdout, "");
        assert!(
            out.stderr[0].starts_with("p.toml:66:8: error: rank 2 is used by classes \"agents\" and \"inference\""),
            "{:?}",
            out.stderr
        );
        assert_eq!(
            out.stderr[1],
            "p.toml: 1 error; nothing rendered: fix the errors first (onepool policy check p.toml)"
        );
    }
}

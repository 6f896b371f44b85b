//! A live cluster's configuration, read through Slurm's own commands and
//! compared with what the policy renders.

use onepool_decisions::render::live::{
    self, parse_sacctmgr_assoc, parse_sacctmgr_qos, parse_scontrol_config, parse_scontrol_partitions, Changes,
};
use onepool_decisions::render::Rendered;

use crate::runner::{CommandError, Runner};

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("`{cmd}`: {message}")]
    Output { cmd: String, message: String },
}

/// What the cluster runs with now, compared with `rendered`.
pub fn changes(rendered: &Rendered, runner: &dyn Runner) -> Result<Changes, LiveError> {
    let output =
        |argv: &[&str], e: &dyn std::fmt::Display| LiveError::Output { cmd: argv.join(" "), message: e.to_string() };
    let qos = parse_sacctmgr_qos(&runner.run(live::SHOW_QOS)?).map_err(|e| output(live::SHOW_QOS, &e))?;
    let config = parse_scontrol_config(&runner.run(live::SHOW_CONFIG)?);
    if config.values.is_empty() {
        return Err(output(live::SHOW_CONFIG, &"printed no settings; is this the Slurm controller's configuration?"));
    }
    let partitions = parse_scontrol_partitions(&runner.run(live::SHOW_PARTITIONS)?)
        .map_err(|e| output(live::SHOW_PARTITIONS, &e))?;
    let assocs = parse_sacctmgr_assoc(&runner.run(live::SHOW_ASSOC)?).map_err(|e| output(live::SHOW_ASSOC, &e))?;
    Ok(live::diff(rendered, &qos, &config, &partitions).with_associations(rendered, &assocs))
}

#[cfg(test)]
pub mod tests {
    use onepool_decisions::policy::load;
    use onepool_decisions::render::render;

    use super::*;
    use crate::fake::samples::{CONFIG, PARTITIONS, QOS};
    use crate::fake::FakeRunner;

    const SAMPLE: &str = include_str!("../../etc/onepool.toml");

    fn sample() -> Rendered {
        render(&load(SAMPLE).policy.unwrap())
    }

    #[test]
    fn live_output_becomes_the_changes() {
        let c = changes(&sample(), &FakeRunner::new(QOS, CONFIG, PARTITIONS)).unwrap();
        let names: Vec<&str> = c.qos.iter().map(|q| q.name()).collect();
        // op-agents already matches; normal is the site's.
        assert_eq!(
            names,
            ["op-inference", "op-training", "op-critical-training", "op-inference-baseline", "onepool-flexible-cap"]
        );
        let conf: Vec<String> = c.slurm_conf.iter().map(|c| format!("{}={}", c.key, c.value)).collect();
        assert_eq!(conf, ["JobSubmitPlugins=lua,onepool"]);
        assert!(matches!(c.partition, Some(live::PartitionChange::Missing { .. })));
    }

    #[test]
    fn a_failing_command_is_an_error_naming_it() {
        let mut runner = FakeRunner::new(QOS, CONFIG, PARTITIONS);
        runner.answers.insert(
            live::SHOW_QOS.join(" "),
            Err("sacctmgr: error: Problem talking to the database: Connection refused".into()),
        );
        let e = changes(&sample(), &runner).unwrap_err().to_string();
        assert!(e.contains("sacctmgr -n -P show qos") && e.contains("Connection refused"), "{e}");
    }

    #[test]
    fn output_in_an_unexpected_format_is_an_error() {
        let e = changes(&sample(), &FakeRunner::new("normal|0\n", CONFIG, PARTITIONS)).unwrap_err().to_string();
        assert!(e.contains("line 1: expected 9 '|'-separated fields"), "{e}");
        let e = changes(&sample(), &FakeRunner::new(QOS, "nothing here\n", PARTITIONS)).unwrap_err().to_string();
        assert!(e.contains("printed no settings"), "{e}");
    }

    #[test]
    fn associations_without_the_class_qos_get_a_grant_and_a_missing_service_account_is_added() {
        let mut runner = FakeRunner::new(QOS, CONFIG, PARTITIONS);
        // A site before onepool: only its own QOS, no onepool account.
        runner
            .answers
            .insert(live::SHOW_ASSOC.join(" "), Ok("root||normal\nroot|root|normal\nresearch|ann|normal\n".into()));
        let c = changes(&sample(), &runner).unwrap();
        assert_eq!(c.grants.len(), 1, "{:?}", c.grants);
        let text = c.sacctmgr_text();
        assert!(
            text.contains(
                "sacctmgr -i modify account where name=root set qos+=op-agents,op-inference,op-training,op-critical-training,op-inference-baseline\n"
            ),
            "{text}"
        );
        assert!(text.contains("sacctmgr -i add user onepool Account=onepool\n"), "{text}");
        // Grants after the QOS they name; the service account last.
        let cmds: Vec<String> = c.sacctmgr_commands().iter().map(|a| a.join(" ")).collect();
        let at = |p: &str| cmds.iter().position(|c| c.starts_with(p)).unwrap();
        assert!(at("sacctmgr -i add qos op-inference-baseline") < at("sacctmgr -i modify account"));
        assert!(at("sacctmgr -i modify account") < at("sacctmgr -i add user onepool"));
        assert!(!c.is_empty());
    }

    #[test]
    fn unreadable_association_output_is_an_error_naming_the_command() {
        let mut runner = FakeRunner::new(QOS, CONFIG, PARTITIONS);
        runner.answers.insert(live::SHOW_ASSOC.join(" "), Ok("root|normal\n".into()));
        let e = changes(&sample(), &runner).unwrap_err().to_string();
        assert!(e.contains("sacctmgr -n -P show assoc") && e.contains("expected 3 fields"), "{e}");
    }
}

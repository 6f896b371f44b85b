//! Canned answers in place of Slurm's commands, for tests of code that
//! reads a live cluster (here and in the crates that use this one).

use std::collections::HashMap;

use onepool_decisions::render::live;

use crate::runner::{CommandError, Runner};

/// Answers each command with canned output, or fails like Slurm would.
pub struct FakeRunner {
    pub answers: HashMap<String, Result<String, String>>,
}

impl FakeRunner {
    pub fn new(qos: &str, config: &str, partitions: &str) -> FakeRunner {
        let mut answers = HashMap::new();
        answers.insert(live::SHOW_QOS.join(" "), Ok(qos.to_string()));
        answers.insert(live::SHOW_CONFIG.join(" "), Ok(config.to_string()));
        answers.insert(live::SHOW_PARTITIONS.join(" "), Ok(partitions.to_string()));
        answers.insert(live::SHOW_ASSOC.join(" "), Ok(samples::ASSOC.to_string()));
        FakeRunner { answers }
    }
}

impl Runner for FakeRunner {
    fn run(&self, argv: &[&str]) -> Result<String, CommandError> {
        match self.answers.get(&argv.join(" ")) {
            Some(Ok(out)) => Ok(out.clone()),
            Some(Err(e)) => Err(CommandError::Failed {
                cmd: argv.join(" "),
                status: "exit status: 1".into(),
                stdout: String::new(),
                stderr: e.clone(),
            }),
            None => panic!("unexpected command {argv:?}"),
        }
    }
}

/// `scontrol show config`, `scontrol -o show partition` and `sacctmgr show
/// qos` output in the shape Slurm 22.05 prints it.
pub mod samples {
    pub const CONFIG: &str = "\
Configuration data as of 2024-05-01T10:00:00
AccountingStorageEnforce = associations,limits,qos
AccountingStoreFlags    = job_comment
JobSubmitPlugins        = lua
PreemptExemptTime       = 00:02:00
PreemptMode             = CANCEL
PreemptType             = preempt/qos
PriorityType            = priority/multifactor
PriorityWeightQOS       = 10000
PrologFlags             = Alloc,Contain
SlurmctldParameters     = preempt_send_user_signal
";

    /// The associations of a site where the sample policy's class QOS are
    /// granted at the root and onepoold's account exists.
    pub const ASSOC: &str = "\
root||normal,op-agents,op-critical-training,op-inference,op-inference-baseline,op-training
root|root|normal,op-agents,op-critical-training,op-inference,op-inference-baseline,op-training
onepool||normal,op-agents,op-critical-training,op-inference,op-inference-baseline,op-training
onepool|onepool|normal,op-agents,op-critical-training,op-inference,op-inference-baseline,op-training
research|ann|normal,op-agents,op-critical-training,op-inference,op-inference-baseline,op-training
";

    pub const PARTITIONS: &str = "PartitionName=gpu Nodes=node[1-4] QoS=N/A State=UP\n";

    pub const QOS: &str = "\
normal|0||cluster|00:00:00||||
op-agents|1000||cancel|00:00:00||gres/gpu=4|DenyOnLimit|
";

    /// `sacctmgr show qos` of a cluster that already has every QOS the
    /// policy renders, as rendered.
    pub fn qos_matching(rendered: &onepool_decisions::render::Rendered) -> String {
        rendered.all_qos().map(|q| onepool_decisions::render::live::sacctmgr_line(q) + "\n").collect()
    }
}

//! What went wrong in one poll of a replica controller, kept typed up to
//! the line that logs it and the view that reports it, so that whether a
//! Slurm failure may pass by itself (slurmctld busy or restarting) is
//! decided once, by the Slurm adapter, and not read back out of a string.

use onepool_slurm_commands::adapter::SlurmError;

#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    /// A Slurm command failed.
    #[error("{}{source}{}", prefix(context), if source.is_retryable() { " (retryable)" } else { "" })]
    Slurm { context: Option<String>, source: SlurmError },
    /// The blocking thread running a Slurm command panicked or was cancelled.
    #[error("{}the Slurm call failed: {source}", prefix(context))]
    Call { context: Option<String>, source: tokio::task::JoinError },
    /// Replica control stopped for good (the reason says why and what to do).
    #[error("{0}")]
    Halted(String),
    #[error("no free port pair left in port_range")]
    NoFreePorts,
    /// This instance stopped acting on Slurm between the decision and the
    /// command (its lock was lost or not confirmed within the fence).
    #[error("not carried out: this onepoold no longer acts on Slurm (another instance may)")]
    NotActing,
    /// Several actions of one poll failed; each is kept.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Several(Vec<RoundError>),
}

fn prefix(context: &Option<String>) -> String {
    context.as_deref().map(|c| format!("{c}: ")).unwrap_or_default()
}

impl RoundError {
    /// Whether the next poll may well succeed without anyone acting:
    /// every failure in it is a retryable Slurm error.
    pub fn is_retryable(&self) -> bool {
        match self {
            RoundError::Slurm { source, .. } => source.is_retryable(),
            RoundError::Several(all) => all.iter().all(RoundError::is_retryable),
            RoundError::Call { .. } | RoundError::Halted(_) | RoundError::NoFreePorts => false,
            // The acting instance carries it out.
            RoundError::NotActing => true,
        }
    }

    /// The same error, saying which action it stopped.
    pub fn during(self, what: impl Into<String>) -> RoundError {
        match self {
            RoundError::Slurm { source, .. } => RoundError::Slurm { context: Some(what.into()), source },
            RoundError::Call { source, .. } => RoundError::Call { context: Some(what.into()), source },
            other => other,
        }
    }

    /// Ok when `errors` is empty, else one error holding them all.
    pub fn all(mut errors: Vec<RoundError>) -> Result<(), RoundError> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(RoundError::Several(errors)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use onepool_slurm_commands::runner::CommandError;

    fn slurm(retryable: bool) -> RoundError {
        let source = if retryable {
            SlurmError::Command(CommandError::Failed {
                cmd: "squeue".into(),
                status: "exit status: 1".into(),
                stdout: String::new(),
                stderr: "slurm_load_jobs error: Unable to contact slurm controller (connect failure)".into(),
            })
        } else {
            SlurmError::Command(CommandError::Failed {
                cmd: "scancel".into(),
                status: "exit status: 1".into(),
                stdout: String::new(),
                stderr: "scancel: error: Kill job error on job id 7: Invalid job id specified".into(),
            })
        };
        RoundError::Slurm { context: None, source }
    }

    #[test]
    fn messages_name_the_action_and_whether_it_may_pass() {
        let e = slurm(true).during("cancelling replica job 7");
        assert!(e.is_retryable());
        let text = e.to_string();
        assert!(text.starts_with("cancelling replica job 7: "), "{text}");
        assert!(text.ends_with(" (retryable)"), "{text}");
        let e = slurm(false);
        assert!(!e.is_retryable());
        assert!(!e.to_string().ends_with("(retryable)"));
    }

    #[test]
    fn several_are_retryable_only_if_each_is() {
        assert!(RoundError::all(vec![slurm(true), slurm(true)]).unwrap_err().is_retryable());
        let mixed = RoundError::all(vec![slurm(true), RoundError::NoFreePorts]).unwrap_err();
        assert!(!mixed.is_retryable());
        assert!(mixed.to_string().ends_with("; no free port pair left in port_range"), "{mixed}");
        assert!(RoundError::all(Vec::new()).is_ok());
    }
}

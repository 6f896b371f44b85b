//! plugstack.conf arguments: `required /path/spank_onepool.so KEY=VALUE...`.
//! Every bad argument is reported (in the log of the daemon or command that
//! loaded the plugin) with the accepted forms.

use std::path::PathBuf;
use std::time::Duration;

use onepool_decisions::handoff::DirtyPrologAction;
use onepool_decisions::{duration, names};
use onepool_gpu_inventory::SourceSpec;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginArgs {
    /// Class given to jobs submitted without `--workload` (else the
    /// slurmctld plugin's policy default applies).
    pub default_workload: Option<String>,
    /// Where GPU processes come from: NVML, or a fake file on GPU-less dev
    /// clusters (a test aid), or nowhere (check off).
    pub gpu_source: SourceSpec,
    /// How long the epilog/prolog waits for GPUs to be released.
    pub handoff_timeout: Duration,
    pub prolog_dirty: DirtyPrologAction,
    /// Fail prolog/epilog when NVML is missing (default: skip the check).
    pub require_gpu_source: bool,
    /// gres.conf that maps Slurm's GPU indices to device files (default:
    /// beside slurm.conf).
    pub gres_conf: Option<PathBuf>,
    /// The hand-off check never kills a process any of whose uids is below
    /// this (default: from /etc/login.defs, read at each check).
    pub handoff_min_uid: Option<u32>,
}

impl Default for PluginArgs {
    fn default() -> Self {
        PluginArgs {
            default_workload: None,
            gpu_source: SourceSpec::Nvml,
            handoff_timeout: Duration::from_secs(30),
            prolog_dirty: DirtyPrologAction::Fail,
            require_gpu_source: false,
            gres_conf: None,
            handoff_min_uid: None,
        }
    }
}

pub const KNOWN: &str = "default_workload=CLASS, gpu_source=nvml|fake:PATH|none, handoff_timeout=DURATION, \
                         prolog_dirty=fail|run, require_gpu_source=yes|no, gres_conf=PATH, \
                         handoff_min_uid=UID";

pub fn parse<'a>(args: impl IntoIterator<Item = &'a str>) -> Result<PluginArgs, Vec<String>> {
    let mut out = PluginArgs::default();
    let mut errors = Vec::new();
    for a in args {
        let mut bad = |why: String| errors.push(format!("plugstack.conf argument {a:?}: {why}"));
        match a.split_once('=') {
            Some(("default_workload", v)) => match names::check_class(v) {
                Ok(()) => out.default_workload = Some(v.to_string()),
                Err(e) => bad(e.to_string()),
            },
            Some(("gpu_source", v)) => match SourceSpec::parse(v) {
                Ok(s) => out.gpu_source = s,
                Err(e) => bad(e.to_string()),
            },
            Some(("handoff_timeout", v)) => match duration::parse(v) {
                Ok(d) => out.handoff_timeout = d,
                Err(e) => bad(e.to_string()),
            },
            Some(("prolog_dirty", v)) => match DirtyPrologAction::parse(v) {
                Some(p) => out.prolog_dirty = p,
                None => bad("use fail (the job does not start on a held GPU) or run".into()),
            },
            Some(("require_gpu_source", v)) => match v {
                "yes" => out.require_gpu_source = true,
                "no" => out.require_gpu_source = false,
                _ => bad("use yes or no".into()),
            },
            Some(("gres_conf", v)) if !v.is_empty() => out.gres_conf = Some(PathBuf::from(v)),
            Some(("handoff_min_uid", v)) => match v.parse::<u32>() {
                // Root is never killed anyway; 0 would only read as if it were.
                Ok(uid) if uid >= 1 => out.handoff_min_uid = Some(uid),
                _ => bad("use a uid of 1 or more (the lowest uid the hand-off check may kill)".into()),
            },
            _ => bad(format!("not recognised; known arguments: {KNOWN}")),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_reports_every_bad_argument() {
        let a =
            parse(["default_workload=agents", "gpu_source=fake:/tmp/gpus", "handoff_timeout=5s", "prolog_dirty=run"])
                .unwrap();
        assert_eq!(a.default_workload.as_deref(), Some("agents"));
        assert_eq!(a.gpu_source, SourceSpec::Fake("/tmp/gpus".into()));
        assert_eq!(a.handoff_timeout, Duration::from_secs(5));
        assert_eq!(a.prolog_dirty, DirtyPrologAction::Run);
        assert_eq!(parse([]).unwrap(), PluginArgs::default());
        assert_eq!(parse(["handoff_min_uid=5000"]).unwrap().handoff_min_uid, Some(5000));
        for bad in ["handoff_min_uid=0", "handoff_min_uid=-1", "handoff_min_uid="] {
            assert!(parse([bad]).unwrap_err()[0].contains("uid of 1 or more"), "{bad}");
        }
        let e =
            parse(["default_workload=Bad", "colour=blue", "handoff_timeout=soon", "prolog_dirty=maybe"]).unwrap_err();
        assert_eq!(e.len(), 4);
        assert!(e[0].contains("invalid workload class name \"Bad\""), "{}", e[0]);
        assert!(e[1].contains("\"colour=blue\": not recognised; known arguments: default_workload=CLASS"), "{}", e[1]);
        assert!(e[2].contains("accepted forms"), "{}", e[2]);
        assert!(e[3].contains("use fail"), "{}", e[3]);
    }
}

//! The SPANK entry points Slurm looks up by name. Every one goes through the
//! panic barrier (`slurm_sys::entry_point!`) and returns 0 or -1
//! (ESPANK_ERROR) to Slurm.

use std::ffi::c_int;

use onepool_decisions::annotation::{Annotation, Key};
use slurm_sys::bindings::spank_context;
use slurm_sys::spank::{self, Spank, SpankArgs, SpankError};
use slurm_sys::{host, log};

use crate::options::{self, state, PLUGIN, TABLE};
use crate::{args, handoff};

const OK: c_int = 0;
const FAIL: c_int = -1;

slurm_sys::entry_point! {
    #[guard(PLUGIN, on_panic = FAIL)]
    pub spank fn slurm_spank_init(sp: Spank, argv: SpankArgs) -> c_int {
        let raw = argv.to_vec();
        match args::parse(raw.iter().map(String::as_str)) {
            Ok(a) => state().args = a,
            Err(errors) => {
                for e in errors {
                    log::error(&format!("{PLUGIN}: {e}"));
                }
                return FAIL;
            }
        }
        // Registering in every context (not via a static `spank_options`
        // table, which sbatch/salloc ignore in 22.05) also makes slurmstepd
        // run the callbacks with the values forwarded from the submit host.
        if spank::context() == spank_context::S_CTX_JOB_SCRIPT {
            // Prolog/epilog: no options there, only the hand-off check.
            return OK;
        }
        if host::spank_option_register().is_none() {
            log::error(&format!("{PLUGIN}: spank_option_register is not available in this process"));
            return FAIL;
        }
        if spank::context() == spank_context::S_CTX_SLURMD {
            // Once per slurmd start: the admin's proof that the line in
            // plugstack.conf took effect on this node.
            let (ma, mi, mc) = slurm_sys::version();
            log::info(&format!(
                "{PLUGIN}: loaded in slurmd (built for Slurm {ma}.{mi:02}.{mc}); {}",
                gpu_source_status()
            ));
        }
        for i in 0..options::KEYS.len() {
            // The table is static: Slurm keeps the pointer.
            if let Err(e) = sp.option_register(&TABLE, i) {
                let why = match e {
                    SpankError::Code(rc) => format!("error {rc}"),
                    other => other.to_string(),
                };
                log::error(&format!("{PLUGIN}: cannot register --{} ({why})", options::KEYS[i].option()));
                return FAIL;
            }
        }
        OK
    }
}

slurm_sys::entry_point! {
    /// On the submit host: pass the annotations to slurmctld through the job's
    /// SPANK environment, where job_submit/onepool reads them.
    #[guard(PLUGIN, on_panic = FAIL)]
    pub spank fn slurm_spank_init_post_opt(sp: Spank, _argv: SpankArgs) -> c_int {
        let ctx = spank::context();
        if ctx != spank_context::S_CTX_LOCAL && ctx != spank_context::S_CTX_ALLOCATOR {
            return OK;
        }
        let annotation = {
            let mut st = state();
            if st.annotation.workload.is_none() {
                st.annotation.workload = st.args.default_workload.clone();
            }
            st.annotation.clone()
        };
        if let Err(e) = annotation.check_combination() {
            log::error(&e.to_string());
            return FAIL;
        }
        if host::spank_job_control_setenv().is_none() {
            if !annotation.is_empty() {
                log::error(&format!(
                    "{PLUGIN}: this command cannot pass job annotations (no spank_job_control_setenv)"
                ));
                return FAIL;
            }
            return OK;
        }
        for (name, value) in annotation.to_env() {
            if let Err(e) = sp.job_control_setenv(name, &value, true) {
                log::error(&format!("{PLUGIN}: cannot pass {name} to the job ({e})"));
                return FAIL;
            }
        }
        OK
    }
}

slurm_sys::entry_point! {
    /// In slurmstepd, before the tasks start: export the annotations to the
    /// job's processes as ONEPOOL_* variables.
    #[guard(PLUGIN, on_panic = FAIL)]
    pub spank fn slurm_spank_user_init(sp: Spank, _argv: SpankArgs) -> c_int {
        let mut annotation = state().annotation.clone();
        if annotation.is_empty() {
            // Batch steps may not re-run the option callbacks: fall back on
            // what slurmctld stored in the job's SPANK environment.
            annotation = from_job_env(sp);
        }
        if host::spank_setenv().is_none() {
            return OK;
        }
        for (name, value) in annotation.to_env() {
            if let Err(e) = sp.setenv(name, &value, true) {
                log::error(&format!("{PLUGIN}: cannot export {name} to the job ({e})"));
            }
        }
        OK
    }
}

fn from_job_env(sp: Spank) -> Annotation {
    if host::spank_getenv().is_none() {
        return Annotation::default();
    }
    let mut entries = Vec::new();
    for key in Key::ALL {
        for name in [format!("SLURM_SPANK_{}", key.env()), key.env().to_string()] {
            // The buffer grows while Slurm says it is too small.
            if let Ok(v) = sp.getenv(&name) {
                entries.push(format!("{}={v}", key.env()));
                break;
            }
        }
    }
    match Annotation::from_spank_env(entries.iter().map(String::as_str)) {
        Ok(a) => a,
        Err(errors) => {
            for e in errors {
                log::error(&format!("{PLUGIN}: ignoring a bad annotation in the job environment: {e}"));
            }
            Annotation::default()
        }
    }
}

slurm_sys::entry_point! {
    /// The departing job's GPUs must be free before Slurm hands them on.
    #[guard(PLUGIN, on_panic = FAIL)]
    pub spank fn slurm_spank_job_epilog(sp: Spank, argv: SpankArgs) -> c_int {
        match job_script_args(argv) {
            Some(args) => handoff::run(sp, handoff::Phase::Epilog, &args),
            None => FAIL,
        }
    }
}

slurm_sys::entry_point! {
    /// Second line of defence: the incoming job's GPUs are clean.
    #[guard(PLUGIN, on_panic = FAIL)]
    pub spank fn slurm_spank_job_prolog(sp: Spank, argv: SpankArgs) -> c_int {
        match job_script_args(argv) {
            Some(args) => handoff::run(sp, handoff::Phase::Prolog, &args),
            None => FAIL,
        }
    }
}

/// Said once per slurmd start, so an admin sees whether hand-off checks
/// will run on this node (without a driver they are skipped, not failed).
fn gpu_source_status() -> String {
    let spec = state().args.gpu_source.clone();
    match onepool_gpu_inventory::open(&spec) {
        Ok(Some(mut s)) => match s.devices() {
            Ok(d) => format!("GPU hand-off checks use {} ({} GPUs visible)", s.describe(), d.len()),
            Err(e) => format!("GPU hand-off checks: {e}"),
        },
        Ok(None) => "GPU hand-off checks are off (gpu_source=none)".to_string(),
        Err(e) => format!("GPU hand-off checks: {e}"),
    }
}

/// The job_script context does not always run `slurm_spank_init` first, so
/// prolog and epilog read the plugstack.conf arguments they are given.
fn job_script_args(argv: SpankArgs) -> Option<args::PluginArgs> {
    let raw = argv.to_vec();
    match args::parse(raw.iter().map(String::as_str)) {
        Ok(a) => Some(a),
        Err(errors) => {
            for e in errors {
                log::error(&format!("{PLUGIN}: {e}"));
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exported functions as Slurm calls them, in a process without
    /// Slurm: each answers, none crashes.
    #[test]
    fn outside_slurm_every_entry_point_answers() {
        let (sp, av) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(slurm_spank_init(sp, 0, av), FAIL, "no spank_option_register here");
        assert_eq!(slurm_spank_init_post_opt(sp, 0, av), OK, "not the submit host");
        assert_eq!(slurm_spank_user_init(sp, 0, av), OK);
        assert_eq!(slurm_spank_job_epilog(sp, 0, av), OK, "no job id: check skipped");
        assert_eq!(slurm_spank_job_prolog(sp, 0, av), OK, "no job id: check skipped");
        let mut bad = [c"no_such_argument=1".as_ptr().cast_mut()];
        assert_eq!(slurm_spank_job_epilog(sp, 1, bad.as_mut_ptr()), FAIL, "a bad plugstack.conf argument");
    }
}

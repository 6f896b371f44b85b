//! The SPANK entry points Slurm looks up by name. Every one goes through the
//! panic barrier and returns 0 or -1 (ESPANK_ERROR) to Slurm.

use std::ffi::{c_char, c_int, CString};

use onepool_decisions::annotation::{Annotation, Key};
use slurm_sys::bindings::{spank_context, spank_t};
use slurm_sys::{guard::guard, host, log};

use crate::options::{self, state, PLUGIN, TABLE};
use crate::{args, handoff};

const OK: c_int = 0;
const FAIL: c_int = -1;

fn context() -> spank_context::Type {
    // SAFETY: spank_context() takes no arguments and only reads Slurm state.
    host::spank_context().map(|f| unsafe { f() }).unwrap_or(spank_context::S_CTX_ERROR)
}

fn argv(ac: c_int, av: *mut *mut c_char) -> Vec<String> {
    (0..usize::try_from(ac).unwrap_or(0))
        // SAFETY: Slurm passes `ac` valid C strings in `av`.
        .filter_map(|i| unsafe { slurm_sys::xstring::read(*av.add(i)) })
        .collect()
}

#[no_mangle]
pub extern "C" fn slurm_spank_init(sp: spank_t, ac: c_int, av: *mut *mut c_char) -> c_int {
    guard(PLUGIN, "slurm_spank_init", FAIL, || {
        let raw = argv(ac, av);
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
        if context() == spank_context::S_CTX_JOB_SCRIPT {
            // Prolog/epilog: no options there, only the hand-off check.
            return OK;
        }
        let Some(register) = host::spank_option_register() else {
            log::error(&format!("{PLUGIN}: spank_option_register is not available in this process"));
            return FAIL;
        };
        if context() == spank_context::S_CTX_SLURMD {
            // Once per slurmd start: the admin's proof that the line in
            // plugstack.conf took effect on this node.
            let (ma, mi, mc) = slurm_sys::version();
            log::info(&format!(
                "{PLUGIN}: loaded in slurmd (built for Slurm {ma}.{mi:02}.{mc}); {}",
                gpu_source_status()
            ));
        }
        for i in 0..options::KEYS.len() {
            // SAFETY: the table is static; Slurm keeps the pointer.
            let rc = unsafe { register(sp, TABLE.entry(i)) };
            if rc != 0 {
                log::error(&format!("{PLUGIN}: cannot register --{} (error {rc})", options::KEYS[i].option()));
                return FAIL;
            }
        }
        OK
    })
}

/// On the submit host: pass the annotations to slurmctld through the job's
/// SPANK environment, where job_submit/onepool reads them.
#[no_mangle]
pub extern "C" fn slurm_spank_init_post_opt(sp: spank_t, _ac: c_int, _av: *mut *mut c_char) -> c_int {
    guard(PLUGIN, "slurm_spank_init_post_opt", FAIL, || {
        let ctx = context();
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
        let Some(setenv) = host::spank_job_control_setenv() else {
            if !annotation.is_empty() {
                log::error(&format!(
                    "{PLUGIN}: this command cannot pass job annotations (no spank_job_control_setenv)"
                ));
                return FAIL;
            }
            return OK;
        };
        for (name, value) in annotation.to_env() {
            let (n, v) = (cstr(name), cstr(&value));
            // SAFETY: valid spank handle and NUL-terminated strings.
            let rc = unsafe { setenv(sp, n.as_ptr(), v.as_ptr(), 1) };
            if rc != 0 {
                log::error(&format!("{PLUGIN}: cannot pass {name} to the job (spank error {rc})"));
                return FAIL;
            }
        }
        OK
    })
}

/// In slurmstepd, before the tasks start: export the annotations to the
/// job's processes as ONEPOOL_* variables.
#[no_mangle]
pub extern "C" fn slurm_spank_user_init(sp: spank_t, _ac: c_int, _av: *mut *mut c_char) -> c_int {
    guard(PLUGIN, "slurm_spank_user_init", FAIL, || {
        let mut annotation = state().annotation.clone();
        if annotation.is_empty() {
            // Batch steps may not re-run the option callbacks: fall back on
            // what slurmctld stored in the job's SPANK environment.
            annotation = from_job_env(sp);
        }
        let Some(setenv) = host::spank_setenv() else {
            return OK;
        };
        for (name, value) in annotation.to_env() {
            let (n, v) = (cstr(name), cstr(&value));
            // SAFETY: valid spank handle and NUL-terminated strings.
            let rc = unsafe { setenv(sp, n.as_ptr(), v.as_ptr(), 1) };
            if rc != 0 {
                log::error(&format!("{PLUGIN}: cannot export {name} to the job (spank error {rc})"));
            }
        }
        OK
    })
}

fn from_job_env(sp: spank_t) -> Annotation {
    let Some(getenv) = host::spank_getenv() else {
        return Annotation::default();
    };
    let mut entries = Vec::new();
    for key in Key::ALL {
        for name in [format!("SLURM_SPANK_{}", key.env()), key.env().to_string()] {
            let mut buf = vec![0 as c_char; 512];
            let n = cstr(&name);
            // SAFETY: buffer of the stated length; spank_getenv NUL-terminates.
            let rc = unsafe { getenv(sp, n.as_ptr(), buf.as_mut_ptr(), buf.len() as c_int) };
            if rc == 0 {
                if let Some(v) = unsafe { slurm_sys::xstring::read(buf.as_ptr()) } {
                    entries.push(format!("{}={v}", key.env()));
                    break;
                }
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

fn cstr(s: &str) -> CString {
    log::to_cstring_lossy(s)
}

/// The departing job's GPUs must be free before Slurm hands them on.
#[no_mangle]
pub extern "C" fn slurm_spank_job_epilog(sp: spank_t, ac: c_int, av: *mut *mut c_char) -> c_int {
    guard(PLUGIN, "slurm_spank_job_epilog", FAIL, || match job_script_args(ac, av) {
        Some(args) => handoff::run(sp, handoff::Phase::Epilog, &args),
        None => FAIL,
    })
}

/// Second line of defence: the incoming job's GPUs are clean.
#[no_mangle]
pub extern "C" fn slurm_spank_job_prolog(sp: spank_t, ac: c_int, av: *mut *mut c_char) -> c_int {
    guard(PLUGIN, "slurm_spank_job_prolog", FAIL, || match job_script_args(ac, av) {
        Some(args) => handoff::run(sp, handoff::Phase::Prolog, &args),
        None => FAIL,
    })
}

/// Said once per slurmd start, so an admin sees whether hand-off checks
/// will run on this node (without a driver they are skipped, not failed).
fn gpu_source_status() -> String {
    let spec = state().args.gpu_source.clone();
    match onepool_gpu::open(&spec) {
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
fn job_script_args(ac: c_int, av: *mut *mut c_char) -> Option<args::PluginArgs> {
    let raw = argv(ac, av);
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

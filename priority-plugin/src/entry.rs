//! The job_submit plugin API as slurmctld 22.05 calls it.

use std::ffi::{c_char, c_int, c_void};

use onepool_decisions::annotation::Annotation;
use slurm_sys::bindings::{job_desc_msg_t, SLURM_ERROR, SLURM_SUCCESS};
use slurm_sys::{guard::guard, log, xstring};

use crate::job_desc::JobView;
use crate::PLUGIN;

const OK: c_int = SLURM_SUCCESS as c_int;
const FAIL: c_int = SLURM_ERROR;

#[no_mangle]
pub extern "C" fn init() -> c_int {
    guard(PLUGIN, "init", FAIL, || {
        let (ma, mi, mc) = slurm_sys::version();
        log::info(&format!(
            "{PLUGIN}: loaded (built for Slurm {ma}.{mi:02}.{mc})"
        ));
        OK
    })
}

#[no_mangle]
pub extern "C" fn fini() -> c_int {
    guard(PLUGIN, "fini", FAIL, || OK)
}

/// Hands `msg` to the submitting user through sbatch's stderr.
fn refuse(err_msg: *mut *mut c_char, msg: &str) -> c_int {
    log::info(&format!("{PLUGIN}: refused: {msg}"));
    if !err_msg.is_null() {
        // SAFETY: Slurm passes a valid `char **` that it will xfree.
        if let Err(e) = unsafe { xstring::replace(err_msg, msg) } {
            log::error(&format!(
                "{PLUGIN}: cannot hand the refusal message to Slurm: {e}"
            ));
        }
    }
    FAIL
}

#[no_mangle]
pub extern "C" fn job_submit(
    job_desc: *mut job_desc_msg_t,
    submit_uid: u32,
    err_msg: *mut *mut c_char,
) -> c_int {
    guard(PLUGIN, "job_submit", FAIL, || {
        if job_desc.is_null() {
            return refuse(err_msg, "internal error: no job description");
        }
        // SAFETY: slurmctld passes a valid job description.
        let job = unsafe { JobView::read(job_desc) };
        match Annotation::from_spank_env(job.spank_env.iter().map(String::as_str)) {
            Ok(a) => {
                log::verbose(&format!("{PLUGIN}: uid {submit_uid}: annotation {a:?}"));
                OK
            }
            Err(errors) => {
                let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
                refuse(err_msg, &format!("onepool: {}", all.join("; ")))
            }
        }
    })
}

/// 22.05 signature: no `err_msg` (it arrived in 23.02). `job_ptr` is
/// slurmctld's internal job record: opaque to us.
#[no_mangle]
pub extern "C" fn job_modify(
    job_desc: *mut job_desc_msg_t,
    _job_ptr: *mut c_void,
    submit_uid: u32,
) -> c_int {
    guard(PLUGIN, "job_modify", FAIL, || {
        if job_desc.is_null() {
            return FAIL;
        }
        log::debug(&format!("{PLUGIN}: job_modify by uid {submit_uid}"));
        OK
    })
}

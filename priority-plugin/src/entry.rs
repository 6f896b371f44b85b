//! The job_submit plugin API as slurmctld calls it.

use std::ffi::{c_char, c_int, c_void};

use onepool_decisions::annotation::Annotation;
use onepool_decisions::classify::{self, Placement, Refusal, Rule, Submitter, Verdict};
use onepool_decisions::tres;
use slurm_sys::bindings::{job_desc_msg_t, slurm_err_t, SLURM_ERROR, SLURM_SUCCESS};
use slurm_sys::{guard::guard, log, xstring};

use crate::active;
use crate::job_desc::JobView;
use crate::{watcher, PLUGIN};

const OK: c_int = SLURM_SUCCESS as c_int;
const FAIL: c_int = SLURM_ERROR;

/// Loads the policy; a broken or missing policy at start refuses to load
/// the plugin (slurmctld then stops with our lines in its log) rather than
/// run without the rules the admins wrote.
#[no_mangle]
pub extern "C" fn init() -> c_int {
    guard(PLUGIN, "init", FAIL, || {
        let (ma, mi, mc) = slurm_sys::version();
        let path = active::policy_path();
        match active::load_and_install(&path) {
            Ok(summary) => {
                watcher::start(path.clone());
                if slurm_sys::host::validate_operator().is_none() {
                    log::info(&format!(
                        "{PLUGIN}: this slurmctld exports no validate_operator: only root counts as an administrator for job updates"
                    ));
                }
                log::info(&format!(
                    "{PLUGIN}: loaded (built for Slurm {ma}.{mi:02}.{mc}); policy {} ({summary})",
                    path.display()
                ));
                OK
            }
            Err(()) => {
                log::error(&format!(
                    "{PLUGIN}: not started: fix {} (check it with `onepool policy check`)",
                    path.display()
                ));
                FAIL
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn fini() -> c_int {
    guard(PLUGIN, "fini", FAIL, || {
        watcher::stop();
        active::set(None);
        OK
    })
}

/// The Slurm error code closest to each rule (what `job_modify` can return
/// in 22.05, and what sbatch prints after our message).
fn code(rule: Rule) -> c_int {
    (match rule {
        Rule::NotEntitled | Rule::ClassChange | Rule::PartitionChange => slurm_err_t::ESLURM_ACCESS_DENIED,
        Rule::GpuCap => slurm_err_t::ESLURM_INVALID_TRES,
        Rule::TimeLimitRequired | Rule::TimeLimitTooLong => slurm_err_t::ESLURM_INVALID_TIME_LIMIT,
        Rule::UnknownClass | Rule::Conflict | Rule::ReclaimNotAllowed | Rule::BadAnnotation => {
            slurm_err_t::ESLURM_INVALID_QOS
        }
    }) as c_int
}

/// Hands `msg` to the submitting user (sbatch prints it) and logs it.
fn refuse(err_msg: *mut *mut c_char, uid: u32, r: &Refusal) -> c_int {
    log::info(&format!("{PLUGIN}: refused job of uid {uid}: {}", r.message));
    if !err_msg.is_null() {
        // SAFETY: Slurm passes a valid `char **` that it will xfree.
        if let Err(e) = unsafe { xstring::replace(err_msg, &r.message) } {
            log::error(&format!("{PLUGIN}: cannot hand the refusal message to Slurm: {e}"));
        }
    }
    code(r.rule)
}

/// Writes the placement into the job description, with Slurm's allocator.
///
/// # Safety
/// `d` must be slurmctld's job description for this call.
unsafe fn apply(d: *mut job_desc_msg_t, job: &JobView, p: &Placement) -> Result<(), xstring::XstringError> {
    let d = &mut *d;
    if slurm_sys::compat::GPUS_PER_JOB_SHORT_ON_ONE_NODE {
        if let Some((per_job, per_node)) =
            tres::gpus_per_job_as_per_node(&job.shape, job.tres_per_job.as_deref(), job.tres_per_node.as_deref())
        {
            xstring::replace(&mut d.tres_per_node, &per_node)?;
            match per_job {
                Some(rest) => xstring::replace(&mut d.tres_per_job, &rest)?,
                None => xstring::xfree(&mut d.tres_per_job),
            }
        }
    }
    xstring::replace(&mut d.qos, &p.qos)?;
    if let Some(part) = &p.partition {
        xstring::replace(&mut d.partition, part)?;
    }
    if let Some(t) = p.time_limit {
        d.time_limit = u32::try_from(t.as_secs().div_ceil(60)).unwrap_or(u32::MAX - 1);
    }
    xstring::replace(&mut d.admin_comment, &p.record.encode())?;
    Ok(())
}

fn describe(p: &Placement) -> String {
    format!(
        "class {} qos {}{}{} [{}]",
        p.class,
        p.qos,
        p.partition.as_deref().map(|x| format!(" partition {x}")).unwrap_or_default(),
        p.time_limit.map(|t| format!(" time limit {}", onepool_decisions::duration::format(t))).unwrap_or_default(),
        p.record.encode()
    )
}

#[no_mangle]
pub extern "C" fn job_submit(job_desc: *mut job_desc_msg_t, submit_uid: u32, err_msg: *mut *mut c_char) -> c_int {
    guard(PLUGIN, "job_submit", FAIL, || {
        if job_desc.is_null() {
            return FAIL;
        }
        let Some(active) = active::get() else {
            log::error(&format!("{PLUGIN}: no policy loaded; job accepted unchanged"));
            return OK;
        };
        // SAFETY: slurmctld passes a valid job description.
        let job = unsafe { JobView::read(job_desc) };
        let audit = active.policy.pool.audit;
        let who = Submitter { uid: submit_uid, gid: job.group_id };
        let verdict = match Annotation::from_spank_env(job.spank_env.iter().map(String::as_str)) {
            Ok(a) => classify::classify(&active.policy, &active.directory, who, &job.request(a)),
            Err(errors) => {
                let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
                Verdict::Refuse(Refusal { rule: Rule::BadAnnotation, message: format!("onepool: {}", all.join("; ")) })
            }
        };
        match verdict {
            Verdict::Outside => OK,
            Verdict::Accept(p) if audit => {
                log::info(&format!("{PLUGIN}: audit: uid {submit_uid}: would place: {}", describe(&p)));
                OK
            }
            Verdict::Refuse(r) if audit => {
                log::info(&format!("{PLUGIN}: audit: uid {submit_uid}: would refuse: {}", r.message));
                OK
            }
            Verdict::Accept(p) => {
                // No per-job log line: slurmctld holds its locks here, and the
                // decision is on the job itself (AdminComment).
                // SAFETY: valid job description for this call.
                match unsafe { apply(job_desc, &job, &p) } {
                    Ok(()) => OK,
                    Err(e) => {
                        let r = Refusal { rule: Rule::BadAnnotation, message: format!("onepool: internal error: {e}") };
                        refuse(err_msg, submit_uid, &r)
                    }
                }
            }
            Verdict::Refuse(r) => refuse(err_msg, submit_uid, &r),
        }
    })
}

fn modify(job_desc: *mut job_desc_msg_t, submit_uid: u32) -> Result<(), Refusal> {
    if job_desc.is_null() {
        return Ok(());
    }
    let Some(active) = active::get() else {
        return Ok(());
    };
    // SAFETY: slurmctld passes a valid job description.
    let job = unsafe { JobView::read(job_desc) };
    let who = Submitter { uid: submit_uid, gid: job.group_id };
    match classify::check_modify(&active.policy, &active.directory, who, &job.modify_request()) {
        Err(r) if active.policy.pool.audit => {
            log::info(&format!(
                "{PLUGIN}: audit: uid {submit_uid}: would refuse update of job {}: {}",
                job.job_id, r.message
            ));
            Ok(())
        }
        Err(r) => {
            log::info(&format!("{PLUGIN}: refused update of job {} by uid {submit_uid}: {}", job.job_id, r.message));
            Err(r)
        }
        Ok(()) => Ok(()),
    }
}

slurm_sys::since_23_02! {
    {
        #[no_mangle]
        pub extern "C" fn job_modify(
            job_desc: *mut job_desc_msg_t,
            _job_ptr: *mut c_void,
            submit_uid: u32,
            err_msg: *mut *mut c_char,
        ) -> c_int {
            guard(PLUGIN, "job_modify", FAIL, || match modify(job_desc, submit_uid) {
                Ok(()) => OK,
                Err(r) => refuse(err_msg, submit_uid, &r),
            })
        }
    } else {
        /// 22.05: no `err_msg` (it arrived in 23.02), so the sentence goes to
        /// the log and the user gets the closest Slurm error. `job_ptr` is
        /// slurmctld's internal job record: opaque to us.
        #[no_mangle]
        pub extern "C" fn job_modify(job_desc: *mut job_desc_msg_t, _job_ptr: *mut c_void, submit_uid: u32) -> c_int {
            guard(PLUGIN, "job_modify", FAIL, || match modify(job_desc, submit_uid) {
                Ok(()) => OK,
                Err(r) => code(r.rule),
            })
        }
    }
}

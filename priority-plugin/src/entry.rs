//! The job_submit plugin API as slurmctld calls it.

use std::ffi::{c_char, c_int, c_void};

use onepool_decisions::annotation::Annotation;
use onepool_decisions::classify::{self, Placement, Refusal, Rule, Submitter, Verdict};
use onepool_decisions::record::AuditRecord;
use onepool_decisions::tres;
use slurm_sys::bindings::{job_desc_msg_t, slurm_err_t, SLURM_ERROR, SLURM_SUCCESS};
use slurm_sys::job_desc::{JobDesc, StrField};
use slurm_sys::log;
use slurm_sys::xstring::{ErrMsg, XstringError};

use crate::active;
use crate::job_desc::JobView;
use crate::{watcher, PLUGIN};

const OK: c_int = SLURM_SUCCESS as c_int;
const FAIL: c_int = SLURM_ERROR;

slurm_sys::entry_point! {
    /// Loads the policy; a broken or missing policy at start refuses to load
    /// the plugin (slurmctld then stops with our lines in its log) rather than
    /// run without the rules the admins wrote.
    #[guard(PLUGIN, on_panic = FAIL)]
    pub extern "C" fn init() -> c_int {
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
    }
}

slurm_sys::entry_point! {
    #[guard(PLUGIN, on_panic = FAIL)]
    pub extern "C" fn fini() -> c_int {
        watcher::stop();
        active::set(None);
        OK
    }
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
fn refuse(err_msg: Option<ErrMsg>, uid: u32, r: &Refusal) -> c_int {
    log::info(&format!("{PLUGIN}: refused job of uid {uid}: {}", r.message));
    if let Some(mut err_msg) = err_msg {
        if let Err(e) = err_msg.set(&r.message) {
            log::error(&format!("{PLUGIN}: cannot hand the refusal message to Slurm: {e}"));
        }
    }
    code(r.rule)
}

/// Writes the placement into the job description, with Slurm's allocator;
/// a failure becomes the refusal the user reads.
fn place(d: &mut JobDesc, job: &JobView, p: &Placement) -> Result<(), Refusal> {
    apply(d, job, p, slurm_sys::compat::GPUS_PER_JOB_SHORT_ON_ONE_NODE)
        .map_err(|e| Refusal { rule: Rule::BadAnnotation, message: format!("onepool: internal error: {e}") })
}

/// The writes of [`place`]; `gpus_per_job_short_on_one_node` is this
/// release's [`slurm_sys::compat::GPUS_PER_JOB_SHORT_ON_ONE_NODE`] (an
/// argument so that tests cover both answers on any release).
fn apply(
    d: &mut JobDesc,
    job: &JobView,
    p: &Placement,
    gpus_per_job_short_on_one_node: bool,
) -> Result<(), XstringError> {
    if gpus_per_job_short_on_one_node {
        if let Some((per_job, per_node)) = tres::gpus_per_job_as_per_node(&job.shape, &job.tres_ask()) {
            d.set(StrField::TresPerNode, &per_node)?;
            match per_job {
                Some(rest) => d.set(StrField::TresPerJob, &rest)?,
                None => d.clear(StrField::TresPerJob),
            }
        }
    }
    d.set(StrField::Qos, &p.qos)?;
    if let Some(part) = &p.partition {
        d.set(StrField::Partition, part)?;
    }
    if let Some(t) = p.time_limit {
        d.set_time_limit(u32::try_from(t.as_secs().div_ceil(60)).unwrap_or(u32::MAX - 1));
    }
    d.set(StrField::AdminComment, &p.record.encode())?;
    Ok(())
}

/// Audit mode's decision on the job itself (its AdminComment, which no
/// user can write), for `onepool report` to count: the log line above is
/// for admins to read, and a user's text can imitate it in the log.
fn audit_record(d: &mut JobDesc, a: &AuditRecord) {
    if let Err(e) = d.set(StrField::AdminComment, &a.encode()) {
        log::error(&format!("{PLUGIN}: audit: cannot record the decision on the job: {e}"));
    }
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

slurm_sys::entry_point! {
    #[guard(PLUGIN, on_panic = FAIL)]
    pub extern "C" fn job_submit(
        job_desc: *mut job_desc_msg_t as Option<&mut JobDesc>,
        submit_uid: u32,
        err_msg: *mut *mut c_char as Option<ErrMsg>,
    ) -> c_int {
        let Some(job_desc) = job_desc else {
            return FAIL;
        };
        let Some(active) = active::get() else {
            log::error(&format!("{PLUGIN}: no policy loaded; job accepted unchanged"));
            return OK;
        };
        let job = JobView::read(job_desc);
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
                audit_record(job_desc, &AuditRecord::Place { class: p.class.clone() });
                OK
            }
            Verdict::Refuse(r) if audit => {
                log::info(&format!("{PLUGIN}: audit: uid {submit_uid}: would refuse: {}", r.message));
                audit_record(job_desc, &AuditRecord::Refuse { rule: r.rule.name().to_string() });
                OK
            }
            Verdict::Accept(p) => {
                // No per-job log line: slurmctld holds its locks here, and the
                // decision is on the job itself (AdminComment).
                match place(job_desc, &job, &p) {
                    Ok(()) => OK,
                    Err(r) => refuse(err_msg, submit_uid, &r),
                }
            }
            Verdict::Refuse(r) => refuse(err_msg, submit_uid, &r),
        }
    }
}

fn modify(job_desc: Option<&JobDesc>, submit_uid: u32) -> Result<(), Refusal> {
    let Some(job_desc) = job_desc else {
        return Ok(());
    };
    let Some(active) = active::get() else {
        return Ok(());
    };
    let job = JobView::read(job_desc);
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
        slurm_sys::entry_point! {
            #[guard(PLUGIN, on_panic = FAIL)]
            pub extern "C" fn job_modify(
                job_desc: *mut job_desc_msg_t as Option<&JobDesc>,
                _job_ptr: *mut c_void,
                submit_uid: u32,
                err_msg: *mut *mut c_char as Option<ErrMsg>,
            ) -> c_int {
                match modify(job_desc, submit_uid) {
                    Ok(()) => OK,
                    Err(r) => refuse(err_msg, submit_uid, &r),
                }
            }
        }
    } else {
        slurm_sys::entry_point! {
            /// 22.05: no `err_msg` (it arrived in 23.02), so the sentence goes to
            /// the log and the user gets the closest Slurm error. `job_ptr` is
            /// slurmctld's internal job record: opaque to us.
            #[guard(PLUGIN, on_panic = FAIL)]
            pub extern "C" fn job_modify(
                job_desc: *mut job_desc_msg_t as Option<&JobDesc>,
                _job_ptr: *mut c_void,
                submit_uid: u32,
            ) -> c_int {
                match modify(job_desc, submit_uid) {
                    Ok(()) => OK,
                    Err(r) => code(r.rule),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use onepool_decisions::record::JobRecord;
    use slurm_sys::job_desc::TestJobDesc;
    use slurm_sys::xstring::libc_allocator::LibcAllocator;

    use super::*;
    use crate::job_desc::tests::blank;

    fn placement() -> Placement {
        Placement {
            class: "training".into(),
            qos: "train".into(),
            partition: Some("gpu".into()),
            time_limit: Some(Duration::from_secs(90 * 60 + 1)),
            record: JobRecord {
                class: "training".into(),
                protected: true,
                reclaim: None,
                drain_timeout: None,
                endpoint: None,
            },
        }
    }

    /// `--gpus=4,license/x:1 -N1` submitted with a QOS, a partition and a
    /// comment of its own: every field apply writes holds a string to
    /// replace, except tres_per_node.
    fn submitted() -> TestJobDesc {
        let mut d = blank(|d| {
            d.min_nodes = 1;
            d.max_nodes = 1;
        });
        d.set(StrField::TresPerJob, "gres/gpu:4,license/x:1").unwrap();
        d.set(StrField::Qos, "normal").unwrap();
        d.set(StrField::Partition, "batch").unwrap();
        d.set(StrField::AdminComment, "theirs").unwrap();
        d
    }

    /// Every string field apply may write, as it reads now.
    fn written(d: &JobDesc) -> [Option<String>; 5] {
        [StrField::Qos, StrField::Partition, StrField::AdminComment, StrField::TresPerJob, StrField::TresPerNode]
            .map(|f| d.get(f))
    }

    #[test]
    fn apply_writes_every_field_and_frees_what_it_replaces() {
        let alloc = LibcAllocator::install();
        let mut d = submitted();
        let (allocated, freed, live) = (alloc.allocated(), alloc.freed(), alloc.live());
        let p = placement();
        let job = JobView::read(&d);
        apply(&mut d, &job, &p, true).unwrap();
        assert_eq!(
            written(&d),
            [
                Some("train".into()),
                Some("gpu".into()),
                Some(p.record.encode()),
                Some("license/x:1".into()),
                Some("gres/gpu:4".into())
            ]
        );
        assert_eq!(d.raw().time_limit, 91, "minutes, rounded up");
        // Five new strings; the four they replaced taken back, once each.
        assert_eq!((alloc.allocated() - allocated, alloc.freed() - freed), (5, 4));
        assert_eq!((alloc.live(), alloc.foreign_frees()), (live + 1, 0));
        drop(d);
        assert_eq!((alloc.live(), alloc.foreign_frees()), (0, 0));
    }

    #[test]
    fn gpus_asked_per_job_alone_move_to_per_node_and_leave_none_per_job() {
        let alloc = LibcAllocator::install();
        let mut d = submitted();
        d.set(StrField::TresPerJob, "gres/gpu:4").unwrap();
        let job = JobView::read(&d);
        apply(&mut d, &job, &placement(), true).unwrap();
        assert_eq!((d.get(StrField::TresPerJob), d.get(StrField::TresPerNode)), (None, Some("gres/gpu:4".into())));
        drop(d);
        assert_eq!((alloc.live(), alloc.foreign_frees()), (0, 0));
    }

    /// Releases that count per-job GPUs right, and a placement that keeps
    /// the job's partition and time limit: only the QOS and the record.
    #[test]
    fn apply_leaves_what_the_placement_and_release_do_not_change() {
        let alloc = LibcAllocator::install();
        let mut d = submitted();
        let before = written(&d);
        let p = Placement { partition: None, time_limit: None, ..placement() };
        let job = JobView::read(&d);
        apply(&mut d, &job, &p, false).unwrap();
        let after = written(&d);
        assert_eq!(after[0].as_deref(), Some("train"));
        assert_eq!(after[2], Some(p.record.encode()));
        assert_eq!((&after[1], &after[3], &after[4]), (&before[1], &before[3], &before[4]));
        assert_eq!(d.raw().time_limit, slurm_sys::bindings::NO_VAL);
        drop(d);
        assert_eq!((alloc.live(), alloc.foreign_frees()), (0, 0));
    }

    /// Each of apply's five allocations failing in turn: apply says the
    /// allocator returned NULL, the job is refused with that, and the job
    /// description holds whole strings only (the field being written keeps
    /// its old one), none leaked or freed twice.
    #[test]
    fn a_failed_allocation_leaves_a_precise_error() {
        let alloc = LibcAllocator::install();
        let p = placement();
        for k in 0..5 {
            let mut d = submitted();
            let before = written(&d);
            let job = JobView::read(&d);
            let mut done = submitted();
            apply(&mut done, &job, &p, true).unwrap();
            let after = written(&done);
            drop(done);
            alloc.fail_after(k);
            assert_eq!(apply(&mut d, &job, &p, true), Err(XstringError::AllocationFailed), "allocation {k}");
            // Written in order: TRES per node, per job, QOS, partition, record.
            let order = [4, 3, 0, 1, 2];
            let now = written(&d);
            for (i, field) in order.iter().enumerate() {
                let want = if i < k { &after[*field] } else { &before[*field] };
                assert_eq!(&now[*field], want, "allocation {k} failed, field {field}");
            }
            drop(d);
            assert_eq!((alloc.live(), alloc.foreign_frees()), (0, 0), "allocation {k}");
        }
        let mut d = submitted();
        let job = JobView::read(&d);
        alloc.fail_after(0);
        let r = place(&mut d, &job, &p).unwrap_err();
        assert_eq!(r.message, "onepool: internal error: slurm_xstrdup returned NULL");
        assert_eq!(code(r.rule), slurm_err_t::ESLURM_INVALID_QOS as c_int);
    }

    /// The exported functions as slurmctld calls them, without a job
    /// description: refused at submission, nothing to check on update.
    #[test]
    fn without_a_job_description() {
        let null = std::ptr::null_mut();
        assert_eq!(job_submit(null, 0, std::ptr::null_mut()), FAIL);
        slurm_sys::since_23_02! {
            { assert_eq!(job_modify(null, std::ptr::null_mut(), 0, std::ptr::null_mut()), OK); }
            else { assert_eq!(job_modify(null, std::ptr::null_mut(), 0), OK); }
        }
    }

    /// Outside slurmctld (no allocator at all) the error names that instead.
    #[test]
    fn without_an_allocator_the_error_says_so() {
        let mut d = blank(|_| {});
        let job = JobView::read(&d);
        let r = place(&mut d, &job, &placement()).unwrap_err();
        assert_eq!(r.message, "onepool: internal error: slurm_xstrdup is not available in this process");
    }
}

//! A read-only Rust view of the fields of `job_desc_msg_t` that onepool
//! decides on, copied out at the FFI boundary so the decision code never
//! touches a raw pointer.

use slurm_sys::bindings::job_desc_msg_t;
use slurm_sys::xstring::read;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobView {
    pub user_id: u32,
    pub account: Option<String>,
    pub partition: Option<String>,
    pub qos: Option<String>,
    pub time_limit_min: Option<u32>,
    pub tres_per_job: Option<String>,
    pub tres_per_node: Option<String>,
    pub spank_env: Vec<String>,
}

/// Upper bound on SPANK environment entries read: a client can send any
/// number, and slurmctld's locks are held while we look.
const MAX_SPANK_ENTRIES: usize = 1024;

impl JobView {
    /// # Safety
    /// `d` must point to a valid `job_desc_msg_t` for the duration of the call.
    pub unsafe fn read(d: *const job_desc_msg_t) -> JobView {
        let d = &*d;
        let n = (d.spank_job_env_size as usize).min(MAX_SPANK_ENTRIES);
        let spank_env = if d.spank_job_env.is_null() {
            Vec::new()
        } else {
            (0..n)
                .filter_map(|i| read(*d.spank_job_env.add(i)))
                .collect()
        };
        let time_limit_min = (d.time_limit != slurm_sys::bindings::NO_VAL).then_some(d.time_limit);
        JobView {
            user_id: d.user_id,
            account: read(d.account),
            partition: read(d.partition),
            qos: read(d.qos),
            time_limit_min,
            tres_per_job: read(d.tres_per_job),
            tres_per_node: read(d.tres_per_node),
            spank_env,
        }
    }
}

//! A read-only Rust view of the fields of `job_desc_msg_t` that onepool
//! decides on, copied out at the FFI boundary so the decision code never
//! touches a raw pointer.

use std::time::Duration;

use onepool_decisions::annotation::Annotation;
use onepool_decisions::classify::{JobRequest, ModifyRequest};
use onepool_decisions::tres::{gpus_in, GpuRequest, Shape};
use slurm_sys::bindings::job_desc_msg_t;
use slurm_sys::xstring::read;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobView {
    /// The job as `scontrol update` names it (`job_id` is NO_VAL there).
    pub job_id: String,
    pub user_id: u32,
    pub group_id: u32,
    pub shape: Shape,
    pub tres_per_task: Option<String>,
    pub tres_per_socket: Option<String>,
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
            (0..n).filter_map(|i| read(*d.spank_job_env.add(i))).collect()
        };
        let time_limit_min = (d.time_limit != slurm_sys::bindings::NO_VAL).then_some(d.time_limit);
        // Unset counts are NO_VAL (or NO_VAL16 for the 16-bit ones).
        let count = |v: u32| if v == slurm_sys::bindings::NO_VAL { 0 } else { v };
        let count16 = |v: u16| if u32::from(v) == slurm_sys::bindings::NO_VAL16 { 0 } else { u32::from(v) };
        JobView {
            job_id: read(d.job_id_str).unwrap_or_else(|| slurm_sys::compat::job_desc_job_id(d).to_string()),
            user_id: d.user_id,
            group_id: d.group_id,
            shape: Shape {
                min_nodes: count(d.min_nodes),
                max_nodes: count(d.max_nodes),
                tasks: count(d.num_tasks),
                tasks_per_node: count16(d.ntasks_per_node),
                sockets_per_node: count16(d.sockets_per_node),
            },
            tres_per_task: read(d.tres_per_task),
            tres_per_socket: read(d.tres_per_socket),
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

impl JobView {
    fn gpu_request(&self) -> GpuRequest {
        let count = |t: &Option<String>| t.as_deref().map(|s| gpus_in(s).0).filter(|n| *n > 0);
        GpuRequest {
            per_job: count(&self.tres_per_job),
            per_node: count(&self.tres_per_node),
            per_socket: count(&self.tres_per_socket),
            per_task: count(&self.tres_per_task),
        }
    }

    pub fn gpus(&self) -> u64 {
        self.gpu_request().total(&self.shape)
    }

    /// The decision's input; `annotation` was read from `spank_env`.
    pub fn request(&self, annotation: Annotation) -> JobRequest {
        JobRequest {
            account: self.account.clone(),
            partition: self.partition.clone(),
            qos: self.qos.clone(),
            annotation,
            gpus: self.gpus(),
            gpu_type: [&self.tres_per_job, &self.tres_per_node, &self.tres_per_socket, &self.tres_per_task]
                .into_iter()
                .flatten()
                .find_map(|t| gpus_in(t).1),
            time_limit: self.time_limit_min.map(|m| Duration::from_secs(u64::from(m) * 60)),
        }
    }

    /// For job_modify: only the fields the update sets.
    pub fn modify_request(&self) -> ModifyRequest {
        ModifyRequest { account: self.account.clone(), qos: self.qos.clone(), partition: self.partition.clone() }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;

    use super::*;
    use slurm_sys::bindings::{NO_VAL, NO_VAL16};

    /// A job description as slurmctld hands it over, built in Rust: every
    /// count unset until a test sets it.
    fn blank() -> job_desc_msg_t {
        // SAFETY: job_desc_msg_t is plain C data; all-zero is a valid value
        // (null strings, zero counts).
        let mut d: job_desc_msg_t = unsafe { std::mem::zeroed() };
        d.min_nodes = NO_VAL;
        d.max_nodes = NO_VAL;
        d.num_tasks = NO_VAL;
        d.time_limit = NO_VAL;
        d.ntasks_per_node = NO_VAL16 as u16;
        d.sockets_per_node = NO_VAL16 as u16;
        d
    }

    #[test]
    fn unset_counts_read_as_zero_and_no_gpus() {
        let d = blank();
        // SAFETY: `d` is a valid description for the call.
        let v = unsafe { JobView::read(&d) };
        assert_eq!(v.shape, Shape::default());
        assert_eq!(v.time_limit_min, None);
        assert_eq!(v.gpus(), 0);
    }

    /// `-N1-4 --gpus-per-node=4`: up to 16 GPUs.
    #[test]
    fn node_ranges_count_at_their_upper_end() {
        let per_node = CString::new("gres:gpu:4").unwrap();
        let mut d = blank();
        d.min_nodes = 1;
        d.max_nodes = 4;
        d.tres_per_node = per_node.as_ptr().cast_mut();
        // SAFETY: `d` and the string it points to outlive the call.
        let v = unsafe { JobView::read(&d) };
        assert_eq!(v.gpus(), 16);
    }

    /// `--gpus-per-socket=2 --sockets-per-node=2 -N2`: 8 GPUs.
    #[test]
    fn gpus_per_socket_count_sockets_and_nodes() {
        let per_socket = CString::new("gres:gpu:a100:2").unwrap();
        let mut d = blank();
        d.min_nodes = 2;
        d.max_nodes = 2;
        d.sockets_per_node = 2;
        d.tres_per_socket = per_socket.as_ptr().cast_mut();
        // SAFETY: as above.
        let v = unsafe { JobView::read(&d) };
        assert_eq!(v.gpus(), 8);
        let r = v.request(Annotation::default());
        assert_eq!((r.gpus, r.gpu_type.as_deref()), (8, Some("a100")));
    }

    #[test]
    fn strings_and_spank_environment_are_copied() {
        let qos = CString::new("normal").unwrap();
        let part = CString::new("gpu").unwrap();
        let env = [CString::new("ONEPOOL_WORKLOAD=agents").unwrap(), CString::new("X=1").unwrap()];
        let mut ptrs: Vec<*mut std::ffi::c_char> = env.iter().map(|e| e.as_ptr().cast_mut()).collect();
        let mut d = blank();
        d.qos = qos.as_ptr().cast_mut();
        d.partition = part.as_ptr().cast_mut();
        d.time_limit = 90;
        d.spank_job_env = ptrs.as_mut_ptr();
        d.spank_job_env_size = 2;
        // SAFETY: as above.
        let v = unsafe { JobView::read(&d) };
        assert_eq!(v.qos.as_deref(), Some("normal"));
        assert_eq!(v.partition.as_deref(), Some("gpu"));
        assert_eq!(v.time_limit_min, Some(90));
        assert_eq!(v.spank_env, ["ONEPOOL_WORKLOAD=agents", "X=1"]);
        let m = v.modify_request();
        assert_eq!((m.qos.as_deref(), m.partition.as_deref()), (Some("normal"), Some("gpu")));
    }
}

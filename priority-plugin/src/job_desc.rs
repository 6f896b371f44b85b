//! A read-only Rust view of the fields of `job_desc_msg_t` that onepool
//! decides on, copied out at the FFI boundary so the decision code never
//! touches a raw pointer.

use std::time::Duration;

use onepool_decisions::annotation::Annotation;
use onepool_decisions::classify::{JobRequest, ModifyRequest};
use onepool_decisions::tres::{gpus_in, GpuRequest};
use slurm_sys::bindings::job_desc_msg_t;
use slurm_sys::xstring::read;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobView {
    /// The job as `scontrol update` names it (`job_id` is NO_VAL there).
    pub job_id: String,
    pub user_id: u32,
    pub group_id: u32,
    pub min_nodes: u32,
    pub num_tasks: u32,
    pub tres_per_task: Option<String>,
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
        let count = |v: u32| {
            if v == slurm_sys::bindings::NO_VAL {
                0
            } else {
                v
            }
        };
        JobView {
            job_id: read(d.job_id_str).unwrap_or_else(|| d.job_id.to_string()),
            user_id: d.user_id,
            group_id: d.group_id,
            min_nodes: count(d.min_nodes),
            num_tasks: count(d.num_tasks),
            tres_per_task: read(d.tres_per_task),
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
            per_task: count(&self.tres_per_task),
        }
    }

    pub fn gpus(&self) -> u64 {
        self.gpu_request().total(self.min_nodes, self.num_tasks)
    }

    /// The decision's input; `annotation` was read from `spank_env`.
    pub fn request(&self, annotation: Annotation) -> JobRequest {
        JobRequest {
            account: self.account.clone(),
            partition: self.partition.clone(),
            qos: self.qos.clone(),
            annotation,
            gpus: self.gpus(),
            gpu_type: [&self.tres_per_job, &self.tres_per_node, &self.tres_per_task]
                .into_iter()
                .flatten()
                .find_map(|t| gpus_in(t).1),
            time_limit: self.time_limit_min.map(|m| Duration::from_secs(u64::from(m) * 60)),
        }
    }

    /// For job_modify: only the fields the update sets.
    pub fn modify_request(&self) -> ModifyRequest {
        let r = self.gpu_request();
        let any_gpu = r.per_job.is_some() || r.per_node.is_some() || r.per_task.is_some();
        ModifyRequest {
            account: self.account.clone(),
            qos: self.qos.clone(),
            partition: self.partition.clone(),
            gpus: any_gpu.then(|| self.gpus()),
        }
    }
}

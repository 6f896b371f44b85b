//! A read-only Rust view of the fields of `job_desc_msg_t` that onepool
//! decides on, copied out at the FFI boundary so the decision code never
//! touches a raw pointer.

use std::time::Duration;

use onepool_decisions::annotation::Annotation;
use onepool_decisions::classify::{JobRequest, ModifyRequest};
use onepool_decisions::tres::{self, gpus_in, GpuRequest, Shape};
use slurm_sys::bindings::{NO_VAL, NO_VAL16};
use slurm_sys::job_desc::{JobDesc, StrField};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobView {
    /// The job as `scontrol update` names it (`job_id` is NO_VAL there).
    pub job_id: String,
    pub user_id: u32,
    pub group_id: u32,
    pub shape: Shape,
    pub tres_per_task: Option<String>,
    /// `--ntasks-per-gpu` (0: not given).
    pub tasks_per_gpu: u32,
    pub tres_per_socket: Option<String>,
    pub account: Option<String>,
    pub partition: Option<String>,
    pub qos: Option<String>,
    pub time_limit_min: Option<u32>,
    pub tres_per_job: Option<String>,
    pub tres_per_node: Option<String>,
    pub spank_env: Vec<String>,
    /// `--exclusive` (`shared` is JOB_SHARED_NONE; `=user` and `=mcs` share).
    pub exclusive: bool,
}

/// Upper bound on SPANK environment entries read: a client can send any
/// number, and slurmctld's locks are held while we look.
const MAX_SPANK_ENTRIES: usize = 1024;

impl JobView {
    pub fn read(d: &JobDesc) -> JobView {
        let spank_env = d.spank_env(MAX_SPANK_ENTRIES);
        let r = d.raw();
        let time_limit_min = (r.time_limit != NO_VAL).then_some(r.time_limit);
        // Unset counts are NO_VAL (or NO_VAL16 for the 16-bit ones).
        let count = |v: u32| if v == NO_VAL { 0 } else { v };
        let count16 = |v: u16| if u32::from(v) == NO_VAL16 { 0 } else { u32::from(v) };
        JobView {
            job_id: d.get(StrField::JobIdStr).unwrap_or_else(|| d.job_id().to_string()),
            user_id: r.user_id,
            group_id: r.group_id,
            shape: Shape {
                min_nodes: count(r.min_nodes),
                max_nodes: count(r.max_nodes),
                tasks: count(r.num_tasks),
                tasks_per_node: count16(r.ntasks_per_node),
                sockets_per_node: count16(r.sockets_per_node),
            },
            tres_per_task: d.get(StrField::TresPerTask),
            tasks_per_gpu: count16(r.ntasks_per_tres),
            tres_per_socket: d.get(StrField::TresPerSocket),
            account: d.get(StrField::Account),
            partition: d.get(StrField::Partition),
            qos: d.get(StrField::Qos),
            time_limit_min,
            tres_per_job: d.get(StrField::TresPerJob),
            tres_per_node: d.get(StrField::TresPerNode),
            spank_env,
            exclusive: u32::from(r.shared) == slurm_sys::bindings::JOB_SHARED_NONE,
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

    /// What the job asks in TRES, for the 26.05 per-node rewrite.
    pub fn tres_ask(&self) -> tres::TresAsk<'_> {
        tres::TresAsk {
            per_job: self.tres_per_job.as_deref(),
            per_node: self.tres_per_node.as_deref(),
            per_socket: self.tres_per_socket.as_deref(),
            per_task: self.tres_per_task.as_deref(),
            tasks_per_gpu: self.tasks_per_gpu > 0,
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
            exclusive: self.exclusive,
            nodes: self.shape.min_nodes.max(1),
            time_limit: self.time_limit_min.map(|m| Duration::from_secs(u64::from(m) * 60)),
        }
    }

    /// For job_modify: only the fields the update sets.
    pub fn modify_request(&self) -> ModifyRequest {
        ModifyRequest { account: self.account.clone(), qos: self.qos.clone(), partition: self.partition.clone() }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use slurm_sys::bindings::job_desc_msg_t;
    use slurm_sys::job_desc::TestJobDesc;
    use slurm_sys::xstring::libc_allocator::LibcAllocator;

    /// A job description as slurmctld hands it over, built in Rust: every
    /// count unset until `numbers` sets it. Its strings need a
    /// [`LibcAllocator`] installed first.
    pub(crate) fn blank(numbers: impl FnOnce(&mut job_desc_msg_t)) -> TestJobDesc {
        TestJobDesc::new(|d| {
            d.min_nodes = NO_VAL;
            d.max_nodes = NO_VAL;
            d.num_tasks = NO_VAL;
            d.time_limit = NO_VAL;
            d.ntasks_per_node = NO_VAL16 as u16;
            d.sockets_per_node = NO_VAL16 as u16;
            d.shared = NO_VAL16 as u16;
            numbers(d);
        })
    }

    #[test]
    fn unset_counts_read_as_zero_and_no_gpus() {
        let d = blank(|_| {});
        let v = JobView::read(&d);
        assert_eq!(v.shape, Shape::default());
        assert_eq!(v.time_limit_min, None);
        assert_eq!(v.gpus(), 0);
    }

    /// `-N1-4 --gpus-per-node=4`: up to 16 GPUs.
    #[test]
    fn node_ranges_count_at_their_upper_end() {
        let _alloc = LibcAllocator::install();
        let mut d = blank(|d| {
            d.min_nodes = 1;
            d.max_nodes = 4;
        });
        d.set(StrField::TresPerNode, "gres:gpu:4").unwrap();
        let v = JobView::read(&d);
        assert_eq!(v.gpus(), 16);
    }

    /// `--gpus-per-socket=2 --sockets-per-node=2 -N2`: 8 GPUs.
    #[test]
    fn gpus_per_socket_count_sockets_and_nodes() {
        let _alloc = LibcAllocator::install();
        let mut d = blank(|d| {
            d.min_nodes = 2;
            d.max_nodes = 2;
            d.sockets_per_node = 2;
        });
        d.set(StrField::TresPerSocket, "gres:gpu:a100:2").unwrap();
        let v = JobView::read(&d);
        assert_eq!(v.gpus(), 8);
        let r = v.request(Annotation::default());
        assert_eq!((r.gpus, r.gpu_type.as_deref()), (8, Some("a100")));
    }

    #[test]
    fn strings_and_spank_environment_are_copied() {
        let _alloc = LibcAllocator::install();
        let mut d = blank(|d| d.time_limit = 90);
        d.set(StrField::Qos, "normal").unwrap();
        d.set(StrField::Partition, "gpu").unwrap();
        d.set_spank_env(&["ONEPOOL_WORKLOAD=agents", "X=1"]).unwrap();
        let v = JobView::read(&d);
        assert_eq!(v.qos.as_deref(), Some("normal"));
        assert_eq!(v.partition.as_deref(), Some("gpu"));
        assert_eq!(v.time_limit_min, Some(90));
        assert_eq!(v.spank_env, ["ONEPOOL_WORKLOAD=agents", "X=1"]);
        let m = v.modify_request();
        assert_eq!((m.qos.as_deref(), m.partition.as_deref()), (Some("normal"), Some("gpu")));
    }

    /// The job as `scontrol update` names it, else its number.
    #[test]
    fn the_job_id_is_its_name_or_its_number() {
        let _alloc = LibcAllocator::install();
        let mut d = blank(|_| {});
        assert_eq!(JobView::read(&d).job_id, d.job_id().to_string());
        d.set(StrField::JobIdStr, "42_7").unwrap();
        assert_eq!(JobView::read(&d).job_id, "42_7");
    }
}

//! GPU counts from the TRES strings Slurm stores in a job description
//! (`tres_per_job`, `tres_per_node`, `tres_per_socket`, `tres_per_task`),
//! e.g. `gres:gpu:4`, `gres:gpu:a100:2`, `gres/gpu=2`, several entries
//! separated by commas, multiplied out the way Slurm allocates them.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuRequest {
    pub per_job: Option<u64>,
    pub per_node: Option<u64>,
    pub per_socket: Option<u64>,
    pub per_task: Option<u64>,
}

/// The job's size as its description gives it; 0 = not given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shape {
    pub min_nodes: u32,
    /// The upper end of a node range (`-N1-4`).
    pub max_nodes: u32,
    pub tasks: u32,
    pub tasks_per_node: u32,
    pub sockets_per_node: u32,
}

impl Shape {
    /// The most nodes Slurm may give the job: a range counts at its upper
    /// end, since that is what Slurm may allocate (and what its QOS limit
    /// then measures).
    pub fn nodes(&self) -> u64 {
        u64::from(self.min_nodes.max(self.max_nodes).max(1))
    }

    /// Tasks: as asked, else per node times nodes, else one per node.
    pub fn tasks(&self) -> u64 {
        if self.tasks > 0 {
            u64::from(self.tasks).max(u64::from(self.tasks_per_node))
        } else if self.tasks_per_node > 0 {
            u64::from(self.tasks_per_node).saturating_mul(self.nodes())
        } else {
            self.nodes()
        }
    }
}

/// GPUs (and the GPU type, if one was named) in one TRES string.
pub fn gpus_in(tres: &str) -> (u64, Option<String>) {
    let mut total = 0u64;
    let mut gpu_type = None;
    for entry in tres.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let e = entry.strip_prefix("gres:").or_else(|| entry.strip_prefix("gres/")).unwrap_or(entry);
        let mut parts = e.split([':', '=']);
        if parts.next() != Some("gpu") {
            continue;
        }
        let rest: Vec<&str> = parts.collect();
        let (ty, count) = match rest.as_slice() {
            [] => (None, Some(1)),
            [n] => match n.parse::<u64>() {
                Ok(c) => (None, Some(c)),
                Err(_) => (Some(*n), Some(1)),
            },
            [t, n, ..] => (Some(*t), n.parse::<u64>().ok()),
        };
        total = total.saturating_add(count.unwrap_or(0));
        if let Some(t) = ty {
            gpu_type = Some(t.to_string());
        }
    }
    (total, gpu_type)
}

impl GpuRequest {
    /// The most GPUs Slurm may allocate to the job: per-node counts times
    /// the most nodes, per-socket counts times sockets per node (Slurm
    /// requires `--sockets-per-node` with `--gpus-per-socket`; 1 if absent)
    /// times nodes, per-task counts times tasks.
    pub fn total(&self, shape: &Shape) -> u64 {
        let nodes = shape.nodes();
        let sockets = u64::from(shape.sockets_per_node.max(1));
        [
            self.per_job,
            self.per_node.map(|n| n.saturating_mul(nodes)),
            self.per_socket.map(|n| n.saturating_mul(sockets).saturating_mul(nodes)),
            self.per_task.map(|n| n.saturating_mul(shape.tasks())),
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0)
    }
}

/// What a job asks in TRES, as its description holds it, for
/// [`gpus_per_job_as_per_node`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TresAsk<'a> {
    pub per_job: Option<&'a str>,
    pub per_node: Option<&'a str>,
    pub per_socket: Option<&'a str>,
    pub per_task: Option<&'a str>,
    /// `--ntasks-per-gpu` was given.
    pub tasks_per_gpu: bool,
}

/// The same GPUs asked per node instead of per job, for a job that is held
/// to one node (`--gpus=4 -N1` becomes `--gpus-per-node=4 -N1`): the two
/// mean the same allocation there. Slurm 26.05.5 started such per-job
/// requests on a node with fewer free GPUs than asked (`AllocTRES
/// gres/gpu=3` for `--gpus=4`) instead of waiting or preempting, while it
/// counts per-node requests right (docs/slurm-releases.md).
///
/// Returns the new `(tres_per_job, tres_per_node)`, the per-job string
/// without its GPU entries (`None` when nothing is left), or `None` when
/// the job may span nodes, asks no GPUs per job, or names GPUs in any
/// other way too (per node, socket or task, or `--ntasks-per-gpu`): Slurm
/// derives task counts from the per-job figure with those, so moving it
/// could change the job's shape.
pub fn gpus_per_job_as_per_node(shape: &Shape, ask: &TresAsk<'_>) -> Option<(Option<String>, String)> {
    if shape.max_nodes != 1 || shape.min_nodes > 1 || ask.tasks_per_gpu {
        return None;
    }
    let entries = |s: Option<&str>| -> Vec<String> {
        s.unwrap_or_default().split(',').map(str::trim).filter(|e| !e.is_empty()).map(String::from).collect()
    };
    let names_gpu = |e: &String| {
        let e = e.strip_prefix("gres:").or_else(|| e.strip_prefix("gres/")).unwrap_or(e);
        e.split([':', '=']).next() == Some("gpu")
    };
    if [ask.per_node, ask.per_socket, ask.per_task].into_iter().any(|t| entries(t).iter().any(names_gpu)) {
        return None;
    }
    let (gpus, rest): (Vec<String>, Vec<String>) = entries(ask.per_job).into_iter().partition(names_gpu);
    if gpus_in(&gpus.join(",")).0 == 0 {
        return None;
    }
    let job = (!rest.is_empty()).then(|| rest.join(","));
    Some((job, entries(ask.per_node).into_iter().chain(gpus).collect::<Vec<_>>().join(",")))
}

#[cfg(test)]
mod tests {
    fn one_node() -> Shape {
        Shape { min_nodes: 1, max_nodes: 1, ..Shape::default() }
    }

    fn ask<'a>(per_job: Option<&'a str>, per_node: Option<&'a str>) -> TresAsk<'a> {
        TresAsk { per_job, per_node, ..TresAsk::default() }
    }

    #[test]
    fn single_node_gpus_per_job_move_to_per_node() {
        assert_eq!(
            gpus_per_job_as_per_node(&one_node(), &ask(Some("gres/gpu:4"), None)),
            Some((None, "gres/gpu:4".to_string()))
        );
        // Other per-job TRES stay; per-node TRES already there are kept.
        assert_eq!(
            gpus_per_job_as_per_node(&one_node(), &ask(Some("gres/gpu:a100:2,license/x:1"), Some("gres/shard:1"))),
            Some((Some("license/x:1".to_string()), "gres/shard:1,gres/gpu:a100:2".to_string()))
        );
        // No lower bound given, at most one node: still one node.
        let max_only = Shape { max_nodes: 1, ..Shape::default() };
        assert!(gpus_per_job_as_per_node(&max_only, &ask(Some("gres:gpu:2"), None)).is_some());
    }

    #[test]
    fn jobs_that_may_span_nodes_or_ask_gpus_otherwise_are_left_alone() {
        let range = Shape { min_nodes: 1, max_nodes: 2, ..Shape::default() };
        let four = Some("gres/gpu:4");
        assert_eq!(gpus_per_job_as_per_node(&range, &ask(four, None)), None);
        assert_eq!(gpus_per_job_as_per_node(&Shape::default(), &ask(four, None)), None);
        assert_eq!(gpus_per_job_as_per_node(&one_node(), &ask(four, four)), None);
        // Even a per-node entry of 0 GPUs names them there.
        assert_eq!(gpus_per_job_as_per_node(&one_node(), &ask(four, Some("gres/gpu:0"))), None);
        assert_eq!(gpus_per_job_as_per_node(&one_node(), &ask(None, four)), None);
        assert_eq!(gpus_per_job_as_per_node(&one_node(), &ask(Some("license/x:1"), None)), None);
        assert_eq!(gpus_per_job_as_per_node(&one_node(), &ask(Some("gres/gpu:0"), None)), None);
        // --gpus=4 --gpus-per-task=1, --gpus-per-socket, --ntasks-per-gpu:
        // Slurm derives tasks from the per-job count.
        let per_task = TresAsk { per_task: Some("gres/gpu:1"), ..ask(four, None) };
        assert_eq!(gpus_per_job_as_per_node(&one_node(), &per_task), None);
        let per_socket = TresAsk { per_socket: Some("gres/gpu:2"), ..ask(four, None) };
        assert_eq!(gpus_per_job_as_per_node(&one_node(), &per_socket), None);
        let tasks_per_gpu = TresAsk { tasks_per_gpu: true, ..ask(four, None) };
        assert_eq!(gpus_per_job_as_per_node(&one_node(), &tasks_per_gpu), None);
    }

    use super::*;

    #[test]
    fn forms() {
        assert_eq!(gpus_in("gres:gpu:4"), (4, None));
        assert_eq!(gpus_in("gres/gpu:4"), (4, None));
        assert_eq!(gpus_in("gres/gpu=2"), (2, None));
        assert_eq!(gpus_in("gres:gpu:a100:2"), (2, Some("a100".into())));
        assert_eq!(gpus_in("gres:gpu"), (1, None));
        assert_eq!(gpus_in("cpu=4,gres:gpu:2,gres:nic:1"), (2, None));
        assert_eq!(gpus_in(""), (0, None));
        assert_eq!(gpus_in("gres:gpu:a100:x"), (0, Some("a100".into())));
    }

    fn shape(min_nodes: u32, max_nodes: u32, tasks: u32) -> Shape {
        Shape { min_nodes, max_nodes, tasks, ..Default::default() }
    }

    #[test]
    fn totals() {
        let r = GpuRequest { per_node: Some(2), ..Default::default() };
        assert_eq!(r.total(&shape(3, 0, 1)), 6);
        let r = GpuRequest { per_job: Some(4), ..Default::default() };
        assert_eq!(r.total(&shape(0, 0, 0)), 4);
        let r = GpuRequest { per_task: Some(1), ..Default::default() };
        assert_eq!(r.total(&shape(1, 0, 8)), 8);
        assert_eq!(GpuRequest::default().total(&shape(4, 4, 4)), 0);
    }

    /// `-N1-4 --gpus-per-node=4` may get 4 nodes: 16 GPUs, not 4.
    #[test]
    fn node_ranges_count_at_their_upper_end() {
        let r = GpuRequest { per_node: Some(4), ..Default::default() };
        assert_eq!(r.total(&shape(1, 4, 0)), 16);
        assert_eq!(r.total(&shape(2, 2, 0)), 8);
    }

    /// `--gpus-per-socket=2 --sockets-per-node=2 -N2`: 8 GPUs.
    #[test]
    fn per_socket_counts_times_sockets_and_nodes() {
        let r = GpuRequest { per_socket: Some(2), ..Default::default() };
        let s = Shape { min_nodes: 2, max_nodes: 2, sockets_per_node: 2, ..Default::default() };
        assert_eq!(r.total(&s), 8);
        assert_eq!(r.total(&shape(1, 0, 0)), 2);
    }

    /// `--ntasks-per-node=4 -N2 --gpus-per-task=1`: 8 tasks, 8 GPUs.
    #[test]
    fn tasks_per_node_count_when_no_task_total_is_given() {
        let r = GpuRequest { per_task: Some(1), ..Default::default() };
        let s = Shape { min_nodes: 2, max_nodes: 2, tasks_per_node: 4, ..Default::default() };
        assert_eq!(r.total(&s), 8);
    }

    #[test]
    fn huge_counts_saturate() {
        let r = GpuRequest { per_node: Some(u64::MAX), per_socket: Some(u64::MAX), ..Default::default() };
        assert_eq!(r.total(&shape(u32::MAX, u32::MAX, u32::MAX)), u64::MAX);
    }
}

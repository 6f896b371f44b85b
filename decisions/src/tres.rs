//! GPU counts from the TRES strings Slurm stores in a job description
//! (`tres_per_job`, `tres_per_node`, `tres_per_task`), e.g. `gres:gpu:4`,
//! `gres:gpu:a100:2`, `gres/gpu=2`, several entries separated by commas.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuRequest {
    pub per_job: Option<u64>,
    pub per_node: Option<u64>,
    pub per_task: Option<u64>,
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
    /// Total GPUs of the job. Per-node and per-task counts are multiplied by
    /// the node and task counts the job asked for (at least 1 each).
    pub fn total(&self, nodes: u32, tasks: u32) -> u64 {
        let nodes = u64::from(nodes.max(1));
        let tasks = u64::from(tasks.max(1));
        [self.per_job, self.per_node.map(|n| n.saturating_mul(nodes)), self.per_task.map(|n| n.saturating_mul(tasks))]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn totals() {
        let r = GpuRequest { per_node: Some(2), ..Default::default() };
        assert_eq!(r.total(3, 1), 6);
        let r = GpuRequest { per_job: Some(4), ..Default::default() };
        assert_eq!(r.total(0, 0), 4);
        let r = GpuRequest { per_task: Some(1), ..Default::default() };
        assert_eq!(r.total(1, 8), 8);
        assert_eq!(GpuRequest::default().total(4, 4), 0);
    }
}

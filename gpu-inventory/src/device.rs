//! What a source reports: GPUs and the processes holding them.

use std::fmt;

/// One GPU and the processes that hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDevice {
    /// N in `/dev/nvidiaN`: how Slurm, cgroups and this crate name the GPU.
    pub minor: u32,
    /// NVML's index (PCI bus order). For display only: it need not equal the
    /// minor number, and CUDA's own numbering differs again.
    pub nvml_index: Option<u32>,
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    /// Sorted by pid, one entry per pid.
    pub processes: Vec<GpuProcess>,
}

/// A process with a context on a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuProcess {
    /// In the PID namespace of the host the source reads (NVML reports the
    /// driver's view, which is the host's).
    pub pid: u32,
    /// `None` where the driver does not say (e.g. without permission).
    pub used_memory_bytes: Option<u64>,
    pub kind: ProcessKind,
}

/// Which kind of context a process holds on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessKind {
    /// CUDA (or other compute) context.
    Compute,
    /// OpenGL/Vulkan context.
    Graphics,
    /// Listed by the driver as both.
    ComputeAndGraphics,
}

impl ProcessKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessKind::Compute => "compute",
            ProcessKind::Graphics => "graphics",
            ProcessKind::ComputeAndGraphics => "compute+graphics",
        }
    }

    /// The kind of a process found in both of the driver's lists.
    pub fn combined(self, other: ProcessKind) -> ProcessKind {
        if self == other {
            self
        } else {
            ProcessKind::ComputeAndGraphics
        }
    }
}

impl fmt::Display for ProcessKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Merges process entries that name the same pid (NVML lists a process once
/// per kind of context it holds): kinds combine, the larger memory figure
/// wins. Returns them sorted by pid.
pub fn merge_by_pid(entries: impl IntoIterator<Item = GpuProcess>) -> Vec<GpuProcess> {
    let mut merged: Vec<GpuProcess> = Vec::new();
    for p in entries {
        match merged.iter_mut().find(|m| m.pid == p.pid) {
            Some(m) => {
                m.kind = m.kind.combined(p.kind);
                m.used_memory_bytes = m.used_memory_bytes.max(p.used_memory_bytes);
            }
            None => merged.push(p),
        }
    }
    merged.sort_by_key(|p| p.pid);
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: u32, mem: Option<u64>, kind: ProcessKind) -> GpuProcess {
        GpuProcess { pid, used_memory_bytes: mem, kind }
    }

    #[test]
    fn a_pid_in_both_lists_is_one_process_with_the_larger_figure() {
        let merged = merge_by_pid([
            p(20, Some(5), ProcessKind::Compute),
            p(10, None, ProcessKind::Compute),
            p(20, Some(9), ProcessKind::Graphics),
            p(10, Some(3), ProcessKind::Graphics),
            p(30, Some(1), ProcessKind::Graphics),
        ]);
        assert_eq!(
            merged,
            vec![
                p(10, Some(3), ProcessKind::ComputeAndGraphics),
                p(20, Some(9), ProcessKind::ComputeAndGraphics),
                p(30, Some(1), ProcessKind::Graphics),
            ]
        );
    }

    #[test]
    fn a_pid_listed_twice_as_compute_stays_compute() {
        let merged = merge_by_pid([p(7, Some(1), ProcessKind::Compute), p(7, Some(2), ProcessKind::Compute)]);
        assert_eq!(merged, vec![p(7, Some(2), ProcessKind::Compute)]);
    }
}

//! Everything that can go wrong asking a source about GPUs.

use std::path::PathBuf;

/// Each message is whole: it carries its cause's text, so the errors have no
/// `source()` that a chain printer would repeat.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The host has no usable NVIDIA driver. Callers checking GPUs skip the
    /// check on such hosts (see [`GpuError::is_no_driver`]).
    #[error(
        "no NVIDIA driver on this host ({detail}); on a GPU node install the NVIDIA driver (it provides \
         libnvidia-ml.so.1 and the nvidia kernel module), on a node without GPUs use the GPU source `none`"
    )]
    NoDriver { detail: String },

    /// The driver answered a query with an error.
    #[error("NVML {what} failed: {detail}")]
    Query { what: String, detail: String },

    /// A fake GPU file has a line this crate cannot read.
    #[error("{}:{line}: {detail}", path.display())]
    FakeFile { path: PathBuf, line: usize, detail: String },

    /// A fake GPU file could not be read at all.
    #[error(
        "cannot read fake GPU file {}: {error}; create it (an empty file means no GPUs) or fix the path \
         after `fake:`",
        path.display()
    )]
    FakeFileUnreadable { path: PathBuf, error: std::io::Error },

    /// `/proc` could not say whether a process is alive.
    #[error("cannot tell whether pid {pid} is alive: reading {}: {error}", path.display())]
    ProcStatus { pid: u32, path: PathBuf, error: std::io::Error },

    /// A GPU source setting (plugstack.conf argument, `--source`) that is
    /// none of the accepted forms.
    #[error("invalid GPU source `{given}`: {problem}; write `nvml`, `fake:/absolute/path/to/file` or `none`")]
    BadSourceSpec { given: String, problem: String },
}

impl GpuError {
    /// Whether the host simply has no NVIDIA driver, as opposed to a driver
    /// or file that is there but failing.
    pub fn is_no_driver(&self) -> bool {
        matches!(self, GpuError::NoDriver { .. })
    }
}

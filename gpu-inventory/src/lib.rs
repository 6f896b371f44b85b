//! Which processes hold which GPU, named by the GPU's device minor number
//! (`/dev/nvidiaN`), the one identifier Slurm (gres.conf `File=`), the
//! cgroup device rules and the NVIDIA driver all agree on. NVML's device
//! index is reported for reading only: it follows PCI bus order and need not
//! match the minor numbers.
//!
//! One interface, [`GpuSource`], chosen by a [`SourceSpec`] as written in
//! plugstack.conf (`nvml`, `fake:/path`, or `none` for no source):
//!
//! - [`NvmlSource`]: the NVIDIA driver, through libnvidia-ml.so.1 loaded at
//!   run time, so hosts without the driver run this crate too and get
//!   [`GpuError::NoDriver`];
//! - [`FakeSource`]: a text file, for dev clusters without GPUs.
//!
//! Built for the SPANK plugin's GPU hand-off check, which runs inside
//! short-lived, forking slurmstepd and job-script processes: this crate
//! starts no threads, needs no async runtime and keeps no global state. Open
//! a source where it is used and drop it there; do not carry an open
//! [`NvmlSource`] across `fork()`, since NVML's state is not fork-safe.

// No FFI here: the libc calls it needs are onepool-os's safe functions (issue #27).
#![forbid(unsafe_code)]

pub mod devfile;
pub mod device;
pub mod error;
pub mod fake;
pub mod nvml;
pub mod procfs;
pub mod source;

pub use device::{GpuDevice, GpuProcess, ProcessKind};
pub use error::GpuError;
pub use fake::FakeSource;
pub use nvml::NvmlSource;
pub use source::{open, GpuSource, SourceSpec};

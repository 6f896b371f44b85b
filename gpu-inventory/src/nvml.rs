//! The `nvml` source: the NVIDIA driver, through NVML.
//!
//! libnvidia-ml.so.1 is loaded with `dlopen` when a source is opened, not
//! linked, so binaries using this crate start on hosts without the driver;
//! opening then fails with [`GpuError::NoDriver`]. Every `NvmlError` becomes
//! a [`GpuError`] in this module, naming the NVML call and the device.
//!
//! GPUs are identified by their minor number (`nvmlDeviceGetMinorNumber`),
//! never by their position in NVML's enumeration. A process is listed once
//! per GPU even when the driver reports it as a compute, graphics and MPS
//! client process.

use std::ffi::OsStr;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};

use crate::device::merge_by_pid;
use crate::{GpuDevice, GpuError, GpuProcess, GpuSource, ProcessKind};

/// The driver's NVML library, as installed by every NVIDIA driver package.
pub const LIBRARY: &str = "libnvidia-ml.so.1";

/// How often a process list is asked for again when more processes appeared
/// between NVML's count and its listing.
const LIST_ATTEMPTS: usize = 3;

/// An initialized NVML; shut down (and the library unloaded) on drop.
pub struct NvmlSource {
    nvml: Nvml,
    library: String,
    driver_version: Option<String>,
}

impl NvmlSource {
    /// Loads [`LIBRARY`] and initializes NVML.
    pub fn open() -> Result<NvmlSource, GpuError> {
        NvmlSource::open_library(LIBRARY)
    }

    /// Loads NVML from `library` (a file name searched the way `dlopen`
    /// searches, or a path) and initializes it.
    pub fn open_library(library: impl AsRef<OsStr>) -> Result<NvmlSource, GpuError> {
        let library_name = library.as_ref().to_string_lossy().into_owned();
        let nvml = Nvml::builder().lib_path(library.as_ref()).init().map_err(|e| match e {
            // dlerror's text usually names the library already.
            NvmlError::LibloadingError(e) if e.to_string().contains(&library_name) => {
                GpuError::NoDriver { detail: e.to_string() }
            }
            NvmlError::LibloadingError(e) => GpuError::NoDriver { detail: format!("{library_name}: {e}") },
            NvmlError::DriverNotLoaded => GpuError::NoDriver {
                detail: format!("{library_name} is installed but the nvidia kernel module is not loaded"),
            },
            e => query_error("nvmlInit_v2".to_string(), e),
        })?;
        let driver_version = optional(nvml.sys_driver_version(), || "nvmlSystemGetDriverVersion".to_string())?;
        Ok(NvmlSource { nvml, library: library_name, driver_version })
    }
}

impl GpuSource for NvmlSource {
    fn devices(&mut self) -> Result<Vec<GpuDevice>, GpuError> {
        let count = self.nvml.device_count().map_err(|e| query_error("nvmlDeviceGetCount_v2".to_string(), e))?;
        let mut devices = Vec::with_capacity(count as usize);
        for index in 0..count {
            let device = self
                .nvml
                .device_by_index(index)
                .map_err(|e| query_error(format!("nvmlDeviceGetHandleByIndex_v2 (device index {index})"), e))?;
            devices.push(read_device(index, &device)?);
        }
        devices.sort_by_key(|d| d.minor);
        if let Some(pair) = devices.windows(2).find(|pair| pair[0].minor == pair[1].minor) {
            return Err(GpuError::Query {
                what: "nvmlDeviceGetMinorNumber".to_string(),
                detail: format!(
                    "device indexes {} and {} both report minor number {}, so GPUs cannot be told apart by \
                     /dev/nvidiaN; check the driver installation with `nvidia-smi -q | grep -i minor`",
                    pair[0].nvml_index.unwrap_or_default(),
                    pair[1].nvml_index.unwrap_or_default(),
                    pair[0].minor
                ),
            });
        }
        Ok(devices)
    }

    fn describe(&self) -> String {
        match &self.driver_version {
            Some(version) => format!("nvml ({}, driver {version})", self.library),
            None => format!("nvml ({})", self.library),
        }
    }
}

fn read_device(index: u32, device: &Device<'_>) -> Result<GpuDevice, GpuError> {
    let what = |call: &str| format!("{call} (device index {index})");
    let minor = device.minor_number().map_err(|e| query_error(what("nvmlDeviceGetMinorNumber"), e))?;
    let memory = optional(device.memory_info(), || what("nvmlDeviceGetMemoryInfo_v2"))?;

    let compute = list(|| device.running_compute_processes())
        .map_err(|e| query_error(what("nvmlDeviceGetComputeRunningProcesses_v3"), e))?;
    // A GPU that cannot run graphics or MPS has no such processes; compute
    // processes are what the hand-off check is about, so their list may not
    // be missing.
    let graphics =
        optional(list(|| device.running_graphics_processes()), || what("nvmlDeviceGetGraphicsRunningProcesses_v3"))?
            .unwrap_or_default();
    let mps = optional(list(|| device.mps_running_compute_processes()), || {
        what("nvmlDeviceGetMPSComputeRunningProcesses_v3")
    })?
    .unwrap_or_default();

    let entries = compute
        .into_iter()
        .chain(mps)
        .map(|p| process(p, ProcessKind::Compute))
        .chain(graphics.into_iter().map(|p| process(p, ProcessKind::Graphics)));
    Ok(GpuDevice {
        minor,
        nvml_index: Some(index),
        uuid: optional(device.uuid(), || what("nvmlDeviceGetUUID"))?,
        name: optional(device.name(), || what("nvmlDeviceGetName"))?,
        memory_total_bytes: memory.as_ref().map(|m| m.total),
        memory_used_bytes: memory.as_ref().map(|m| m.used),
        processes: merge_by_pid(entries),
    })
}

fn process(info: ProcessInfo, kind: ProcessKind) -> GpuProcess {
    let used_memory_bytes = match info.used_gpu_memory {
        UsedGpuMemory::Used(bytes) => Some(bytes),
        UsedGpuMemory::Unavailable => None,
    };
    GpuProcess { pid: info.pid, used_memory_bytes, kind }
}

/// NVML counts processes, then lists them into a buffer of that size; a
/// process starting in between makes the listing fail with
/// `InsufficientSize`, and asking again is the remedy.
fn list(mut call: impl FnMut() -> Result<Vec<ProcessInfo>, NvmlError>) -> Result<Vec<ProcessInfo>, NvmlError> {
    let mut attempt = 1;
    loop {
        match call() {
            Err(NvmlError::InsufficientSize(_)) if attempt < LIST_ATTEMPTS => attempt += 1,
            result => return result,
        }
    }
}

/// A value some GPUs or drivers do not provide: `None` when NVML says so,
/// an error for any other failure.
fn optional<T>(result: Result<T, NvmlError>, what: impl FnOnce() -> String) -> Result<Option<T>, GpuError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound) => Ok(None),
        Err(e) => Err(query_error(what(), e)),
    }
}

fn query_error(what: String, error: NvmlError) -> GpuError {
    let hint = match error {
        NvmlError::NoPermission => "; run as root, or give this user access to /dev/nvidia*",
        NvmlError::GpuLost | NvmlError::ResetRequired => {
            "; the GPU needs attention: look for Xid errors in `dmesg`, then reset the GPU or reboot the node"
        }
        NvmlError::LibRmVersionMismatch => {
            "; the driver was upgraded but the old kernel module is still loaded: reboot the node or reload the \
             nvidia modules"
        }
        NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound => {
            "; the installed NVIDIA driver is older than this call needs: upgrade the driver"
        }
        _ => "",
    };
    GpuError::Query { what, detail: format!("{error}{hint}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_library_that_is_not_there_means_no_driver() {
        let err = NvmlSource::open_library("/nonexistent/libnvidia-ml.so.1").err().expect("no such library");
        assert!(err.is_no_driver(), "{err}");
        let message = err.to_string();
        assert!(
            message.starts_with(
                "no NVIDIA driver on this host (/nonexistent/libnvidia-ml.so.1: cannot open shared object file: "
            ),
            "{message}"
        );
        assert!(message.contains("install the NVIDIA driver (it provides libnvidia-ml.so.1"), "{message}");
    }

    /// On a host without the NVIDIA kernel driver (this crate's development
    /// and CI machines) opening NVML must say "no driver", whether the
    /// library is missing or present without the module; on a GPU host it
    /// must list GPUs whose device nodes exist.
    #[test]
    fn this_host_gets_no_driver_unless_it_has_the_nvidia_driver() {
        let kernel_driver = Path::new("/proc/driver/nvidia/version").exists();
        match NvmlSource::open() {
            Err(e) => {
                assert!(e.is_no_driver(), "{e}");
                assert!(e.to_string().contains("libnvidia-ml.so.1"), "{e}");
            }
            Ok(mut source) => {
                assert!(kernel_driver, "NVML opened without /proc/driver/nvidia/version");
                assert!(source.describe().starts_with("nvml (libnvidia-ml.so.1"), "{}", source.describe());
                for d in source.devices().unwrap() {
                    let node = format!("/dev/nvidia{}", d.minor);
                    assert!(Path::new(&node).exists(), "NVML reports minor {} but {node} does not exist", d.minor);
                    assert!(d.nvml_index.is_some() && d.memory_total_bytes.is_some(), "{d:?}");
                }
            }
        }
    }

    #[test]
    fn errors_name_the_call_and_say_what_to_do() {
        let err = query_error("nvmlDeviceGetMinorNumber (device index 2)".to_string(), NvmlError::NoPermission);
        assert_eq!(
            err.to_string(),
            "NVML nvmlDeviceGetMinorNumber (device index 2) failed: the current user does not have permission to \
             perform this operation; run as root, or give this user access to /dev/nvidia*"
        );
        let err = query_error("nvmlDeviceGetCount_v2".to_string(), NvmlError::Unknown);
        assert_eq!(err.to_string(), "NVML nvmlDeviceGetCount_v2 failed: an internal driver error occurred");
    }

    #[test]
    fn unsupported_values_are_absent_and_other_failures_are_errors() {
        assert_eq!(optional::<u32>(Err(NvmlError::NotSupported), || "x".to_string()).unwrap(), None);
        assert_eq!(optional(Ok(5), || "x".to_string()).unwrap(), Some(5));
        let err = optional::<u32>(Err(NvmlError::GpuLost), || "nvmlDeviceGetName (device index 0)".to_string());
        assert!(err
            .unwrap_err()
            .to_string()
            .starts_with("NVML nvmlDeviceGetName (device index 0) failed: device fell"));
    }

    #[test]
    fn a_listing_outrun_by_new_processes_is_asked_again() {
        let mut calls = 0;
        let listed = list(|| {
            calls += 1;
            if calls < 3 {
                Err(NvmlError::InsufficientSize(None))
            } else {
                Ok(vec![])
            }
        });
        assert!(listed.unwrap().is_empty());
        assert_eq!(calls, 3);

        let mut calls = 0;
        let listed = list(|| {
            calls += 1;
            Err(NvmlError::InsufficientSize(None))
        });
        assert!(matches!(listed, Err(NvmlError::InsufficientSize(_))));
        assert_eq!(calls, LIST_ATTEMPTS);
    }

    #[test]
    fn processes_without_a_memory_figure_have_none() {
        let info =
            |used_gpu_memory| ProcessInfo { pid: 9, used_gpu_memory, gpu_instance_id: None, compute_instance_id: None };
        assert_eq!(process(info(UsedGpuMemory::Unavailable), ProcessKind::Graphics).used_memory_bytes, None);
        assert_eq!(process(info(UsedGpuMemory::Used(7)), ProcessKind::Compute).used_memory_bytes, Some(7));
    }
}

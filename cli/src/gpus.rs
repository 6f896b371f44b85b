//! `onepool gpus`: this host's GPUs by device minor number (`/dev/nvidiaN`,
//! the number gres.conf and the GPU hand-off check use), with the processes
//! holding each.

use std::process::ExitCode;

use clap::Args;
use onepool_gpu_inventory::{procfs, GpuDevice, GpuProcess, ProcessKind, SourceSpec};
use serde_json::{json, Value};

/// Exit status when the host has no NVIDIA driver: not a failure of the
/// command, but not a listing either, so scripts can tell it apart.
pub const EXIT_NO_DRIVER: u8 = 3;

pub const EXIT_STATUS_HELP: &str = "Exit status: 0 when the GPUs were listed (none at all is fine), 2 when the \
source failed (an NVML error, an unreadable or malformed fake file), 3 when this host has no NVIDIA driver (stderr \
says what to install).";

#[derive(Args)]
pub struct GpusArgs {
    /// Where to read GPUs from: `nvml` (the NVIDIA driver), `fake:/absolute/path` (a fake GPU file, the test aid
    /// for dev clusters without GPUs) or `none`
    #[arg(long, value_name = "nvml|fake:PATH|none", default_value = "nvml")]
    pub source: SourceSpec,
    /// Print JSON instead of one line per GPU
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &GpusArgs) -> anyhow::Result<ExitCode> {
    let listed = match onepool_gpu_inventory::open(&args.source) {
        Ok(Some(mut source)) => source.devices().map(|devices| Some((source.describe(), devices))),
        Ok(None) => Ok(None),
        Err(e) => Err(e),
    };
    let (source, devices) = match listed {
        Ok(None) if args.json => (args.source.to_string(), Vec::new()),
        Ok(None) => {
            eprintln!("onepool: the GPU source is `none`: there is nothing to list");
            return Ok(ExitCode::SUCCESS);
        }
        Ok(Some(listed)) => listed,
        Err(e) if e.is_no_driver() => {
            eprintln!("onepool: {e}");
            return Ok(ExitCode::from(EXIT_NO_DRIVER));
        }
        Err(e) => return Err(e.into()),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json_listing(&source, &devices, procfs::command_name))?);
    } else if devices.is_empty() {
        eprintln!("onepool: {source} reports no GPUs");
    } else {
        for d in &devices {
            println!("{}", line(d, procfs::command_name));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `minor 0  index 0  name NVIDIA H200  memory 1024/143771 MiB  processes 4242 python (1000 MiB)`; `-` where the
/// source does not know.
fn line(d: &GpuDevice, command: impl Fn(u32) -> Option<String>) -> String {
    let processes = if d.processes.is_empty() {
        "none".to_string()
    } else {
        d.processes.iter().map(|p| process(p, command(p.pid))).collect::<Vec<_>>().join(", ")
    };
    let memory = match (d.memory_used_bytes, d.memory_total_bytes) {
        (None, None) => "-".to_string(),
        (used, total) => format!("{}/{} MiB", mib(used), mib(total)),
    };
    format!(
        "minor {}  index {}  name {}  memory {memory}  processes {processes}",
        d.minor,
        d.nvml_index.map_or("-".to_string(), |i| i.to_string()),
        d.name.as_deref().unwrap_or("-"),
    )
}

/// `4242 python (1000 MiB)`, `4243 Xorg (12 MiB, graphics)`, `4244` when
/// neither the command nor the memory is known.
fn process(p: &GpuProcess, command: Option<String>) -> String {
    let mut text = p.pid.to_string();
    if let Some(command) = command {
        text = format!("{text} {command}");
    }
    let mut details = Vec::new();
    if let Some(bytes) = p.used_memory_bytes {
        details.push(format!("{} MiB", bytes / MIB));
    }
    if p.kind != ProcessKind::Compute {
        details.push(p.kind.to_string());
    }
    if !details.is_empty() {
        text = format!("{text} ({})", details.join(", "));
    }
    text
}

const MIB: u64 = 1024 * 1024;

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("-".to_string(), |b| (b / MIB).to_string())
}

fn json_listing(source: &str, devices: &[GpuDevice], command: impl Fn(u32) -> Option<String>) -> Value {
    let devices: Vec<Value> = devices
        .iter()
        .map(|d| {
            let processes: Vec<Value> = d
                .processes
                .iter()
                .map(|p| {
                    json!({
                        "pid": p.pid,
                        "command": command(p.pid),
                        "kind": p.kind.as_str(),
                        "used_memory_bytes": p.used_memory_bytes,
                    })
                })
                .collect();
            json!({
                "minor": d.minor,
                "nvml_index": d.nvml_index,
                "uuid": d.uuid,
                "name": d.name,
                "memory_used_bytes": d.memory_used_bytes,
                "memory_total_bytes": d.memory_total_bytes,
                "processes": processes,
            })
        })
        .collect();
    json!({"source": source, "devices": devices})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What NVML reports for a GPU node.
    fn h200() -> GpuDevice {
        GpuDevice {
            minor: 4,
            nvml_index: Some(2),
            uuid: Some("GPU-0d3f".to_string()),
            name: Some("NVIDIA H200".to_string()),
            memory_total_bytes: Some(150_754 * MIB + 5),
            memory_used_bytes: Some(1_024 * MIB),
            processes: vec![
                GpuProcess { pid: 4242, used_memory_bytes: Some(1_000 * MIB), kind: ProcessKind::Compute },
                GpuProcess { pid: 4243, used_memory_bytes: Some(12 * MIB), kind: ProcessKind::ComputeAndGraphics },
                GpuProcess { pid: 4244, used_memory_bytes: None, kind: ProcessKind::Compute },
            ],
        }
    }

    fn command(pid: u32) -> Option<String> {
        match pid {
            4242 => Some("python".to_string()),
            4243 => Some("Xorg".to_string()),
            _ => None,
        }
    }

    #[test]
    fn an_nvml_gpu_is_one_line_with_every_field() {
        assert_eq!(
            line(&h200(), command),
            "minor 4  index 2  name NVIDIA H200  memory 1024/150754 MiB  processes 4242 python (1000 MiB), \
             4243 Xorg (12 MiB, compute+graphics), 4244"
        );
    }

    #[test]
    fn unknown_fields_are_dashes_and_no_processes_is_none() {
        let fake = GpuDevice {
            minor: 0,
            nvml_index: None,
            uuid: None,
            name: None,
            memory_total_bytes: None,
            memory_used_bytes: None,
            processes: vec![],
        };
        assert_eq!(line(&fake, command), "minor 0  index -  name -  memory -  processes none");
        let half = GpuDevice { memory_total_bytes: Some(80 * MIB), ..fake };
        assert_eq!(line(&half, command), "minor 0  index -  name -  memory -/80 MiB  processes none");
    }

    #[test]
    fn json_keeps_bytes_and_absent_values_as_null() {
        let v = json_listing("nvml (libnvidia-ml.so.1, driver 550.54.15)", &[h200()], command);
        assert_eq!(v["source"], "nvml (libnvidia-ml.so.1, driver 550.54.15)");
        let d = &v["devices"][0];
        assert_eq!(d["minor"], 4);
        assert_eq!(d["nvml_index"], 2);
        assert_eq!(d["uuid"], "GPU-0d3f");
        assert_eq!(d["memory_total_bytes"], 150_754 * MIB + 5);
        assert_eq!(
            d["processes"][1],
            json!({"pid": 4243, "command": "Xorg", "kind": "compute+graphics", "used_memory_bytes": 12 * MIB})
        );
        assert_eq!(
            d["processes"][2],
            json!({"pid": 4244, "command": null, "kind": "compute", "used_memory_bytes": null})
        );
    }
}

//! The `fake:/path` source: a test aid for dev clusters without GPUs, never
//! for production nodes. A text file stands in for the driver: it says which
//! GPUs exist and which processes hold them, and a test "starts a GPU
//! process" by writing a line with that process's pid.
//!
//! # File format
//!
//! ```text
//! # GPUs 0 to 15 exist (optional; may be repeated, the sets add up)
//! gpus 0-15
//! # <minor> <pid> [<used_mib>]: process <pid> holds /dev/nvidia<minor>
//! 3 41877 2048
//! 3 41902
//! 7 41877 512
//! ```
//!
//! - One entry per line; `#` starts a comment that runs to the end of the
//!   line; blank lines are ignored.
//! - `gpus LIST` declares which device minors exist, so a GPU without
//!   processes is still reported. LIST is comma-separated minors and
//!   inclusive ranges, without spaces: `0-15`, `0,2,4-7`. Minors are 0-253
//!   (254 and 255 are `/dev/nvidia-modeset` and `/dev/nvidiactl`).
//! - `<minor> <pid> [<used_mib>]`: process `<pid>` holds GPU `<minor>`,
//!   using `<used_mib>` MiB of its memory (unknown when left out). A pid
//!   holding several GPUs has a line for each. A pid listed twice on one GPU
//!   counts once, with the larger memory figure, so tests may append lines
//!   (`echo "$minor $!" >> FILE`) without checking what is there.
//! - The GPUs reported are those declared by `gpus` lines plus those named
//!   by process lines. When there is a `gpus` line, a process line naming a
//!   GPU outside it is an error (a typo would otherwise invent a GPU).
//!
//! Only processes that still run (see [`crate::procfs::is_running`]) are
//! reported: that is how this stand-in driver notices that a straggler was
//! killed. Pids are read in the PID namespace of the process reading the
//! file.
//!
//! The file is read afresh at every [`GpuSource::devices`] call. A missing
//! file is an error, not "no GPUs", so that a mistyped path cannot make
//! every check pass; an empty file means no GPUs. Rewrite the file
//! atomically (write another file, then rename it over this one) while jobs
//! may be reading it. Fake GPUs have no NVML index, UUID, name or memory
//! size.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use onepool_decisions::hostlist::{self, RangeError, RangeRules};

use crate::procfs;
use crate::{GpuDevice, GpuError, GpuProcess, GpuSource, ProcessKind};

/// The highest minor a GPU can have: 254 and 255 belong to
/// `/dev/nvidia-modeset` and `/dev/nvidiactl`.
pub const MAX_GPU_MINOR: u32 = 253;

const MIB: u64 = 1024 * 1024;

/// Reads GPUs and their processes from a fake GPU file (format in the
/// module documentation).
#[derive(Clone, Debug)]
pub struct FakeSource {
    path: PathBuf,
}

impl FakeSource {
    pub fn new(path: impl Into<PathBuf>) -> FakeSource {
        FakeSource { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl GpuSource for FakeSource {
    fn devices(&mut self) -> Result<Vec<GpuDevice>, GpuError> {
        let text = std::fs::read_to_string(&self.path)
            .map_err(|error| GpuError::FakeFileUnreadable { path: self.path.clone(), error })?;
        let listed = parse(&self.path, &text)?;
        let mut devices = Vec::with_capacity(listed.len());
        for (minor, processes) in listed {
            let mut running = Vec::with_capacity(processes.len());
            for p in processes {
                if procfs::is_running(p.pid)? {
                    running.push(p);
                }
            }
            devices.push(GpuDevice {
                minor,
                nvml_index: None,
                uuid: None,
                name: None,
                memory_total_bytes: None,
                memory_used_bytes: None,
                processes: running,
            });
        }
        Ok(devices)
    }

    fn describe(&self) -> String {
        format!("fake:{} (test aid: GPUs and processes from a file)", self.path.display())
    }
}

/// Every GPU the file names, by minor, with the processes listed on it
/// (sorted by pid, whether they run or not).
pub fn parse(path: &Path, text: &str) -> Result<BTreeMap<u32, Vec<GpuProcess>>, GpuError> {
    let at = |line: usize, detail: String| GpuError::FakeFile { path: path.to_path_buf(), line, detail };
    // Minor -> line of the `gpus` line that declared it.
    let mut declared: BTreeMap<u32, usize> = BTreeMap::new();
    // Minor -> (pid -> (first line, process)).
    let mut listed: BTreeMap<u32, BTreeMap<u32, (usize, GpuProcess)>> = BTreeMap::new();

    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let content = raw.split('#').next().unwrap_or("");
        let fields: Vec<&str> = content.split_whitespace().collect();
        match fields.as_slice() {
            [] => {}
            ["gpus", list] => {
                for minor in parse_minor_list(list).map_err(|detail| at(line, detail))? {
                    declared.entry(minor).or_insert(line);
                }
            }
            ["gpus", ..] => {
                return Err(at(
                    line,
                    format!(
                        "expected `gpus LIST` with LIST like `0-15` or `0,2,4-7` (no spaces), found `{}`",
                        content.trim()
                    ),
                ))
            }
            [minor, pid, rest @ ..] if rest.len() <= 1 => {
                let minor = parse_minor(minor).map_err(|detail| at(line, detail))?;
                let pid = match pid.parse::<u32>() {
                    Ok(pid) if pid > 0 => pid,
                    _ => return Err(at(line, format!("`{pid}` is not a pid (a whole number above 0)"))),
                };
                let used_memory_bytes = match rest.first() {
                    None => None,
                    Some(mib) => match mib.parse::<u64>().map(|m| m.checked_mul(MIB)) {
                        Ok(Some(bytes)) => Some(bytes),
                        Ok(None) => return Err(at(line, format!("{mib} MiB is more memory than a GPU can have"))),
                        Err(_) => {
                            return Err(at(line, format!("`{mib}` is not a memory size in MiB (a whole number)")))
                        }
                    },
                };
                let (_, process) = listed
                    .entry(minor)
                    .or_default()
                    .entry(pid)
                    .or_insert((line, GpuProcess { pid, used_memory_bytes: None, kind: ProcessKind::Compute }));
                process.used_memory_bytes = process.used_memory_bytes.max(used_memory_bytes);
            }
            _ => {
                return Err(at(
                    line,
                    format!("expected `<minor> <pid> [<used_mib>]` or `gpus LIST`, found `{}`", content.trim()),
                ))
            }
        }
    }

    if let Some(&first_gpus_line) = declared.values().min() {
        for (minor, processes) in &listed {
            if !declared.contains_key(minor) {
                let line = processes.values().map(|(line, _)| *line).min().unwrap_or(0);
                return Err(at(
                    line,
                    format!(
                        "GPU {minor} is not declared by the `gpus` line(s) (first at line {first_gpus_line}); \
                         add it there or fix the minor"
                    ),
                ));
            }
        }
    }

    let mut devices: BTreeMap<u32, Vec<GpuProcess>> = declared.into_keys().map(|minor| (minor, Vec::new())).collect();
    for (minor, processes) in listed {
        devices.insert(minor, processes.into_values().map(|(_, p)| p).collect());
    }
    Ok(devices)
}

fn parse_minor(text: &str) -> Result<u32, String> {
    match text.parse::<u64>() {
        Ok(minor) if minor <= u64::from(MAX_GPU_MINOR) => Ok(minor as u32),
        Ok(minor) => Err(minor_out_of_range(minor)),
        Err(_) => Err(not_a_minor(text)),
    }
}

fn not_a_minor(text: &str) -> String {
    format!("`{text}` is not a GPU minor (a whole number, N in /dev/nvidiaN)")
}

fn minor_out_of_range(minor: u64) -> String {
    format!(
        "GPU minor {minor} is out of range: GPU minors are 0-{MAX_GPU_MINOR} \
         (254 and 255 are /dev/nvidia-modeset and /dev/nvidiactl)"
    )
}

/// `0-15`, `0,2,4-7`: onepool's range list parser, with this file's words.
fn parse_minor_list(list: &str) -> Result<Vec<u32>, String> {
    const RULES: RangeRules = RangeRules { max: MAX_GPU_MINOR as u64, max_len: u64::MAX, lenient: false };
    let ranges = hostlist::ranges(list, RULES).map_err(|e| match e {
        RangeError::Empty { .. } => format!("empty item in `{list}`: write minors and ranges like `0,2,4-7`"),
        RangeError::NotANumber { text, .. } => not_a_minor(&text),
        RangeError::TooLarge { value, .. } => minor_out_of_range(value),
        RangeError::Backwards { item } => format!("range `{item}` runs backwards: write the lower minor first"),
        // No limit on a range's length: the largest minor bounds it.
        e @ RangeError::TooLong { .. } => e.to_string(),
    })?;
    // Every number is at most MAX_GPU_MINOR (RULES.max).
    Ok(ranges.iter().flat_map(|r| r.numbers()).map(|n| n as u32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command, Stdio};

    fn p(pid: u32, mib: Option<u64>) -> GpuProcess {
        GpuProcess { pid, used_memory_bytes: mib.map(|m| m * MIB), kind: ProcessKind::Compute }
    }

    fn parsed(text: &str) -> Vec<(u32, Vec<GpuProcess>)> {
        parse(Path::new("/etc/gpus.txt"), text).unwrap().into_iter().collect()
    }

    fn error(text: &str) -> String {
        parse(Path::new("/etc/gpus.txt"), text).unwrap_err().to_string()
    }

    #[test]
    fn gpus_come_from_the_gpus_line_and_the_process_lines() {
        let text = "# a comment\n\ngpus 0-2,5\n1 300 2048 # trailing comment\n1 200\n5 300 512\n";
        assert_eq!(
            parsed(text),
            vec![(0, vec![]), (1, vec![p(200, None), p(300, Some(2048))]), (2, vec![]), (5, vec![p(300, Some(512))]),]
        );
    }

    #[test]
    fn without_a_gpus_line_the_process_lines_name_the_gpus() {
        assert_eq!(parsed("7 10\n3 11 1\n"), vec![(3, vec![p(11, Some(1))]), (7, vec![p(10, None)])]);
        assert_eq!(parsed(""), vec![]);
        assert_eq!(parsed("   # only a comment\n\t\n"), vec![]);
    }

    #[test]
    fn gpus_lines_add_up() {
        let minors: Vec<u32> = parsed("gpus 0-1\ngpus 1,4\n").into_iter().map(|(m, _)| m).collect();
        assert_eq!(minors, vec![0, 1, 4]);
    }

    #[test]
    fn a_malformed_line_names_its_file_line_and_the_expected_form() {
        assert_eq!(
            error("gpus 0-3\n\n1\n"),
            "/etc/gpus.txt:3: expected `<minor> <pid> [<used_mib>]` or `gpus LIST`, found `1`"
        );
        assert_eq!(
            error("1 2 3 4 # too many\n"),
            "/etc/gpus.txt:1: expected `<minor> <pid> [<used_mib>]` or `gpus LIST`, found `1 2 3 4`"
        );
        assert_eq!(
            error("4294967296 2\n"),
            "/etc/gpus.txt:1: GPU minor 4294967296 is out of range: GPU minors are 0-253 \
             (254 and 255 are /dev/nvidia-modeset and /dev/nvidiactl)"
        );
        assert_eq!(error("x 2\n"), "/etc/gpus.txt:1: `x` is not a GPU minor (a whole number, N in /dev/nvidiaN)");
        assert_eq!(error("0 0\n"), "/etc/gpus.txt:1: `0` is not a pid (a whole number above 0)");
        assert_eq!(error("0 -5\n"), "/etc/gpus.txt:1: `-5` is not a pid (a whole number above 0)");
        assert_eq!(error("0 5 1.5\n"), "/etc/gpus.txt:1: `1.5` is not a memory size in MiB (a whole number)");
        assert_eq!(
            error("0 5 99999999999999999\n"),
            "/etc/gpus.txt:1: 99999999999999999 MiB is more memory than a GPU can have"
        );
        assert_eq!(
            error("254 5\n"),
            "/etc/gpus.txt:1: GPU minor 254 is out of range: GPU minors are 0-253 \
             (254 and 255 are /dev/nvidia-modeset and /dev/nvidiactl)"
        );
    }

    #[test]
    fn a_malformed_gpus_line_says_how_to_write_it() {
        assert_eq!(
            error("gpus 0 - 3\n"),
            "/etc/gpus.txt:1: expected `gpus LIST` with LIST like `0-15` or `0,2,4-7` (no spaces), found `gpus 0 - 3`"
        );
        assert_eq!(
            error("gpus\n"),
            "/etc/gpus.txt:1: expected `gpus LIST` with LIST like `0-15` or `0,2,4-7` (no spaces), found `gpus`"
        );
        assert_eq!(
            error("gpus 0,,3\n"),
            "/etc/gpus.txt:1: empty item in `0,,3`: write minors and ranges like `0,2,4-7`"
        );
        assert_eq!(error("gpus 5-2\n"), "/etc/gpus.txt:1: range `5-2` runs backwards: write the lower minor first");
        assert_eq!(error("gpus 0-a\n"), "/etc/gpus.txt:1: `a` is not a GPU minor (a whole number, N in /dev/nvidiaN)");
        assert_eq!(error("gpus 0-\n"), "/etc/gpus.txt:1: `` is not a GPU minor (a whole number, N in /dev/nvidiaN)");
        assert_eq!(error("gpus 1,\n"), "/etc/gpus.txt:1: empty item in `1,`: write minors and ranges like `0,2,4-7`");
        // Out of range before backwards, as each end is read first.
        assert_eq!(
            error("gpus 300-2\n"),
            "/etc/gpus.txt:1: GPU minor 300 is out of range: GPU minors are 0-253 \
             (254 and 255 are /dev/nvidia-modeset and /dev/nvidiactl)"
        );
        // Above u32 too: out of range, not "not a GPU minor".
        assert_eq!(
            error("gpus 4294967296\n"),
            "/etc/gpus.txt:1: GPU minor 4294967296 is out of range: GPU minors are 0-253 \
             (254 and 255 are /dev/nvidia-modeset and /dev/nvidiactl)"
        );
        assert_eq!(
            error("gpus 0-300\n"),
            "/etc/gpus.txt:1: GPU minor 300 is out of range: GPU minors are 0-253 \
             (254 and 255 are /dev/nvidia-modeset and /dev/nvidiactl)"
        );
    }

    #[test]
    fn a_pid_twice_on_one_gpu_counts_once_with_the_larger_figure() {
        assert_eq!(parsed("0 5\n1 5\n0 5 10\n0 5 4\n0 5\n"), vec![(0, vec![p(5, Some(10))]), (1, vec![p(5, None)])]);
    }

    #[test]
    fn a_process_on_an_undeclared_gpu_is_an_error_at_its_line() {
        assert_eq!(
            error("0 5\n\ngpus 0-3\n9 6\n"),
            "/etc/gpus.txt:4: GPU 9 is not declared by the `gpus` line(s) (first at line 3); add it there or fix the minor"
        );
    }

    fn sleeper() -> Child {
        Command::new("sleep").arg("60").stdin(Stdio::null()).spawn().unwrap()
    }

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("onepool-gpu-{}-{name}", std::process::id()))
    }

    #[test]
    fn only_running_processes_are_reported_so_a_killed_straggler_disappears() {
        let mut straggler = sleeper();
        let mut bystander = sleeper();
        let path = scratch("live.txt");
        std::fs::write(
            &path,
            format!("gpus 0-1\n1 {} 100\n1 {}\n0 {}\n", straggler.id(), bystander.id(), bystander.id()),
        )
        .unwrap();
        let mut source = FakeSource::new(&path);
        let pids = |source: &mut FakeSource| -> Vec<(u32, Vec<u32>)> {
            let devices = source.devices().unwrap();
            devices.into_iter().map(|d| (d.minor, d.processes.iter().map(|p| p.pid).collect())).collect()
        };
        let mut both = vec![straggler.id(), bystander.id()];
        both.sort();
        assert_eq!(pids(&mut source), vec![(0, vec![bystander.id()]), (1, both)]);

        straggler.kill().unwrap();
        straggler.wait().unwrap();
        assert_eq!(pids(&mut source), vec![(0, vec![bystander.id()]), (1, vec![bystander.id()])]);

        bystander.kill().unwrap();
        bystander.wait().unwrap();
        let devices = source.devices().unwrap();
        assert_eq!(devices.iter().map(|d| (d.minor, d.processes.len())).collect::<Vec<_>>(), vec![(0, 0), (1, 0)]);
        assert!(devices.iter().all(|d| d.nvml_index.is_none() && d.name.is_none() && d.memory_total_bytes.is_none()));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_missing_file_is_an_error_that_says_how_to_fix_it() {
        let path = scratch("absent.txt");
        let err = FakeSource::new(&path).devices().unwrap_err();
        assert!(!err.is_no_driver());
        assert_eq!(
            err.to_string(),
            format!(
                "cannot read fake GPU file {}: No such file or directory (os error 2); create it (an empty file \
                 means no GPUs) or fix the path after `fake:`",
                path.display()
            )
        );
    }

    #[test]
    fn a_malformed_file_fails_the_source_with_its_line() {
        let path = scratch("bad.txt");
        std::fs::write(&path, "gpus 0-3\n0 abc\n").unwrap();
        let err = FakeSource::new(&path).devices().unwrap_err();
        assert_eq!(err.to_string(), format!("{}:2: `abc` is not a pid (a whole number above 0)", path.display()));
        assert!(FakeSource::new(&path).describe().starts_with(&format!("fake:{} ", path.display())));
        std::fs::remove_file(&path).unwrap();
    }
}

//! `onepool gpus` as an admin runs it: the built binary, its output and its
//! exit status, against a fake GPU file (and NVML where this host has, or
//! lacks, the driver).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

fn onepool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_onepool")).args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn fake_file(name: &str, content: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, content).unwrap();
    path
}

fn sleeper() -> Child {
    Command::new("sleep").arg("60").stdin(Stdio::null()).spawn().unwrap()
}

/// A pid that is certainly not running: a child that has exited and been
/// reaped.
fn gone_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    child.id()
}

#[test]
fn a_fake_file_lists_each_gpu_by_minor_with_its_running_processes() {
    let mut job = sleeper();
    let file = fake_file("gpus-listing.txt", &format!("# test GPUs\ngpus 0-2\n1 {} 512\n2 {}\n", job.id(), gone_pid()));
    let source = format!("fake:{}", file.display());
    let out = onepool(&["gpus", "--source", &source]);
    job.kill().unwrap();
    job.wait().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        text(&out.stdout),
        format!(
            "minor 0  index -  name -  memory -  processes none\n\
             minor 1  index -  name -  memory -  processes {} sleep (512 MiB)\n\
             minor 2  index -  name -  memory -  processes none\n",
            job.id()
        )
    );
    assert_eq!(text(&out.stderr), "");
}

#[test]
fn json_gives_the_same_listing_as_data() {
    let mut job = sleeper();
    let file = fake_file("gpus-json.txt", &format!("3 {} 100\n", job.id()));
    let source = format!("fake:{}", file.display());
    let out = onepool(&["gpus", "--source", &source, "--json"]);
    job.kill().unwrap();
    job.wait().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "source": format!("{source} (test aid: GPUs and processes from a file)"),
            "devices": [{
                "minor": 3,
                "nvml_index": null,
                "uuid": null,
                "name": null,
                "memory_used_bytes": null,
                "memory_total_bytes": null,
                "processes": [{"pid": job.id(), "command": "sleep", "kind": "compute", "used_memory_bytes": 100 << 20}],
            }],
        })
    );
}

#[test]
fn a_malformed_fake_file_fails_with_its_line() {
    let file = fake_file("gpus-bad.txt", "gpus 0-3\n\n1 twelve\n");
    let out = onepool(&["gpus", "--source", &format!("fake:{}", file.display())]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(
        text(&out.stderr),
        format!("onepool: {}:3: `twelve` is not a pid (a whole number above 0)\n", file.display())
    );
    assert_eq!(text(&out.stdout), "");
}

#[test]
fn an_empty_fake_file_lists_nothing_and_says_so() {
    let file = fake_file("gpus-empty.txt", "");
    let source = format!("fake:{}", file.display());
    let out = onepool(&["gpus", "--source", &source]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "");
    assert_eq!(
        text(&out.stderr),
        format!("onepool: {source} (test aid: GPUs and processes from a file) reports no GPUs\n")
    );
}

#[test]
fn a_bad_source_lists_the_accepted_forms() {
    let out = onepool(&["gpus", "--source", "fake:relative.txt"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        text(&out.stderr).contains(
            "invalid GPU source `fake:relative.txt`: the fake GPU file's path must be absolute (start with /); \
             write `nvml`, `fake:/absolute/path/to/file` or `none`"
        ),
        "{out:?}"
    );
}

/// Without the NVIDIA driver (this project's dev and CI machines) the
/// command exits 3 with one line saying what to install; with it, it lists.
#[test]
fn nvml_without_a_driver_exits_3_with_what_to_install() {
    let out = onepool(&["gpus"]);
    if Path::new("/proc/driver/nvidia/version").exists() && out.status.code() == Some(0) {
        assert!(text(&out.stdout).lines().all(|l| l.starts_with("minor ")), "{out:?}");
        return;
    }
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(stderr.starts_with("onepool: no NVIDIA driver on this host ("), "{stderr}");
    assert!(stderr.contains("install the NVIDIA driver (it provides libnvidia-ml.so.1"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert_eq!(text(&out.stdout), "");
}

#[test]
fn the_none_source_lists_nothing() {
    let out = onepool(&["gpus", "--source", "none"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "");
    assert_eq!(text(&out.stderr), "onepool: the GPU source is `none`: there is nothing to list\n");
    let out = onepool(&["gpus", "--source", "none", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, serde_json::json!({"source": "none", "devices": []}));
}

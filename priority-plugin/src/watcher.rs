//! Policy reload without restarting slurmctld. In 22.05 `scontrol
//! reconfigure` does not re-run a job_submit plugin's `init` unless the
//! plugin list changed, so a thread of ours watches the file (size, mtime,
//! inode) and swaps in a new policy only when it parses cleanly; a broken
//! edit keeps the last good policy and says why in slurmctld.log. The same
//! thread refreshes the user/group snapshot.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use slurm_sys::log;

use crate::active::{self, Active};
use crate::nss::Snapshot;
use crate::PLUGIN;

const POLL: Duration = Duration::from_secs(2);
const DIRECTORY_REFRESH: Duration = Duration::from_secs(300);

static STOP: AtomicBool = AtomicBool::new(false);
static THREAD: Mutex<Option<JoinHandle<()>>> = Mutex::new(None);

type Stamp = Option<(u64, i64, i64, u64)>;

fn stamp(path: &Path) -> Stamp {
    std::fs::metadata(path).ok().map(|m| (m.len(), m.mtime(), m.mtime_nsec(), m.ino()))
}

pub fn start(path: PathBuf) {
    STOP.store(false, Ordering::SeqCst);
    let handle = std::thread::Builder::new().name("onepool-policy".into()).spawn(move || {
        // A panic here must not take slurmctld down: catch, log, stop watching.
        slurm_sys::guard::guard(PLUGIN, "policy watcher", (), || run(path));
    });
    match handle {
        Ok(h) => *THREAD.lock().unwrap_or_else(|p| p.into_inner()) = Some(h),
        Err(e) => log::error(&format!(
            "{PLUGIN}: cannot start the policy watcher ({e}); policy edits need a slurmctld restart"
        )),
    }
}

pub fn stop() {
    STOP.store(true, Ordering::SeqCst);
    if let Some(h) = THREAD.lock().unwrap_or_else(|p| p.into_inner()).take() {
        let _ = h.join();
    }
}

fn run(path: PathBuf) {
    let mut seen = stamp(&path);
    let mut last_directory = Instant::now();
    while !STOP.load(Ordering::SeqCst) {
        let t0 = Instant::now();
        while t0.elapsed() < POLL && !STOP.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let now = stamp(&path);
        if now != seen {
            seen = now;
            reload(&path);
            last_directory = Instant::now();
        } else if last_directory.elapsed() >= DIRECTORY_REFRESH {
            if let Some(cur) = active::get() {
                let directory = Snapshot::resolve(&cur.policy);
                active::set(Some(Active { policy: cur.policy.clone(), directory }));
            }
            last_directory = Instant::now();
        }
    }
}

fn reload(path: &Path) {
    match active::load_and_install(path) {
        Ok(summary) => log::info(&format!("{PLUGIN}: reloaded policy {} ({summary})", path.display())),
        Err(()) => log::error(&format!("{PLUGIN}: keeping the previous policy: {} has errors", path.display())),
    }
}

//! A log of JSON lines that never holds up its writer: lines go through a
//! bounded channel to a thread of their own, and a line that finds the
//! channel full is dropped and counted rather than waited for. The file is
//! bounded too: past `max_file_bytes` it is renamed `FILE.1` (older ones
//! shift up to `FILE.<keep_files>`, the oldest goes) and a new one begun.
//! onepoold's access log and its decision log are two of these.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;

/// Lines waiting for the writer; more are dropped (and counted).
const QUEUE: usize = 16 * 1024;
/// How often a quiet log is flushed.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineLogSettings {
    pub path: PathBuf,
    /// A file grows to about this size before it is rotated.
    pub max_file_bytes: u64,
    /// Rotated files kept (`FILE.1` .. `FILE.<keep_files>`).
    pub keep_files: u32,
}

pub struct LineLog {
    tx: SyncSender<String>,
    dropped: Counter,
}

impl LineLog {
    /// Opens (or creates, mode 0640) the file, so that a path onepoold
    /// cannot write fails its start, and starts the writer thread.
    pub fn start(what: &'static str, settings: LineLogSettings, dropped: Counter) -> std::io::Result<Arc<LineLog>> {
        let file = open(&settings.path)?;
        let (tx, rx) = sync_channel(QUEUE);
        std::thread::Builder::new()
            .name(what.replace(' ', "-"))
            .spawn(move || write_lines(rx, file, &settings, what))?;
        Ok(Arc::new(LineLog { tx, dropped }))
    }

    /// Queues one line; never waits (a full queue drops it, counted).
    pub fn send(&self, line: String) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(line) {
            self.dropped.inc();
        }
    }
}

fn open(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).mode(0o640).open(path)
}

/// The writer thread: appends, rotates past the size, flushes when quiet;
/// ends when every sender is gone (the daemon stopped).
fn write_lines(rx: Receiver<String>, file: File, s: &LineLogSettings, what: &str) {
    let mut size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut out = BufWriter::new(file);
    let mut failing = false;
    loop {
        let line = match rx.recv_timeout(FLUSH_EVERY) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => {
                let _ = out.flush();
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = out.flush();
                return;
            }
        };
        if size > 0 && size + line.len() as u64 + 1 > s.max_file_bytes {
            let _ = out.flush();
            match rotate(s).and_then(|()| open(&s.path)) {
                Ok(f) => {
                    out = BufWriter::new(f);
                    size = 0;
                }
                Err(e) => tracing::warn!(path = %s.path.display(), "{what} rotation failed: {e}"),
            }
        }
        match out.write_all(line.as_bytes()).and_then(|()| out.write_all(b"\n")) {
            Ok(()) => {
                size += line.len() as u64 + 1;
                failing = false;
            }
            // Said once per run of failures, not once per request.
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(path = %s.path.display(), "{what} write failed: {e}");
            }
            Err(_) => {}
        }
    }
}

impl LineLogSettings {
    /// The `k`th rotated file, `FILE.k` (`FILE.1` the newest).
    pub fn rotated(&self, k: u32) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(format!(".{k}"));
        PathBuf::from(p)
    }

    /// Every file the log may be in, oldest first (the rotated ones, then
    /// `FILE`): what a reader of the whole log goes through.
    pub fn files_oldest_first(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = (1..=self.keep_files.max(1)).rev().map(|k| self.rotated(k)).collect();
        files.push(self.path.clone());
        files
    }
}

/// FILE.(k) -> FILE.(k+1) from the oldest kept, then FILE -> FILE.1.
fn rotate(s: &LineLogSettings) -> std::io::Result<()> {
    let keep = s.keep_files.max(1);
    let _ = std::fs::remove_file(s.rotated(keep));
    for k in (1..keep).rev() {
        match std::fs::rename(s.rotated(k), s.rotated(k + 1)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    std::fs::rename(&s.path, s.rotated(1))
}

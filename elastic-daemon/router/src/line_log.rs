//! A log of JSON lines that never holds up its writer: lines go through a
//! bounded channel to a thread of their own, and a line that finds the
//! channel full is dropped and counted rather than waited for. The file is
//! bounded too: before a line would take it past `max_file_bytes` it is
//! renamed `FILE.1` (older ones shift up to `FILE.<keep_files>`, the oldest
//! goes) and a new one begun, so no file is ever larger; a line that could
//! not be written within that bound (longer than `max_file_bytes` by
//! itself, or while the file cannot be rotated) is dropped and counted as
//! well. onepoold's access log and its decision log are two of these.

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
    /// The largest a file grows: it is rotated before a line would take it
    /// past this size.
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
        let writer_drops = dropped.clone();
        std::thread::Builder::new()
            .name(what.replace(' ', "-"))
            .spawn(move || write_lines(rx, file, &settings, what, &writer_drops))?;
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

/// The writer thread: appends, rotates before a line would pass the size,
/// flushes when quiet; ends when every sender is gone (the daemon stopped).
/// A line it cannot write within the size is dropped and counted in
/// `dropped`.
fn write_lines(rx: Receiver<String>, file: File, s: &LineLogSettings, what: &str, dropped: &Counter) {
    let mut size = file.metadata().map(|m| m.len()).unwrap_or(0);
    // `None` after a rotation that failed, or whose new file could not be
    // made: the next line opens the path again.
    let mut out = Some(BufWriter::new(file));
    let mut failing = false;
    // Said once per run of failures, not once per request.
    let failed = |failing: &mut bool, doing: &str, e: std::io::Error| {
        if !std::mem::replace(failing, true) {
            tracing::warn!(path = %s.path.display(), "{what} {doing} failed: {e}");
        }
    };
    loop {
        let line = match rx.recv_timeout(FLUSH_EVERY) {
            Ok(l) => l,
            Err(e) => {
                if let Some(o) = out.as_mut() {
                    let _ = o.flush();
                }
                match e {
                    RecvTimeoutError::Timeout => continue,
                    RecvTimeoutError::Disconnected => return,
                }
            }
        };
        let len = line.len() as u64 + 1;
        if len > s.max_file_bytes {
            dropped.inc();
            tracing::warn!(path = %s.path.display(), "{what}: a line of {len} bytes dropped (max_file_bytes {})", s.max_file_bytes);
            continue;
        }
        if out.is_none() {
            match open(&s.path) {
                Ok(f) => {
                    size = f.metadata().map(|m| m.len()).unwrap_or(0);
                    out = Some(BufWriter::new(f));
                }
                Err(e) => {
                    failed(&mut failing, "open", e);
                    dropped.inc();
                    continue;
                }
            }
        }
        if size > 0 && size + len > s.max_file_bytes {
            if let Some(mut o) = out.take() {
                let _ = o.flush();
            }
            if let Err(e) = rotate(s) {
                // The next line opens the full file again and retries.
                failed(&mut failing, "rotation", e);
                dropped.inc();
                continue;
            }
            match open(&s.path) {
                Ok(f) => {
                    out = Some(BufWriter::new(f));
                    size = 0;
                }
                Err(e) => {
                    // The next line tries again, without another rotation.
                    failed(&mut failing, "open", e);
                    dropped.inc();
                    continue;
                }
            }
        }
        let Some(o) = out.as_mut() else { continue };
        match o.write_all(line.as_bytes()).and_then(|()| o.write_all(b"\n")) {
            Ok(()) => {
                size += len;
                failing = false;
            }
            Err(e) => failed(&mut failing, "write", e),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A line that would take the file past its size goes to a new file;
    /// one longer than the size by itself is dropped, and counted.
    #[test]
    fn no_file_passes_its_size_and_a_line_no_file_could_hold_is_counted() {
        let d = std::env::temp_dir().join(format!("onepool-line-log-bound-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let s = LineLogSettings { path: d.join("log.jsonl"), max_file_bytes: 1000, keep_files: 10 };
        let dropped = Counter::default();
        let log = LineLog::start("test log", s.clone(), dropped.clone()).unwrap();
        // 601 and 400 bytes with their newlines: one file each, as 1001
        // would pass the size; 1000 exactly fills one.
        let lines = ["a".repeat(600), "b".repeat(399), "c".repeat(2000), "d".repeat(999), "e".repeat(10)];
        for l in &lines {
            log.send(l.clone());
        }
        drop(log);
        let wait = Instant::now();
        while !std::fs::read_to_string(&s.path).unwrap_or_default().starts_with('e') {
            assert!(wait.elapsed() < Duration::from_secs(10), "the last line never came");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut kept = Vec::new();
        for p in s.files_oldest_first().iter().filter(|p| p.exists()) {
            let text = std::fs::read_to_string(p).unwrap();
            assert!(text.len() as u64 <= s.max_file_bytes, "{}: {} bytes", p.display(), text.len());
            kept.extend(text.lines().map(|l| l.len()));
        }
        assert_eq!(kept, [600, 399, 999, 10], "every line but the one no file could hold, in order");
        assert_eq!(dropped.get(), 1);
        let _ = std::fs::remove_dir_all(&d);
    }
}

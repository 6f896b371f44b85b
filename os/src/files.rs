//! Files with more to them than std offers: an advisory lock held for as
//! long as a value lives, and character device nodes (the test clusters'
//! stand-in GPUs).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// An exclusive `flock` on a file, released when dropped (and by the
/// kernel if the process dies first).
#[derive(Debug)]
pub struct Locked(File);

impl Locked {
    /// Waits for the lock on `file`.
    pub fn exclusive(file: File) -> io::Result<Locked> {
        // SAFETY: flock on a descriptor `file` owns and keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Locked(file))
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        // SAFETY: flock on the descriptor this value owns and keeps open.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// `mknod(path, S_IFCHR | mode, makedev(major, minor))`: a character
/// device node (needs root; the mode goes through the umask).
pub fn make_char_device(path: &Path, mode: u32, major: u32, minor: u32) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a NUL-terminated path that lives across the call.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | (mode & 0o7777), libc::makedev(major, minor)) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_waits_for_the_first() {
        let path = std::env::temp_dir().join(format!("onepool-os-lock-{}", std::process::id()));
        let open = || std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).unwrap();
        let first = Locked::exclusive(open()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let second = {
            let f = open();
            std::thread::spawn(move || {
                let l = Locked::exclusive(f).unwrap();
                tx.send(()).unwrap();
                l
            })
        };
        assert!(rx.recv_timeout(std::time::Duration::from_millis(200)).is_err(), "the lock is held");
        drop(first);
        rx.recv_timeout(std::time::Duration::from_secs(5)).expect("taken once released");
        drop(second.join().unwrap());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_path_with_a_nul_is_refused() {
        let e = make_char_device(Path::new("a\0b"), 0o600, 195, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
